"""Executor overhead against calling the same functions directly.

Targets (issue: executor overhead): the in-process path (``prepare(...).run()``,
inline lanes) adds at most 20 µs per stage, and at most 5 % on large runs.

Three cases, each timed as the median of many repeats, the direct loop and the
executor alternating in one process so that machine noise hits both alike:

* ``chain-N``: N trivial stages (an integer increment): pure overhead per stage;
* ``requests``: the bundled request pipeline (batch 1), the per-request latency;
* ``tabular-large``: the bundled tabular pipeline at 200,000 rows, all on the CPU.

Usage: ``python benchmarks/overhead.py [--out benchmarks/results/overhead.txt]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import describe  # noqa: E402

from placer import Pipeline  # noqa: E402
from placer.executor import prepare  # noqa: E402
from placer.loader import load_pipeline  # noqa: E402


def chain(n: int) -> Pipeline:
    p = Pipeline(f"chain-{n}")
    p.add(name="s0", cpu=lambda: 0, inputs=[])
    for i in range(1, n):
        p.add(name=f"s{i}", cpu=lambda x: x + 1, inputs={"x": f"s{i - 1}"})
    return p


def direct_runner(p: Pipeline):
    """Call every stage's implementation in order, as hand-written code would."""
    import torch

    order = p.order()
    stages = p.stages
    cpu = torch.device("cpu")

    def run():
        out = {}
        for n in order:
            st = stages[n]
            impl = st.impl_for("cpu")
            kw = {a: out[src] for a, src in st.inputs.items()}
            kw.update(st.params)
            if impl.takes_device:
                kw["device"] = cpu
            out[n] = impl.fn(**kw)
        return out

    return run


def measure(p: Pipeline, repeats: int, digest: bool) -> tuple[float, float]:
    direct = direct_runner(p)
    prepared = prepare(p, "all=cpu", executor="inline")
    for _ in range(3):
        direct()
        prepared.run(digest=digest)
    td, te = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        direct()
        td.append(time.perf_counter() - t)
        t = time.perf_counter()
        prepared.run(digest=digest)
        te.append(time.perf_counter() - t)
    prepared.close()
    return statistics.median(td), statistics.median(te)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/overhead.txt")
    args = ap.parse_args()
    rows = []
    cases = [
        ("chain-10", chain(10), 2000),
        ("chain-100", chain(100), 300),
        ("requests (batch 1)", load_pipeline("pipelines/requests.py", 1), 500),
        ("tabular-large (200k rows)", load_pipeline("pipelines/tabular.py", 200_000), 5),
    ]
    for name, p, reps in cases:
        for digest in (False, True):
            d, e = measure(p, reps, digest)
            n = len(p)
            rows.append((name, n, digest, d, e, (e - d) / n * 1e6, (e - d) / d * 100))
    lines = [
        "# executor overhead: prepare(...).run() on inline lanes vs calling the functions directly",
        describe(),
        f"{'case':28} {'stages':>6} {'digest':>6} {'direct s':>11} {'placer s':>11} {'us/stage':>9} {'overhead %':>10}",
    ]
    for name, n, dg, d, e, us, pct in rows:
        lines.append(f"{name:28} {n:6d} {str(dg):>6} {d:11.6f} {e:11.6f} {us:9.1f} {pct:10.1f}")
    lines.append("targets: <= 20 us/stage on the in-process path; <= 5 % on large runs")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
