"""Benchmark of the placement optimizer: quality against exhaustive search, and speed.

(a) Quality: random pipelines of 4-14 stages with random costs, sizes and link
    speeds. Every placement is enumerated and simulated under the same schedule
    model; the gap of a plan is ``value / optimum - 1``. Printed per objective for
    ``method="exact"`` and ``method="heuristic"``.
(b) Speed: ``placer.optimize.plan`` (the library call, explanations and baselines
    included) on random pipelines of 1,000 and 10,000 stages, each in a fresh
    process; ``placer plan --costs`` on the 1,000-stage table, beyond the start-up
    of the same command on a one-stage table; and exact search on 16 free stages.
    With ``--baseline DIR`` (another checkout of placer), the library call and the
    command are timed there too, alternating with this tree's, so that both meet
    the same machine load.

Usage: ``python benchmarks/optimizer.py [--cases N] [--baseline DIR] [--out benchmarks/results/optimizer.txt]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import random
import statistics
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.optimize import CostTable, plan  # noqa: E402
from placer.files import write_text_atomic  # noqa: E402
from placer.optimize.exact import exhaustive  # noqa: E402
from placer.optimize.objectives import evaluate  # noqa: E402
from placer.optimize.problem import Problem  # noqa: E402
from tests.synthetic import random_model, random_table  # noqa: E402

TARGETS = {"exact_worst": 0.0, "heuristic_worst": 0.05, "heuristic_mean": 0.01,
           1000: 0.5, 10000: 5.0, "cli": 0.5}
ROOT = Path(__file__).resolve().parents[1]
#: one plan(table) of a random pipeline, in a fresh process of the tree on PYTHONPATH: prints its numbers
ONE_PLAN = """
import json, random, sys, time
from placer.optimize import plan
try:
    from tests.synthetic import random_table
except ImportError:  # a tree from before the helper moved to tests/
    from placer.optimize.synthetic import random_table
table = random_table(random.Random(int(sys.argv[2])), int(sys.argv[1]), max_inputs=2)
t0 = time.perf_counter()
p = plan(table)
s = time.perf_counter() - t0
known = [v for v in p.baselines.values() if v is not None]
print(json.dumps({"s": s, "method": p.method, "makespan": p.predicted_makespan_s,
                  "rule": p.baselines["rule_of_thumb"], "best": min(known) if known else None}))
