#!/usr/bin/env bash
# Download, here, the wheels the GPU machine lacks (its image has torch, numba,
# numba-cuda, networkx, typer, rich, matplotlib, jinja2, pytest, hypothesis, psutil,
# cloudpickle, toolz, msgpack, pyyaml, ... but no dask, distributed or pydantic, and a
# numpy too new for numba-cuda). They go to .whl/ (ignored by git), which
# benchmarks/gpu_check.sh installs there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
  "numpy==2.3.5" "pydantic==2.13.4" "pydantic-core==2.46.4" "annotated-types==0.7.0" "typing-inspection==0.4.2" \
  "dask==2026.8.0" "distributed==2026.8.0" "partd==1.4.2" "locket==1.0.0" "tblib==3.2.2" "zict==3.0.0" \
  "tornado==6.6.1"
ls -la .whl
