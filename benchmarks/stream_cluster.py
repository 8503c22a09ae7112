"""Predicted against measured offload: each bundled stream's CPU stages as tasks on a 127.0.0.1 dask cluster.

For every stream pipeline of the gallery (``pipelines/stream_*.py``, :data:`CASES`) this
starts (once) a ``distributed.LocalCluster`` of two worker processes with one thread each
on 127.0.0.1, and per pipeline:

1. profiles the stream here (:func:`placer.stream.profile.profile_stream`, each CPU batch
   stage also timed on a worker of the cluster against here: its ``remote_ratio``, what the
   model prices its batches there at) and measures the cluster
   (:func:`placer.stream.offload.probe_cluster`: per-task overhead, a batch's round
   trip; cached per address and batch size);
2. plans it twice from that profile: this machine's workers only (the stream planner), and
   with the cluster in the search (:func:`placer.stream.offload.plan_offload`), whose best
   candidate using the cluster is "the offload option" (remote workers and batches per task
   per stage) — every case's objective is steady-state samples per second (one epoch);
3. runs both options ``--rounds`` times, interleaved (local, offload, local, ...), and keeps
   the median of each: measured against predicted, and which option the advisor's rule
   keeps (the offload only when predicted faster and measured faster).

With ``--advise`` it also runs ``placer advise pipelines/stream_cache.py --scheduler ADDR``
(the library call, its default size and epochs) and records its cluster block.

The machine is shared: ``os.getloadavg()`` is recorded before and after each case;
compare ratios from one run.

Results go to ``benchmarks/results/stream-cluster-<machine>.json`` and ``.md``.

Usage
-----
    python benchmarks/stream_cluster.py --machine vm-epyc              # about 3 minutes on 2 cores
    python benchmarks/stream_cluster.py --cases stream_cache --rounds 5 --advise
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: label -> (pipeline module, size, build parameters): one epoch, 24 to 64 batches a run
CASES = {
    "stream_images (numpy)": ("stream_images", 768, {"batch": 32, "epochs": 1, "augment": "numpy"}),
    "stream_images (python)": ("stream_images", 768, {"batch": 32, "epochs": 1, "augment": "python"}),
    "stream_tabular": ("stream_tabular", 8192, {"batch": 256, "epochs": 1}),
    "stream_inference": ("stream_inference", 8192, {"batch": 256, "epochs": 1}),
    "stream_cache": ("stream_cache", 2048, {"batch": 64, "epochs": 1}),
}
#: within this relative error the prediction counts as good
TOLERANCE = 0.30


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure_case(label: str, client, rounds: int, budget_s: float) -> dict:
    from placer.executor import execute
    from placer.loader import load_pipeline
    from placer.stream.offload import plan_offload, probe_bytes, probe_cluster
    from placer.stream.planner import plan_from_profile
    from placer.stream.profile import profile_stream

    module, size, params = CASES[label]
    before = load()
    p = load_pipeline(str(ROOT / "pipelines" / f"{module}.py"), size, **params)
    prof = profile_stream(p, budget_s=budget_s, cluster=client)
    link = probe_cluster(client, probe_bytes(prof))
    address = str(client.scheduler.address)
    ratios = {s.name: s.remote_ratio[address] for s in prof.stages if address in s.remote_ratio}
    local, _, _ = plan_from_profile(prof, objective="throughput")
    plan, cand, off = plan_offload(prof, link, objective="throughput")
    row = {"case": label, "pipeline": module, "size": size, "params": params, "load_before": before,
           "link": link.model_dump(), "local_settings": local.settings.decisions(),
           "local_placement": local.placement, "local_predicted": local.predicted_samples_per_s,
           "stage_ratios": ratios}
    if cand is None:
        row["note"] = "no CPU per-batch stage to offload"
        return row
    place_local = {**{n: "cpu" for n in p.stages}, **local.placement}
    place_off = {**{n: "cpu" for n in p.stages}, **cand.place}
    here, there = [], []
    notes: list[str] = []
    for _ in range(rounds):
        here.append(execute(p, place_local, stream=local.settings).streams[0].samples_per_s)
        run = execute(p, place_off, stream=cand.settings, scheduler=client)
        there.append(run.streams[0].samples_per_s)
        notes = run.streams[0].notes  # the last offloaded run's: seconds computing on the workers vs moving
    m_here, m_there = statistics.median(here), statistics.median(there)
    kept = "offload" if off.chosen and m_there > m_here else "local"
    row.update({
        "offload_settings": cand.settings.decisions(), "offload_placement": cand.place,
        "offload": off.model_dump(), "offload_predicted": off.predicted_samples_per_s,
        "local_measured_runs": here, "offload_measured_runs": there,
        "local_measured": m_here, "offload_measured": m_there,
        "offload_ratio": m_there / off.predicted_samples_per_s if off.predicted_samples_per_s else None,
        "local_ratio": m_here / local.predicted_samples_per_s if local.predicted_samples_per_s else None,
        "predicted_faster": "offload" if off.chosen else "local",
        "measured_faster": "offload" if m_there > m_here else "local", "kept": kept,
        "offload_run_notes": notes, "load_after": load(),
    })
    return row


def advise_block(address: str, budget_s: float) -> dict:
    from placer.advisor import advise

    before = load()
    a = advise(str(ROOT / "pipelines" / "stream_cache.py"), scheduler=address, budget_s=budget_s, target="none")
    plan = a.stream_plans[0]
    off = plan.offload.model_dump() if plan.offload is not None else None
    ratio = (off["measured_samples_per_s"] / off["predicted_samples_per_s"]
             if off and off["predicted_samples_per_s"] and off["measured_samples_per_s"] else None)
    notes = [n for n in plan.notes if "per batch on the cluster's workers" in n]
    return {"command": "placer advise pipelines/stream_cache.py --scheduler ADDR --json", "cluster": off,
            "ratio_notes": notes,
            "offload_ratio": ratio, "kept_on_cluster": any(s.worker_kind == "dask" for s in a.run.stages),
            "load_before": before, "load_after": load()}


def _rate(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def table(rows: list[dict]) -> list[str]:
    out = ["| case | offload (remote workers × batches/task, bound; a batch's seconds on a worker / here) | "
           "predicted offload | measured offload | "
           "measured / predicted | predicted local | measured local | measured / predicted | model says | "
           "measured faster | kept | network share | load before→after |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "offload" not in r:
            out.append(f"| {r['case']} | {r.get('note', '')} |" + " |" * 11)
            continue
        ratios = r.get("stage_ratios", {})
        what = ", ".join(f"{s['name']} {s['remote_workers']}×{s['group']} ({s['bound']}"
                         + (f"; {ratios[s['name']]:.1f}x per batch there" if s["name"] in ratios else "") + ")"
                         for s in r["offload"]["stages"])
        ok = "" if r["offload_ratio"] is None else (" ✓" if abs(r["offload_ratio"] - 1) <= TOLERANCE else " ✗")
        out.append(f"| {r['case']} | {what} | {_rate(r['offload_predicted'])} | {_rate(r['offload_measured'])} | "
                   f"{r['offload_ratio']:.2f}{ok} | {_rate(r['local_predicted'])} | {_rate(r['local_measured'])} | "
                   f"{r['local_ratio']:.2f} | {r['predicted_faster']} | {r['measured_faster']} | {r['kept']} | "
                   f"{r['offload']['network_share']:.2%} | {r['load_before'][0]}→{r['load_after'][0]} |")
    return out


def write(rows: list[dict], advised: dict | None, info: dict, out: Path) -> None:
    from placer.files import write_text_atomic

    doc = {"machine": info, "rows": rows, "advise": advised}
    write_text_atomic(out.with_suffix(".json"), json.dumps(doc, indent=1, default=str))
    lines = [f"# Stream offload to a 127.0.0.1 dask cluster: predicted against measured ({info['label']})", "",
             info["describe"], "", f"Cluster: {info['cluster']}. Load (1, 5, 15 min) at the start: "
             f"{info['load_start']}, at the end: {info['load_end']}; `uptime`: {info['uptime']}", "",
             *([info["note"], ""] if info.get("note") else []),
             "Samples per second, steady state; each measured value the median of "
             f"{info['rounds']} interleaved runs; ✓: within {TOLERANCE:.0%} of the prediction.", "",
             *table(rows), ""]
    ok = [r for r in rows if r.get("offload_ratio") is not None]
    if ok:
        good = sum(abs(r["offload_ratio"] - 1) <= TOLERANCE for r in ok)
        lines.append(f"Offload predicted within {TOLERANCE:.0%} in {good} of {len(ok)} cases; the kept option "
                     f"measured slower than the other in "
                     f"{sum(r['kept'] != r['measured_faster'] and r['predicted_faster'] == 'offload' for r in ok)}.")
        lines.append("")
    measured = [r for r in rows if r.get("stage_ratios")]
    if measured:
        lines += ["Each CPU stage's seconds per batch on a worker over here, as the profile measured it (timed inside "
                  "a task on a few profiled batches, median) and the model priced it:", ""]
        lines += [f"- {r['case']}: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["stage_ratios"].items())
                  for r in measured]
        lines.append("")
    if advised is not None:
        c = advised["cluster"] or {}
        stages = ", ".join(f"{s['name']} {s['remote_workers']}×{s['group']}" for s in c.get("stages", []))
        lines += ["## placer advise pipelines/stream_cache.py --scheduler ADDR", "",
                  f"offload: {stages}; "
                  f"predicted {_rate(c.get('predicted_samples_per_s'))} samples/s, measured "
                  f"{_rate(c.get('measured_samples_per_s'))} (ratio "
                  f"{advised['offload_ratio']:.2f}); this machine's workers: predicted "
                  f"{_rate(c.get('local_predicted_samples_per_s'))}, measured {_rate(c.get('local_measured_samples_per_s'))}; "
                  f"kept on the cluster: {advised['kept_on_cluster']}; network share {c.get('network_share', 0):.2%}; "
                  f"load {advised['load_before'][0]}→{advised['load_after'][0]}", "",
                  *[f"- {n}" for n in advised.get("ratio_notes", [])], ""]
    write_text_atomic(out.with_suffix(".md"), "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    import subprocess

    from distributed import Client, LocalCluster

    from _machine import describe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case labels")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=8.0, help="profiling budget per case")
    ap.add_argument("--advise", action="store_true", help="also run placer advise on stream_cache at the cluster")
    ap.add_argument("--machine", default="vm-epyc")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--note", default="", help="a line for the results (the machine, what else ran)")
    args = ap.parse_args(argv)
    labels = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in labels if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    out = args.out or ROOT / "benchmarks" / "results" / f"stream-cluster-{args.machine}"
    start = load()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        rows = []
        for label in labels:
            t = time.perf_counter()
            rows.append(measure_case(label, client, args.rounds, args.budget_s))
            print(f"{label}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
            print("\n".join(table(rows)[-1:]), file=sys.stderr)
        advised = advise_block(cluster.scheduler_address, args.budget_s * 2) if args.advise else None
    info = {"label": args.machine, "describe": describe(), "cluster": "LocalCluster(n_workers=2, "
            "threads_per_worker=1, processes=True) on 127.0.0.1", "load_start": start, "load_end": load(),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "rounds": args.rounds, "note": args.note}
    write(rows, advised, info, out)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
