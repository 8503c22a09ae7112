#!/usr/bin/env bash
# Every GPU check in one call, for a machine with a CUDA GPU (run there from the repo
# root, after benchmarks/gpu_wheels.sh has filled .whl/ here and .whl is carried):
#   tests marked gpu, `placer describe` of the machine, the stream, advisor, cost model
#   and overhead benchmarks, and training steps per precision (fp32, tf32, bf16) against
#   placer's H200 predictions.
# Results go to $OUT (default ./gpu-results); each step has its own time limit so the
# whole script ends within about nine minutes (one device command may run ten).
# Parts: `gpu_check.sh tests` (machine, gpu tests, describe: about three minutes),
# `gpu_check.sh bench` (the benchmarks: about seven), no argument: both. Running the
# parts as two calls shows a broken install or test before the benchmarks spend time.
set -u
PART=${1:-all}
case "$PART" in all|tests|bench) ;; *) echo "usage: $0 [all|tests|bench]" >&2; exit 2;; esac
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
# everything goes to $RES, packed into one archive in $OUT at the end, so that copying the
# results off the GPU machine is one file (the test summary and the machine also stay
# readable on their own)
RES=$(mktemp -d)
finish() { tar -czf "$OUT/gpu-results-$PART.tgz" -C "$RES" . ; cp "$RES/machine.txt" "$RES/gpu-tests.txt" "$OUT/" 2>/dev/null; }
trap finish EXIT
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 PLACER_REAL_GPU=1 PLACER_CACHE_DIR=/tmp/placer-cache
{ nvidia-smi -L; python3 -c "import torch, numba, numpy; print('torch', torch.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)"; } > "$RES/machine.txt" 2>&1
if [ "$PART" != bench ]; then
  timeout 130 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/ > "$RES/gpu-tests.txt" 2>&1
  echo "gpu tests exit $?" >> "$RES/gpu-tests.txt"
  timeout 40 python3 -m placer describe -o "$RES/describe-h200.json" --budget-s 30 > "$RES/describe-log.txt" 2>&1
  cp "$RES/describe-h200.json" "$RES/describe-log.txt" "$OUT/" 2>/dev/null
fi
[ "$PART" = tests ] && { tail -3 "$RES/gpu-tests.txt"; exit 0; }
timeout 130 python3 benchmarks/stream.py --cases "stream_images (numpy),stream_inference" --time-limit-s 105 \
  --machine h200 --out "$RES/stream-h200" > "$RES/stream-log.txt" 2>&1
timeout 120 python3 benchmarks/advisor.py --out "$RES/advisor-h200.txt" --time-limit-s 100 > "$RES/advisor-log.txt" 2>&1
timeout 30 python3 benchmarks/overhead.py --out "$RES/overhead-h200.txt" > /dev/null 2>&1
timeout 45 python3 benchmarks/costmodel.py --budget-s 5 --pipelines tabular,mnist_mlp,requests > "$RES/costmodel-h200.txt" 2>&1
timeout 70 python3 benchmarks/precision_gpu.py --out "$RES/precision-gpu" --time-limit-s 45 > "$RES/precision-log.txt" 2>&1
tail -3 "$RES/gpu-tests.txt" "$RES/advisor-h200.txt" 2>/dev/null
