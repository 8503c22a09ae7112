"""How well does the cost model predict, and what does profiling cost?

For each bundled one-shot pipeline (``pipelines/*.py`` without streams; stream
pipelines are measured by ``benchmarks/stream.py``) at its default size N:

1. profile it as ``placer advise`` does (:func:`placer.profile.profile`, no cache):
   sizes grow up to N and N itself is measured when it fits the budget;
   ``--max-size-div K`` profiles only up to N/K instead, to test extrapolation;
2. predict every (stage, device) at N with :class:`placer.costmodel.model.CostModel`
   (labelled ``measured`` when N was measured, ``predicted`` when extrapolated);
3. run the pipeline once at N on the CPU (one full run: its makespan is the
   yardstick for profiling overhead), then measure each stage at N on each device
   the same way the profiler does (repeats, median);
4. print per stage and device the relative error |predicted - measured| / measured,
   the profiling time as a multiple of the full run, and the load average seen
   (this machine may be shared).

When a real GPU is present it also predicts the GPU from a CPU-only profile with the
shipped H200 description (roofline) and reports the share of stages within 2x.

Usage::

    python benchmarks/costmodel.py [--pipelines tabular,timeseries] [--threads 1]
        [--budget-s 30] [--max-size-div 10] [--record]

``--record`` writes the output to ``benchmarks/results/costmodel-<host>-<date>[-divK][-budgetS].txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.costmodel.model import CostModel  # noqa: E402
from placer.devices import discover  # noqa: E402
from placer.loader import load_pipeline  # noqa: E402
from placer.profile.profiler import cpu_threads, profile  # noqa: E402
from placer.timing import measure  # noqa: E402


def ref(path: Path) -> str:
    """``pipelines.NAME:build``: imported as a module, so compiled functions cache under a stable name."""
    return f"pipelines.{path.stem}:build"


def default_size(path: Path) -> int:
    return int(load_pipeline(ref(path)).size)


def measure_at(path: Path, size: int, devices) -> tuple[float, dict[tuple[str, str], float]]:
    """One full CPU run at ``size`` (its makespan) and each stage's median there per device."""
    from placer.executor import call_stage, execute
    from placer.executor.transfer import to_location

    p = load_pipeline(ref(path), size)
    run = execute(p, "all=cpu", executor="inline")
    out: dict[tuple[str, str], float] = {}
    for name in p.order():
        st = p.stages[name]
        host_in = {a: run.outputs[src] for a, src in st.inputs.items()}
        for d in devices:
            if st.impl_for("cpu" if d.kind == "cpu" else "gpu") is None:
                continue
            ins = host_in if d.kind == "cpu" else {a: to_location(v, d)[0] for a, v in host_in.items()}
            call = lambda: call_stage(st, d, ins, workers=d.workers if d.kind == "cpu" else 1)  # noqa: E731
            cold = d.kind != "cpu"  # the run above was the CPU's first call
            m = measure(call, cold=cold, warmup=1, min_reps=5, max_reps=15, max_time_s=2.0, warn=False)
            out[(name, d.name)] = m.median_s
    return run.makespan_s, out


def has_streams(path: Path) -> bool:
    return bool(load_pipeline(ref(path)).streams())


