#!/usr/bin/env bash
# Every GPU check in one call, for a machine with a CUDA GPU (run there from the repo
# root, after benchmarks/gpu_wheels.sh has filled .whl/ here and .whl is carried):
#   tests marked gpu, then the advisor, cost model and overhead benchmarks.
# Results go to $OUT (default ./gpu-results); each step has its own time limit so the
# whole script ends within about nine minutes.
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 PLACER_REAL_GPU=1 PLACER_CACHE_DIR=/tmp/placer-cache
{ nvidia-smi -L; python3 -c "import torch, numba, numpy; print('torch', torch.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)"; } > "$OUT/machine.txt" 2>&1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/ > "$OUT/gpu-tests.txt" 2>&1
echo "gpu tests exit $?" >> "$OUT/gpu-tests.txt"
timeout 330 python3 benchmarks/advisor.py --out "$OUT/advisor-h200.txt" --time-limit-s 280 > "$OUT/advisor-log.txt" 2>&1
timeout 60 python3 benchmarks/overhead.py --out "$OUT/overhead-h200.txt" > /dev/null 2>&1
timeout 100 python3 benchmarks/costmodel.py --budget-s 8 > "$OUT/costmodel-h200.txt" 2>&1
tail -3 "$OUT/gpu-tests.txt" "$OUT/advisor-h200.txt" 2>/dev/null
