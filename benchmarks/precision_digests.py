"""Outputs digests of the bundled pipelines here and in another checkout (nothing allowed in a lower precision).

Usage::

    python benchmarks/precision_digests.py --other /path/to/another/checkout [--out benchmarks/results/precision-digests-vm.md]

Each bundled pipeline runs at the gallery's small size on ``all=cpu`` in a fresh process
with each checkout on ``PYTHONPATH``; the digests must be equal: allowing nothing, the
precision feature changes no numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SMALL = {
    "mnist_mlp": (64, {"batch": 16}), "mnist_cnn": (40, {"batch": 16}), "cifar_augment": (40, {"batch": 16}),
    "batched_inference": (300, {"batch": 128}), "timeseries": (400, {}), "branches": (60, {}),
    "etl_dask": (1500, {"epochs": 20}), "tabular": (500, {}), "requests": (32, {}),
}

CHILD = """
import importlib, json, sys
from placer.executor import execute
small = json.loads(sys.argv[1])
out = {}
for name, (size, params) in small.items():
    mod = importlib.import_module(f"pipelines.{name}")
    out[name] = execute(mod.build(size, **params), "all=cpu").outputs_digest
print(json.dumps(out))
"""


def digests(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(SMALL)], capture_output=True, text=True, env=env,
                         cwd=root, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="another checkout of placer (e.g. the main branch)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "precision-digests-vm.md"))
    args = ap.parse_args()
    from _machine import describe

    other, here = digests(Path(args.other)), digests(ROOT)
    lines = [f"# Outputs digests, nothing allowed in a lower precision ({describe()})", "",
             f"load average: {os.getloadavg()[0]:.2f}; other checkout: {args.other}", "",
             "| pipeline | other | this checkout | equal |", "|---|---|---|---|"]
    lines += [f"| {k} | {other[k]} | {here[k]} | {'yes' if other[k] == here[k] else 'NO'} |" for k in SMALL]
    from placer.files import write_text_atomic

    sys.path.insert(0, str(ROOT))
    write_text_atomic(Path(args.out), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
