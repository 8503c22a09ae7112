"""Robustness of ``--target h200`` to how this machine was profiled: 1 vs 2 intra-op threads.

Usage::

    python benchmarks/target_threads.py [--budget-s 20] [--repeats 2] [--pipelines a,b] [-o benchmarks/results/target-threads-vm.txt]

Each bundled one-shot pipeline (``pipelines/*.py`` without the stream ones) is profiled
fresh (no cache) with one and with two intra-op threads, interleaved and repeated, and
planned for the H200 machine from each profile at one size: the least of the profiles'
largest measured sizes (a budget reaches further with one thread on a busy machine, and
predictions at different sizes are not comparable). Noise only adds time: per thread
count, the repeat whose plan predicts the least makespan is kept. The H200 predictions of its
GPU-capable stages must agree within 25 % and the two plans must place every stage
the same way, or differ by a tie the plan reports (placements within
the stated noise of each other). The profiling machine's own CPU calibration is shared (measured once,
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


def profile_with(name: str, threads: int, budget_s: float):
    from placer.profile.profiler import profile
    from placer.site import costs_from_profile

    build = importlib.import_module(f"pipelines.{name}").build
    prof = profile(build, budget_s=budget_s, threads=threads, cache=False, progress=False)
    return costs_from_profile(prof, describe="h200")


def plan_at(costs, size: float):
    """The target plan at ``size``, and the H200 GPU predictions of its GPU-capable stages."""
    plan = costs.plan(target=True, size=size)
    gpu = {s: d["gpu:0"]["value"] for s, d in costs.predictions(size).items() if "gpu:0" in d}
    return plan, gpu


def tied(a, b) -> bool:
    """Whether plan ``b``'s placement is one of plan ``a``'s reported ties (or the reverse)."""
    return (any(t.placement == b.placement for t in a.ties)
            or any(t.placement == a.placement for t in b.ties))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pipelines", default=",".join(ONE_SHOT))
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args(argv)
    out = [machine_line(), f"profiles of {args.budget_s:g} s each, fresh, 1 and 2 threads interleaved "
                           f"({args.repeats} of each; per thread count the repeat whose plan predicts the least "
                           f"makespan); planned at the same size (the least of the two profiles' largest measured "
                           f"sizes); H200 predictions within {AGREE:.0%} and the same plan (or a reported tie)", ""]
    ok_all = True
    for name in args.pipelines.split(","):
        load0 = os.getloadavg()[0]
        try:
            runs = {1: [], 2: []}
            for _ in range(args.repeats):
                for t in (1, 2):
                    runs[t].append(profile_with(name, t, args.budget_s))
            at = min(min(c.size for c in runs[t]) for t in runs)
            best = {}
            for t, cs in runs.items():
                planned = [plan_at(c, at) for c in cs]
                best[t] = min(planned, key=lambda pg: pg[0].predicted_makespan_s)
        except Exception as exc:  # noqa: BLE001 - recorded; the other pipelines still run
            out.append(f"{name}: failed: {type(exc).__name__}: {exc}")
            ok_all = False
            continue
        (p1, one), (p2, two) = best[1], best[2]
        worst = max((abs(math.log(two[s] / one[s])) for s in one if s in two and one[s] > 0 and two[s] > 0),
                    default=0.0)
        same = p1.placement == p2.placement
        tie = not same and tied(p1, p2)
        ok = (same or tie) and worst <= math.log(1 + AGREE)
        ok_all &= ok
        sizes = "/".join(str(c.size) for t in (1, 2) for c in runs[t])
        out.append(f"{name} at size {at:g} (default sizes {sizes}): plans "
                   + ("the same" if same else "a reported tie" if tie else "DIFFER")
                   + "; GPU stage predictions (1 thread / 2 threads): "
                   + ", ".join(f"{s} {one[s] * 1e3:.3g}/{two.get(s, float('nan')) * 1e3:.3g} ms" for s in one)
                   + f"; worst factor {math.exp(worst):.2f}; noise {p1.noise:.2g}/{p2.noise:.2g}; "
                   + f"load {load0:.1f}-{os.getloadavg()[0]:.1f}" + ("" if ok else "  <- FAIL"))
        if not same:
            out.append(f"    1 thread: {p1.placement}\n    2 threads: {p2.placement}")
        print("\n".join(out[-2:] if not same else out[-2:]), flush=True)
    out += ["", "PASS" if ok_all else "FAIL"]
    text = "\n".join(out)
    print(text)
    if args.output:
        from placer.files import write_text_atomic

        write_text_atomic(args.output, text + "\n")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