"""


def machine() -> list[str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                     if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or platform.machine()
    return [f"machine: {model}, {os.cpu_count()} cores, Python {platform.python_version()}",
            f"date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
            "load average at start (the cores are shared): "
            + " ".join(f"{x:.1f}" for x in os.getloadavg())]


def random_case(rng: random.Random):
    """A random table: sizes from 100 to 10 million rows, 1 or 2 accelerators."""
    acc = 1 if rng.random() < 0.75 else 2
    n = rng.randint(4, 14 if acc == 1 else 9)  # 3**9 placements is the exhaustive limit here
    model = random_model(rng, n, accelerators=acc)
    return model(10 ** rng.uniform(2, 7)), acc


def free_table(rng: random.Random, n: int):
    """A random table in which every stage can run on both devices."""
    doc = random_table(rng, n, max_inputs=2).model_dump()
    for st in doc["stages"]:
        t = st["seconds"].get("cpu") or st["seconds"]["gpu:0"]
        st["seconds"].setdefault("cpu", t)
        st["seconds"].setdefault("gpu:0", t / 10 ** rng.uniform(-1, 1.5))
    return CostTable.model_validate(doc)


def quality(cases: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    objectives = ("makespan", "throughput", "cost")
    gaps = {(o, m): [] for o in objectives for m in ("exact", "heuristic")}
    sizes = []
    t0 = time.perf_counter()
    for i in range(cases):
        table, acc = random_case(rng)
        objective = objectives[i % 3] if i % 2 else "makespan"  # half the cases: makespan
        pb = Problem(table)
        deadline = None
        if objective == "cost":
            deadline = exhaustive(pb, "makespan")[0] * rng.uniform(1.0, 2.0)
        best, _ = exhaustive(pb, objective, deadline_s=deadline)
        sizes.append((pb.n, acc))
        for method in ("exact", "heuristic"):
            p = plan(table, objective=objective, method=method, deadline_s=deadline)
            value = evaluate(pb, pb.encode(p.placement), objective, deadline)
            gaps[(objective, method)].append(value / best - 1 if best > 0 else 0.0)
    elapsed = time.perf_counter() - t0
    lines = [f"(a) quality: {cases} random pipelines, {min(s for s, _ in sizes)}-"
             f"{max(s for s, _ in sizes)} stages ({sum(1 for _, a in sizes if a == 2)} with 2 GPUs), "
             f"every placement enumerated ({elapsed:.0f} s)",
             f"{'objective':<11} {'method':<10} {'cases':>5} {'mean gap':>10} {'worst gap':>10} "
             f"{'optimal':>8}"]
    for (objective, method), g in gaps.items():
        if g:
            opt = sum(1 for x in g if x <= 1e-9)
            lines.append(f"{objective:<11} {method:<10} {len(g):>5} {statistics.mean(g):>10.3%} "
                         f"{max(g):>10.3%} {opt:>8}")
    allg = {m: [x for (o, mm), g in gaps.items() if mm == m for x in g] for m in ("exact", "heuristic")}
    lines.append(
        f"all objectives: exact worst gap {max(allg['exact']):.3%} (target 0); heuristic mean "
        f"{statistics.mean(allg['heuristic']):.3%} (target <= 1%), worst "
        f"{max(allg['heuristic']):.3%} (target <= 5%)")
    return lines


def _tree_env(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _one_plan(tree: Path, n: int, seed: int) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_PLAN, str(n), str(seed)], cwd=tree, env=_tree_env(tree),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _command_s(tree: Path, table: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "placer", "plan", "--costs", str(table), *extra], cwd=tree,
                   env=_tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def speed(seed: int, repeats: int, baseline: Path | None = None) -> list[str]:
    trees = [("this tree", ROOT)] + ([("baseline", baseline)] if baseline is not None else [])
    lines = ["(b) speed: plan(table) library call in a fresh process, explanations and baselines "
             f"included (median of {repeats})" + (f"; baseline: {baseline}" if baseline else ""),
             f"{'stages':>7} {'tree':<10} {'method':<10} {'planning s':>10} {'max s':>7} {'target':>7} "
             f"{'makespan':>9} {'rule of thumb':>14} {'best baseline':>14}"]
    for n in (1000, 10000):
        got: dict[str, list[dict]] = {name: [] for name, _ in trees}
        for r in range(repeats):
            for name, tree in trees:  # alternating: the trees meet the same load
                got[name].append(_one_plan(tree, n, seed + r))
        for name, _ in trees:
            times = [g["s"] for g in got[name]]
            last = got[name][-1]
            rule = last["rule"]
            lines.append(f"{n:>7} {name:<10} {last['method']:<10} {statistics.median(times):>10.2f} "
                         f"{max(times):>7.2f} {'< ' + str(TARGETS[n]):>7} {last['makespan']:>9.2f} "
                         f"{rule if rule is None else round(rule, 2)!s:>14} "
                         f"{last['best'] if last['best'] is not None else float('nan'):>14.2f}")
    lines += command(seed, repeats, trees)
    times = []
    rng = random.Random(seed)
    for _ in range(10):
        table = free_table(rng, 16)
        t0 = time.perf_counter()
        plan(table, method="exact")
        times.append(time.perf_counter() - t0)
    lines.append(f"exact search, 16 free stages, 10 pipelines: median {statistics.median(times):.3f} s, "
                 f"max {max(times):.3f} s")
    return lines


def command(seed: int, repeats: int, trees: list[tuple[str, Path]]) -> list[str]:
    """``placer plan --costs`` on the 1,000-stage table beyond start-up (best of ``repeats``)."""
    lines = [f"command line: placer plan --costs on the 1,000-stage table (seed {seed}), seconds beyond "
             f"start-up (the same command on a one-stage table), best of {repeats}"]
    with tempfile.TemporaryDirectory() as tmp:
        big, one = Path(tmp) / "pipeline-1000.json", Path(tmp) / "one-stage.json"
        write_text_atomic(big, random_table(random.Random(seed), 1000, max_inputs=2).model_dump_json())
        write_text_atomic(one, json.dumps({"devices": {"cpu": {"kind": "cpu"}},
                                           "stages": [{"name": "a", "seconds": {"cpu": 1.0}}]}))
        for extra, what in ((["--json"], "--json"), ([], "table printed")):
            best: dict[str, list[float]] = {name: [math.inf, math.inf] for name, _ in trees}
            for _ in range(repeats):
                for name, tree in trees:
                    best[name][0] = min(best[name][0], _command_s(tree, one, *extra))
                    best[name][1] = min(best[name][1], _command_s(tree, big, *extra))
            for name, _ in trees:
                start, total = best[name]
                lines.append(f"  {name:<10} {what:<14} start-up {start:5.2f} s, 1,000 stages {total:5.2f} s: "
                             f"{total - start:5.2f} s beyond start-up (target < {TARGETS['cli']})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another placer checkout to time alongside this one (speed only)")
    ap.add_argument("--speed-only", action="store_true", help="skip (a), the quality comparison")
    args = ap.parse_args()
    lines = ["placer optimizer benchmark", *machine(), ""]
    print("\n".join(lines), flush=True)
    parts = [] if args.speed_only else [lambda: quality(args.cases, args.seed), lambda: [""]]
    parts += [lambda: speed(args.seed, args.repeats, args.baseline),
              lambda: ["load average at the end: " + " ".join(f"{x:.1f}" for x in os.getloadavg())]]
    for run in parts:
        part = run()
        print("\n".join(part), flush=True)
        lines += part
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
