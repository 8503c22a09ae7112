"""H200 target plans of every bundled (non-stream) pipeline and the judging pipelines, at three sizes.

Usage::

    python benchmarks/judge_plans.py --label before -o benchmarks/results/judge-plans-before-vm-epyc
    python benchmarks/judge_plans.py --label after  -o benchmarks/results/judge-plans-after-vm-epyc

Each pipeline is profiled once on this machine (``--budget-s``) and the profile is kept under
``--profiles`` (so that a later run plans from the very same measurements); then, at each size, the
plan ``placer plan --target h200`` makes is compared with the best point estimate over every
placement of the same cost table (the exact search): ``ratio`` is the chosen plan's predicted
makespan over the best one's, and must stay at or below 1.1. Each training stage's predicted CPU
and GPU times are kept beside its planned device.

The judging pipelines (``benchmarks/judging``) are shaped like user scripts and are used only
to judge: a CIFAR training script (augment, then a small CNN trained by SGD, at 4,096 images),
tabular cleaning and training, and a signal in two concurrent branches, one loop-carried.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import describe  # noqa: E402

#: (pipeline reference, module, sizes); the middle size is the one profiled up to (or the largest)
CASES = [
    ("pipelines/batched_inference.py", "pipelines.batched_inference", (12_500, 100_000, 800_000)),
    ("pipelines/branches.py", "pipelines.branches", (2_500, 20_000, 160_000)),
    ("pipelines/cifar_augment.py", "pipelines.cifar_augment", (256, 1024, 4096)),
    ("pipelines/etl_dask.py", "pipelines.etl_dask", (50_000, 400_000, 3_200_000)),
    ("pipelines/mnist_cnn.py", "pipelines.mnist_cnn", (256, 1024, 4096)),
    ("pipelines/mnist_mlp.py", "pipelines.mnist_mlp", (1024, 8192, 65_536)),
    ("pipelines/requests.py", "pipelines.requests", (1, 16, 2048)),
    ("pipelines/tabular.py", "pipelines.tabular", (2_500, 20_000, 160_000)),
    ("pipelines/timeseries.py", "pipelines.timeseries", (62_500, 500_000, 4_000_000)),
    ("pipelines/transformer.py", "pipelines.transformer", (8, 64, 512)),
    ("benchmarks/judging/cifar_script.py", "judging.cifar_script", (512, 4096, 16_384)),
    ("benchmarks/judging/tabular_fit.py", "judging.tabular_fit", (12_500, 100_000, 800_000)),
    ("benchmarks/judging/two_branches.py", "judging.two_branches", (125_000, 1_000_000, 8_000_000)),
]


def profile_of(ref: str, size: int, folder: Path, budget_s: float):
    from placer.data.profile import Profile
    from placer.site import LocalSite

    path = folder / (Path(ref).stem + ".json")
    if path.exists():
        return Profile.load(path), path
    prof = LocalSite(cache=False).measure(ref, size=size, budget_s=budget_s)
    return prof, path


def judge(ref: str, sizes, folder: Path, budget_s: float, tables: Path | None = None) -> list[dict]:
    from placer.devices import discover
    from placer.optimize.plan import search
    from placer.optimize.problem import Problem
    from placer.optimize.simulate import makespan
    from placer.site import costs_from_profile

    prof, path = profile_of(ref, sizes[1], folder, budget_s)
    inv = discover()
    rows = []
    for s in sizes:
        costs = costs_from_profile(prof, size=s, describe="h200", inventory=inv)
        table = costs.table(s, target=True)
        if tables is not None:
            tables.mkdir(parents=True, exist_ok=True)
            table.save(tables / f"{Path(ref).stem}-{s}.json")
        plan = costs.plan(size=s, target=True)
        pb = Problem(table)
        chosen = makespan(pb, [pb.devices.index(plan.placement[n]) for n in pb.names])
        best_place = search(pb, "makespan", "exact", None)[3]
        best = makespan(pb, best_place)
        train = {st.name: {"planned": plan.placement[st.name],
                           **{d: st.seconds.get(d) for d in pb.devices},
                           "uncertainty": dict(st.uncertainty)}
                 for st in table.stages if st.kind == "training"}
        rows.append({"pipeline": Path(ref).stem, "size": s, "placement": plan.placement,
                     "best_placement": pb.placement(best_place), "chosen_s": chosen, "best_s": best,
                     "ratio": chosen / best if best > 0 else 1.0, "ties": len(plan.ties),
                     "training": train})
    if not path.exists():  # kept after planning, so it carries this CPU's calibration for the target
        folder.mkdir(parents=True, exist_ok=True)
        prof.save(path)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("-o", "--output", required=True, help="path stem: writes STEM.json and STEM.md")
    ap.add_argument("--profiles", default=str(ROOT / "benchmarks/results/judge-profiles"))
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--save-tables", default=None, help="also save each H200 cost table planned from here")
    args = ap.parse_args()
    folder = Path(args.profiles)
    rows = []
    for ref, _mod, sizes in CASES:
        if args.only and Path(ref).stem not in args.only:
            continue
        try:
            rows += judge(ref, sizes, folder, args.budget_s,
                          Path(args.save_tables) if args.save_tables else None)
        except Exception as exc:  # one pipeline's failure is recorded, not fatal to the rest
            rows.append({"pipeline": Path(ref).stem, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1], default=str)[:300], flush=True)
    head = describe() + " (2-core AMD EPYC VM, no GPU; plans for --target h200)"
    stem = Path(args.output)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"machine": head, "label": args.label, "rows": rows},
                                                    indent=1, default=str))
    lines = [f"# H200 target plans, {args.label}", "", head, "",
             "| pipeline | size | ratio | ties | training (planned: cpu / gpu:0 s) | placement |",
             "|---|---:|---:|---:|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['pipeline']} | | | | error: {r['error']} | |")
            continue
        tr = "; ".join(f"{n} {t['planned']}: {t.get('cpu') or 0:.3g} / {t.get('gpu:0') or 0:.3g}"
                       for n, t in r["training"].items())
        pl = ", ".join(f"{n}={d}" for n, d in r["placement"].items())
        lines.append(f"| {r['pipeline']} | {r['size']:,} | {r['ratio']:.3f} | {r['ties']} | {tr} | {pl} |")
    worst = max((r["ratio"] for r in rows if "ratio" in r), default=1.0)
    lines += ["", f"worst ratio of the chosen plan to the best point estimate: {worst:.3f} (bar: 1.1)"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
