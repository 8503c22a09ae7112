"""Robustness of ``--target h200`` to how this machine was profiled: 1 vs 2 intra-op threads.

Usage::

    python benchmarks/target_threads.py [--budget-s 20] [--pipelines a,b] [-o benchmarks/results/target-threads-vm.txt]

Each bundled one-shot pipeline (``pipelines/*.py`` without the stream ones) is profiled
twice at its default size, fresh (no cache), with one and with two intra-op threads,
and planned for the H200 machine from each profile. The H200 predictions of its
GPU-capable stages must agree within 25 % and the two plans must place every stage
the same way. The profiling machine's own CPU calibration is shared (measured once,
cached), as in use.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe as machine_line  # noqa: E402

ONE_SHOT = ["requests", "tabular", "branches", "mnist_mlp", "mnist_cnn", "cifar_augment", "batched_inference",
            "timeseries", "etl_dask"]
AGREE = 0.25


def plan_with(name: str, threads: int, budget_s: float):
    from placer.profile.profiler import profile
    from placer.site import costs_from_profile

    build = importlib.import_module(f"pipelines.{name}").build
    prof = profile(build, budget_s=budget_s, threads=threads, cache=False, progress=False)
    costs = costs_from_profile(prof, describe="h200")
    plan = costs.plan(target=True)
    gpu = {s: d["gpu:0"]["value"] for s, d in costs.predictions().items() if "gpu:0" in d}
    return plan.placement, gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--pipelines", default=",".join(ONE_SHOT))
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args(argv)
    out = [machine_line(), f"profiles of {args.budget_s:g} s each, fresh; H200 predictions within {AGREE:.0%} "
                           "and the same plan from 1 and 2 threads", ""]
    ok_all = True
    for name in args.pipelines.split(","):
        load0 = os.getloadavg()[0]
        try:
            one = plan_with(name, 1, args.budget_s)
            two = plan_with(name, 2, args.budget_s)
        except Exception as exc:  # noqa: BLE001 - recorded; the other pipelines still run
            out.append(f"{name}: failed: {type(exc).__name__}: {exc}")
            ok_all = False
            continue
        worst = max((abs(math.log(two[1][s] / one[1][s])) for s in one[1] if s in two[1] and one[1][s] > 0
                     and two[1][s] > 0), default=0.0)
        same = one[0] == two[0]
        ok = same and worst <= math.log(1 + AGREE)
        ok_all &= ok
        out.append(f"{name}: plans {'the same' if same else 'DIFFER'}; GPU stage predictions (1 thread / 2 threads): "
                   + ", ".join(f"{s} {one[1][s] * 1e3:.3g}/{two[1].get(s, float('nan')) * 1e3:.3g} ms" for s in one[1])
                   + f"; worst factor {math.exp(worst):.2f}; load {load0:.1f}-{os.getloadavg()[0]:.1f}"
                   + ("" if ok else "  <- FAIL"))
        if not same:
            out.append(f"    1 thread: {one[0]}\n    2 threads: {two[0]}")
        print(out[-1], flush=True)
    out += ["", "PASS" if ok_all else "FAIL"]
    text = "\n".join(out)
    print(text)
    if args.output:
        from placer.files import write_text_atomic

        write_text_atomic(args.output, text + "\n")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