def bench(path: Path, budget_s: float, log, div: int = 1) -> dict:
    inv = discover()
    devices = [d for d in inv.devices if d.kind in ("cpu", "gpu")]
    n = default_size(path)
    top = max(1, n // div)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    prof = profile(ref(path), size=n, max_size=top, budget_s=budget_s, devices=[d.name for d in devices],
                   cache=False, progress=False, count_work_for_absent=True)
    prof_s = time.perf_counter() - t0
    model = CostModel(prof, describe=["h200"])
    full_s, meas = measure_at(path, n, devices)
    ld = prof.machine_load
    log(f"\n## {path.stem}: N = {n}, profiled sizes {prof.measured_sizes} in {prof_s:.2f} s; "
        f"one full CPU run at N: {full_s:.3f} s; profiling / full run = {prof_s / full_s:.1f}x; "
        f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, timed calls "
        f"{ld.get('cpu_per_wall') or 0:.2f} CPU s per wall s")
    log(f"{'stage':14s} {'device':8s} {'model':34s} {'predicted':>10s} {'measured':>10s} {'rel.err':>8s} label")
    errs: dict[str, list[float]] = {}
    labels: dict[str, int] = {}
    roof = []
    for (stage, dev), m in meas.items():
        try:
            p = model.predict(stage, dev, n)
        except KeyError:
            log(f"{stage:14s} {dev:8s} (no measurements: {prof.stages[stage].devices.get(dev)})")
            continue
        err = abs(p.value - m) / m
        kind = inv.get(dev).kind
        errs.setdefault(kind, []).append(err)
        log(f"{stage:14s} {dev:8s} {model.fit(stage, dev).describe():34s} {p.value:10.3e} {m:10.3e} {err:8.0%} "
            f"{p.label}")
        labels[p.label] = labels.get(p.label, 0) + 1
        if kind == "gpu" and (stage, "gpu:1") in model._fits:  # the described H200 is the next free name
            r = model.predict(stage, "gpu:1", n).value
            roof.append(abs(math.log(r / m)) <= math.log(2))
    for note in prof.notes:
        log(f"  note: {note}")
    return {"pipeline": path.stem, "errs": errs, "overhead": prof_s / full_s, "roof": roof, "labels": labels,
            "measured_n": n in prof.measured_sizes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipelines", default=None, help="comma-separated pipeline names (default: all)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--budget-s", type=float, default=30.0,
                    help="profiling budget per pipeline (default: placer advise's)")
    ap.add_argument("--max-size-div", type=int, default=1,
                    help="profile only up to N/K (default 1: up to N, as placer does)")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/costmodel-<host>-<date>.txt")
    args = ap.parse_args(argv)
    paths = sorted(p for p in (ROOT / "pipelines").glob("*.py") if p.stem != "__init__")
    if args.pipelines:
        want = args.pipelines.split(",")
        paths = [p for p in paths if p.stem in want]
    streams = [p.stem for p in paths if has_streams(p)]
    paths = [p for p in paths if p.stem not in streams]
    buf = io.StringIO()

    def log(line=""):
        print(line, flush=True)
        buf.write(line + "\n")

    inv = discover()
    import torch

    with cpu_threads(args.threads) as used:
        log(f"# cost model benchmark, {dt.datetime.now().isoformat(timespec='seconds')}")
        log(f"machine: {platform.node()} {inv.host.get('cpu_model')}, {inv.host.get('cores')} cores, "
            f"devices: {', '.join(d.name + ' (' + d.label + ')' for d in inv.devices)}; torch {torch.__version__}, "
            f"intra-op threads {used}; python {platform.python_version()}")
        log(f"load average at start (other work on this shared machine): "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min)")
        upto = "N" if args.max_size_div == 1 else f"N/{args.max_size_div}"
        log(f"protocol: profile sizes up to {upto} (geometric, x2; N measured when it fits the budget), "
            f"predict at N, measure at N; profiling budget {args.budget_s:.0f} s per pipeline")
        if streams:
            log(f"stream pipelines ({', '.join(streams)}) are measured by benchmarks/stream.py, not here")
        results = []
        for p in paths:
            try:
                results.append(bench(p, args.budget_s, log, args.max_size_div))
            except Exception as exc:  # noqa: BLE001 - one broken pipeline must not hide the rest
                log(f"\n## {p.stem}: failed: {type(exc).__name__}: {exc}")
    log("\n# summary")
    log(f"load average at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min)")
    labels: dict[str, int] = {}
    for r in results:
        for k, v in r["labels"].items():
            labels[k] = labels.get(k, 0) + v
    log(f"N measured within the budget: {sum(r['measured_n'] for r in results)} of {len(results)} pipelines; "
        f"predictions at N by label: {labels}")
    for kind in ("cpu", "gpu"):
        allerr = [e for r in results for e in r["errs"].get(kind, [])]
        if allerr:
            log(f"{kind} stages: {len(allerr)}; median relative error {np.median(allerr):.0%} (target <= 15%), "
                f"worst {max(allerr):.0%} (target <= 50%), within 50%: {np.mean(np.array(allerr) <= 0.5):.0%}")
    for r in results:
        log(f"{r['pipeline']:18s} profiling / one full run at N: {r['overhead']:.2f}x")
    roof = [x for r in results for x in r["roof"]]
    if roof:
        log(f"H200 roofline from a CPU-only profile: {np.mean(roof):.0%} of GPU stages within 2x (target >= 80%)")
    else:
        log("H200 roofline check: not run (no GPU on this machine)")
    if args.record:
        host = platform.node().split(".")[0] or "host"
        tag = ("" if args.max_size_div == 1 else f"-div{args.max_size_div}") + (
            "" if args.budget_s == 30.0 else f"-budget{args.budget_s:g}")
        out = ROOT / "benchmarks" / "results" / f"costmodel-{host}-{dt.date.today().isoformat()}{tag}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(buf.getvalue())
        print(f"recorded {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
