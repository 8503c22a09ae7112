"""Which terms of an H200 prediction move between a 1-thread and a 2-thread profile.

Usage::

    python benchmarks/target_terms.py [--budget-s 5] [--repeats 2] [--pipelines requests,tabular]

Each pipeline is profiled fresh with one and with two intra-op threads, interleaved
(1, 2, 1, 2, ...), and for every stage the terms of its ``--target h200`` costs are
printed side by side: the planned size, this machine's CPU time there, the threads it
kept busy (what the CPU scale reads), the target CPU's time, the GPU stage's ops and
time outside torch ops at the counted size nearest the planned one, its host time, the
GPU prediction, and the stage's output bytes (what a transfer moves). A diagnostic, not
a benchmark with a target: it says where a difference comes from.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def terms(name: str, threads: int, budget_s: float) -> dict:
    from placer.profile.profiler import profile
    from placer.site import costs_from_profile

    build = importlib.import_module(f"pipelines.{name}").build
    prof = profile(build, budget_s=budget_s, threads=threads, cache=False, progress=False)
    costs = costs_from_profile(prof, describe="h200")
    tm, at = costs.target_model, costs.size
    plan = costs.plan(target=True)
    out = {"size": at, "sizes": sorted(prof.measured_sizes or prof.sizes or []), "plan": plan.placement,
           "load": os.getloadavg()[0], "stages": {}}
    for s, sp in prof.stages.items():
        row: dict = {}
        if (s, "cpu") in tm._fits:
            here = tm.fit(s, "cpu")
            row["cpu_here_ms"] = costs.model.predict(s, "cpu", at).value * 1e3
            kw = tm.scale_inputs(s, "cpu", at)
            row["used"] = kw.get("threads_used")
            row["cpu_h200_ms"] = tm.predict(s, "cpu", at).value * 1e3
            row["cpu_fit"] = here.describe()
        if (s, "gpu:0") in tm._fits:
            hs = tm.host_seconds(s)
            w = min(range(len(sp.work)), key=lambda i: abs(sp.work[i].size - at))
            row["ops"] = sp.work[w].work.ops
            row["outside_us"] = sp.work[w].work.outside_s * 1e6
            row["host_us"] = hs[w] * 1e6
            row["wsize"] = sp.work[w].size
            row["gpu_ms"] = tm.predict(s, "gpu:0", at).value * 1e3
        row["out_kb"] = tm.output_bytes(s, at) / 1e3
        out["stages"][s] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pipelines", default="requests")
    args = ap.parse_args(argv)
    for name in args.pipelines.split(","):
        runs = [(t, terms(name, t, args.budget_s)) for _ in range(args.repeats) for t in (1, 2)]
        print(f"== {name}")
        for t, r in runs:
            print(f"  threads {t}: size {r['size']} sizes {r['sizes']} load {r['load']:.1f} plan {r['plan']}")
        for s in runs[0][1]["stages"]:
            print(f"  {s}")
            for t, r in runs:
                row = r["stages"].get(s, {})
                print(f"    {t}t " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
