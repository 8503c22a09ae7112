"""Stream throughput: baselines, an exhaustive grid of stream settings, and the executor's overhead.

For each stream pipeline of the gallery (``stream_images`` with numpy and with
pure-Python augmentation, ``stream_tabular``, ``stream_inference``,
``stream_cache``) this measures steady-state samples per second
(``StreamStats.samples_per_s``: the steady state, without the batches that filled
the queues while the first was in the step) on this machine, each run reading the
whole stream (:data:`CASES`), every run repeated ``REPS`` times and the best kept
(other processes may share the machine), for:

* baselines: ``workers=0`` (the sequential loop, what ``num_workers=0`` gives),
  ``workers=<cores>`` with ``pin_memory``, and the rule of thumb (per-batch
  stages on the CPU, the step on the accelerator) where an accelerator exists;
* the grid: placement × workers {1, 2, 4} × worker kind (:data:`WORKER_KINDS`) ×
  prefetch {1, 2, 4} × cache point {none, each deterministic stage before the
  first random one} (cache points only for streams of several epochs);
* the executor's overhead: the sequential run against a hand-written loop doing
  the same work on the same batches — the pipeline's own stage functions called
  directly inside a ``torch.utils.data.DataLoader`` (``num_workers=0``,
  ``batch_size=None``) and a plain training loop — interleaved in one run; the
  ratio is hand-written samples/s over the executor's.

"placer's plan" is the stream planner's choice (``plan_stream``), measured like every
grid cell. Then a final comparison runs the plan, the grid's best few and the baselines
again, interleaved, several rounds, and compares their medians: the grid's best is a
maximum over many noisy cells, which flatters it. On a machine without a GPU the placement is all-CPU; with
``--simulated`` the grid and the rule of thumb also run on ``gpu-sim``, the
labelled simulated test device (GPU implementations on the CPU), never a GPU.

Results go to ``benchmarks/results/stream-<machine>.json`` (every run) and ``.md``
(the tables), with the machine they ran on.

Usage
-----
    python benchmarks/stream.py                         # this machine, about 8-9 minutes on 2 cores
    python benchmarks/stream.py --cases stream_cache --time-limit-s 120
    python benchmarks/stream.py --simulated --machine vm-simulated
    python benchmarks/stream.py --scale 3 --time-limit-s 1000   # runs 3x longer: steadier medians
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: label -> (pipeline module, size, build parameters, batches per run): several epochs where it matters;
#: every run reads the whole stream (all its epochs), 24 to 64 batches, so that filling the queues at
#: the start weighs little
CASES = {
    "stream_images (numpy)": ("stream_images", 192, {"batch": 32, "epochs": 4, "augment": "numpy"}, 24),
    "stream_images (python)": ("stream_images", 192, {"batch": 32, "epochs": 4, "augment": "python"}, 24),
    "stream_tabular": ("stream_tabular", 8192, {"batch": 256, "epochs": 2}, 64),
    "stream_inference": ("stream_inference", 16384, {"batch": 256, "epochs": 1}, 64),
    "stream_cache": ("stream_cache", 1024, {"batch": 64, "epochs": 4, "passes": 12}, 64),
}
WORKERS = (1, 2, 4)
#: worker kinds of the grid; process workers only where a stage holds the GIL (they start child
#: processes on every run)
WORKER_KINDS = ["thread"]
PROCESS_CASES = {"stream_images (python)"}
PREFETCH = (1, 2, 4)
#: torch intra-op threads of the grid: torch's own (None) and one
TORCH_THREADS = (None, 1)
#: seconds the stream planner may spend on each pipeline (profiling and verification)
PLAN_BUDGET_S = 15.0
#: repeats of each grid cell (the best kept), and rounds of the final interleaved comparison
REPS = 1
FINAL_ROUNDS = 5
MIN_ROUNDS = 3
#: the share of a case's time the grid may take (the rest: planning and the final comparison)
GRID_SHARE = 0.45
#: grid configurations (by best of their repeats) that enter the final comparison
FINAL_TOP = 3
#: every case's samples per epoch (and so batches per run) times this (``--scale``): longer runs, less noise
SCALE = 1


# -- what to run -------------------------------------------------------------------------------
def accelerators(simulated: bool) -> list[str]:
    """Accelerators to place on: a CUDA GPU if present, and ``gpu-sim`` only when asked for."""
    import torch

    return (["gpu"] if torch.cuda.is_available() else []) + (["gpu-sim"] if simulated else [])


def stream_of(p) -> list[str]:
    """The one stream's members: source, per-batch stages, step."""
    return next(iter(p.validate().streams().values()))


def placements(p, accs: list[str]) -> dict[str, dict[str, str]]:
    """Label → placement: all on the CPU; per accelerator the rule of thumb and all placeable stages on it."""
    members = stream_of(p)
    out = {"cpu": {}}
    for acc in accs:
        step = members[-1]
        movable = [m for m in members[1:] if len(p.stages[m].device_classes()) == 2]
        out[f"rule:{acc}"] = {step: acc}
        out[f"all:{acc}"] = {m: acc for m in movable}
    return out


def cache_points(p) -> list[str | None]:
    """None, the source (unless it reshuffles per epoch), and each deterministic per-batch stage
    before the first random one (several epochs only)."""
    from placer.executor.stream.nodes import takes

    members = stream_of(p)
    src = p.stages[members[0]]
    if src.epochs < 2:
        return [None]
    points: list[str | None] = [None]
    if not takes(src.impl_for("cpu").fn, "batch_info"):
        points.append(members[0])
    for m in members[1:-1]:
        if p.stages[m].random:
            break
        points.append(m)
    return points


def grid(p, accs: list[str], kinds: list[str] | None = None) -> list[tuple[str, dict, dict]]:
    """(placement label, placement, StreamConfig fields) for every grid point."""
    out = []
    for (label, pl), w, kind, pf, cache, threads in itertools.product(
            placements(p, accs).items(), WORKERS, kinds or WORKER_KINDS, PREFETCH, cache_points(p), TORCH_THREADS):
        if kind == "process" and w > (os.cpu_count() or 1):
            continue
        batch_stages = [m for m in stream_of(p)[1:-1] if pl.get(m, "cpu") == "cpu"]
        out.append((label, pl, {"workers": w, "worker_kind": {m: kind for m in batch_stages},
                                "prefetch": pf, "cache": cache, "torch_threads": threads}))
    return out


# -- measuring the executor --------------------------------------------------------------------
def run_executor(p, placement: dict, fields: dict, limit: int) -> dict:
    """One run of at most ``limit`` batches: steady samples/s, the digest, the step's idle share."""
    from placer.executor import execute
    from placer.stream import StreamConfig

    cfg = StreamConfig(**{"max_batches": limit, **fields})
    run = execute(p, {**placement} or "all=cpu", stream=cfg)
    s = run.streams[0]
    return {"samples_per_s": s.samples_per_s, "digest": run.outputs_digest, "batches": s.batches,
            "idle": s.consumer_idle_fraction, "notes": s.notes}


def best_of(fn, reps: int) -> dict:
    """Run ``fn`` ``reps`` times; the best rate, every rate, and whether the digests agreed."""
    runs, error = [], None
    try:
        for _ in range(reps):
            runs.append(fn())
    except Exception as exc:  # a configuration that cannot run is reported, not fatal
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    if not runs:
        return {"samples_per_s": None, "rates": [], "error": error}
    best = max(runs, key=lambda r: r["samples_per_s"])
    digests = {r.get("digest") for r in runs}
    return {**best, "rates": [r["samples_per_s"] for r in runs], "error": error,
            "stable_digest": len(digests) == 1}


# -- the hand-written loop ---------------------------------------------------------------------
def _call(stage, kwargs: dict):
    import torch

    impl = stage.impl_for("cpu")
    kw = {**kwargs, **stage.params}
    if impl.takes_device:
        kw["device"] = torch.device("cpu")
    return impl.fn(**kw)


class _OneShot:
    """One-shot stage outputs, each computed once by calling its function."""

    def __init__(self, p):
        self.p, self.memo = p, {}

    def __call__(self, name: str):
        if name not in self.memo:
            st = self.p.stages[name]
            self.memo[name] = _call(st, {a: self(s) for a, s in st.inputs.items()})
        return self.memo[name]


def hand_loader(p, one_shot: _OneShot, limit: int):
    """A DataLoader over the stream's batches: source and per-batch stages called directly."""
    from torch.utils.data import DataLoader, IterableDataset

    from placer.stream import BatchInfo

    members = stream_of(p)
    stages = p.stages

    class Batches(IterableDataset):
        def __iter__(self):
            src, seq = stages[members[0]], 0
            for epoch in range(src.epochs):
                for index, raw in enumerate(_call(src, {a: one_shot(s) for a, s in src.inputs.items()})):
                    if seq >= limit:
                        return
                    info, values = BatchInfo(epoch, index, seq), {members[0]: raw}
                    for m in members[1:-1]:
                        values[m] = _call_batch(stages[m], values, one_shot, info)
                    yield values
                    seq += 1

    return DataLoader(Batches(), batch_size=None, num_workers=0)


def _call_batch(stage, values: dict, one_shot: _OneShot, info):
    kwargs = {a: values[s] if s in values else one_shot(s) for a, s in stage.inputs.items()}
    if "batch_info" in _params(stage.impl_for("cpu").fn):
        kwargs["batch_info"] = info
    return _call(stage, kwargs)


def _params(fn) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)


def run_hand(p, limit: int) -> dict:
    """The hand-written loop: the step called on every batch the DataLoader yields."""
    import torch

    from placer.executor.stream.nodes import batch_len

    members = stream_of(p)
    step = p.stages[members[-1]]
    one_shot = _OneShot(p)
    state = step.init(device=torch.device("cpu")) if step.init is not None else None
    done, samples, first = [], 0, 0
    for values in hand_loader(p, one_shot, limit):
        kwargs = {a: values[s] if s in values else one_shot(s) for a, s in step.inputs.items()}
        rows = batch_len(next(values[s] for s in step.inputs.values() if s in values))
        out = _call(step, {**kwargs, **({"state": state} if state is not None else {})})
        if state is not None and out is not None:
            state = out
        done.append(time.perf_counter())
        samples, first = samples + rows, first or rows
    steady = done[-1] - done[0] if len(done) >= 3 else 0.0
    return {"samples_per_s": (samples - first) / steady if steady > 0 else 0.0, "batches": len(done)}


def overhead(p, reps: int, limit: int) -> dict:
    """Sequential executor and hand-written loop, interleaved, both with one torch intra-op thread (torch's
    default threads on loaded cores vary more than the machinery does); best of each and their ratio."""
    import torch

    ex, hand = [], []
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for _ in range(max(reps, 3)):
            ex.append(run_executor(p, {}, {"workers": 0, "torch_threads": 1}, limit)["samples_per_s"])
            hand.append(run_hand(p, limit)["samples_per_s"])
    finally:
        torch.set_num_threads(before)
    return {"executor": max(ex), "hand": max(hand), "executor_rates": ex, "hand_rates": hand,
            "ratio": max(hand) / max(ex) if max(ex) > 0 else None}


# -- one pipeline ------------------------------------------------------------------------------
def measure_case(label: str, accs: list[str], reps: int, budget_s: float) -> dict:
    """Baselines, overhead, the grid, the plan and the final comparison of one case within about
    ``budget_s``: grid points past :data:`GRID_SHARE` of it are skipped, and the final comparison
    runs at least :data:`MIN_ROUNDS` rounds, more while the budget lasts (up to :data:`FINAL_ROUNDS`)."""
    t_start = time.perf_counter()
    deadline = t_start + GRID_SHARE * budget_s
    import importlib

    module, size, params, max_batches = CASES[label]
    size, max_batches = size * SCALE, max_batches * SCALE
    p = importlib.import_module(f"pipelines.{module}").build(size, **params)
    ref = run_executor(p, {}, {"workers": 0}, max_batches)["digest"]  # also the warm-up: imports, first calls
    # the sequential run at each torch intra-op thread count: a training step's float reductions follow
    # the thread count, so each run is checked against the sequential run at its own count
    refs = {None: ref, **{t: run_executor(p, {}, {"workers": 0, "torch_threads": t}, max_batches)["digest"]
                          for t in TORCH_THREADS if t is not None}}
    cores = os.cpu_count() or 1
    base = {"workers=0": best_of(lambda: run_executor(p, {}, {"workers": 0}, max_batches), reps),
            f"workers={cores}, pin_memory": best_of(
                lambda: run_executor(p, {}, {"workers": cores, "pin_memory": True}, max_batches), reps)}
    for acc in accs:
        pl = placements(p, [acc])[f"rule:{acc}"]
        base[f"rule of thumb ({_device_words(acc)})"] = best_of(
            lambda pl=pl: run_executor(p, pl, {"workers": cores, "pin_memory": True}, max_batches), reps)
    cells = []
    kinds = WORKER_KINDS + (["process"] if label in PROCESS_CASES else [])
    for pl_label, pl, fields in grid(p, accs, kinds):
        row = {"placement": pl_label, "workers": fields["workers"],
               "worker_kind": next(iter(fields["worker_kind"].values()), "thread"),
               "prefetch": fields["prefetch"], "cache": fields["cache"], "torch_threads": fields["torch_threads"],
               "fields": fields, "place": pl}
        if time.perf_counter() > deadline:
            cells.append({**row, "samples_per_s": None, "error": "not measured: time limit"})
            continue
        cells.append({**row, **best_of(lambda pl=pl, f=fields: run_executor(p, pl, f, max_batches), reps)})
    for rec in [*base.values(), *cells]:
        if rec.get("digest") is not None:
            rec["same_digest_as_sequential"] = rec["digest"] == refs.get(rec.get("torch_threads"), ref)
            rec["same_digest_as_default_threads"] = rec["digest"] == ref
    plan = measure_plan(p, reps, max_batches, refs)
    case = {"label": label, "module": module, "size": size, "params": params, "max_batches": max_batches,
            "stream": stream_of(p), "baselines": base, "overhead": overhead(p, reps, max_batches), "grid": cells,
            "plan": plan}
    case["final"] = final_comparison(p, case, max_batches, accs, t_start + budget_s)
    return case


def final_comparison(p, case: dict, limit: int, accs: list[str], until: float, rounds: int = FINAL_ROUNDS) -> dict:
    """The plan, the grid's best few and the baselines again, interleaved: every round runs each once, in
    turn, so that the machine's changing load falls on all alike; medians, spreads and the plan's ratios.

    The grid's best is a maximum over many noisy cells (each the best of its repeats), which flatters it;
    this comparison measures the contenders the same way, the same number of times.
    """
    import statistics

    cores = os.cpu_count() or 1
    ok = sorted([c for c in case["grid"] if c.get("samples_per_s") and c.get("same_digest_as_sequential")
                 and c.get("stable_digest")], key=lambda c: -c["samples_per_s"])[:FINAL_TOP]
    plan = case["plan"]
    entries = {"placer's plan": (plan["placement"], plan["config"]),
               "workers=0": ({}, {"workers": 0}),
               f"workers={cores}, pin_memory": ({}, {"workers": cores, "pin_memory": True})}
    for acc in accs:
        entries[f"rule of thumb ({_device_words(acc)})"] = (placements(p, [acc])[f"rule:{acc}"],
                                                            {"workers": cores, "pin_memory": True})
    for i, c in enumerate(ok):
        entries[f"grid #{i + 1}: {_cfg(c)}"] = (c["place"], c["fields"])
    rates: dict[str, list[float]] = {k: [] for k in entries}
    done = 0
    for r in range(rounds):
        if r >= MIN_ROUNDS and time.perf_counter() > until:
            break
        done += 1
        for name, (pl, fields) in entries.items():
            try:
                rates[name].append(run_executor(p, pl, fields, limit)["samples_per_s"])
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                rates[name].append(float("nan"))
                case.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
    med = {k: statistics.median([x for x in v if x == x] or [0.0]) for k, v in rates.items()}
    mine = med["placer's plan"]
    grid_names = [k for k in entries if k.startswith("grid #")]
    best = max(grid_names, key=lambda k: med[k], default=None)
    return {"rounds": done, "rates": rates, "median": med,
            "spread": {k: [min(v), max(v)] for k, v in rates.items()},
            "vs_plan": {k: (mine / v if v else None) for k, v in med.items()},
            "best_grid": best, "plan_over_best_grid": mine / med[best] if best and med[best] else None,
            "plan_over_baselines": {k: mine / med[k] for k in entries if not k.startswith(("grid", "placer"))
                                    and med[k]},
            "predicted_over_measured": plan["predicted_samples_per_s"] / mine if mine else None}


def measure_plan(p, reps: int, max_batches: int, refs: dict) -> dict:
    """placer's plan for the stream (profiled and planned here), and its measured samples/s."""
    from placer.stream.planner import plan_stream, stream_config

    t0 = time.perf_counter()
    sp = plan_stream(p, budget_s=PLAN_BUDGET_S)
    planning_s = time.perf_counter() - t0
    fields = stream_config(sp).decisions()
    rec = best_of(lambda: run_executor(p, sp.placement, fields, max_batches), reps)
    return {**rec, "placement": sp.placement, "config": fields, "predicted_samples_per_s": sp.predicted_samples_per_s,
            "bottleneck": sp.bottleneck, "planning_s": planning_s,
            "same_digest_as_sequential": rec.get("digest") == refs.get(fields.get("torch_threads"), refs[None]),
            "same_digest_as_default_threads": rec.get("digest") == refs[None],
            "verified": [v.model_dump() for v in sp.verified], "reasons": sp.reasons, "notes": sp.notes}


def _device_words(acc: str) -> str:
    return "gpu-sim: simulated device, not a GPU" if acc == "gpu-sim" else acc


def best_cell(case: dict) -> dict | None:
    ok = [c for c in case["grid"] if c.get("samples_per_s") and c.get("same_digest_as_sequential")
          and c.get("stable_digest")]
    return max(ok, key=lambda c: c["samples_per_s"]) if ok else None


# -- writing -----------------------------------------------------------------------------------
def _rate(v) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _cfg(c: dict) -> str:
    threads = f", torch threads {c['torch_threads']}" if c.get("torch_threads") else ""
    return (f"{c['placement']}, {c['workers']} {c['worker_kind']}, prefetch {c['prefetch']}, "
            f"cache {c['cache'] or 'none'}{threads}")


def _plan_cfg(cfg: dict) -> str:
    kinds = {k for k in cfg.get("worker_kind", {}).values()}
    parts = [f"workers {cfg.get('stage_workers') or cfg.get('workers')}" + (f" ({', '.join(sorted(kinds))})"
                                                                               if kinds else ""),
             f"prefetch {cfg.get('prefetch')}", f"cache {cfg.get('cache') or 'none'}"]
    if cfg.get("torch_threads"):
        parts.append(f"torch threads {cfg['torch_threads']}")
    return ", ".join(parts)


def final_table(cases: list[dict]) -> list[str]:
    lines = ["| pipeline | rounds | placer's plan (median, min–max) | plan's settings | predicted (÷ measured) "
             "| best of the grid's top 3 (median, min–max) | plan ÷ it | workers=0 | plan ÷ it "
             "| workers=cores, pin | plan ÷ it |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        f = c.get("final")
        if not f:
            continue
        med, spr = f["median"], f["spread"]

        def cell(k):
            return f"{_rate(med[k])} ({_rate(spr[k][0])}–{_rate(spr[k][1])})" if k in med else "n/a"

        base = [k for k in med if k.startswith("workers=")]
        best = f["best_grid"]
        lines.append(" | ".join([
            f"| {c['label']}", str(f["rounds"]), cell("placer's plan"), _plan_cfg(c["plan"]["config"]),
            f"{_rate(c['plan']['predicted_samples_per_s'])} ({f['predicted_over_measured']:.2f}×)",
            f"{cell(best)}: {best.split(': ', 1)[1]}" if best else "n/a",
            f"{f['plan_over_best_grid']:.2f}×" if f["plan_over_best_grid"] else "n/a",
            *[x for k in base for x in (cell(k), f"{f['vs_plan'][k]:.2f}×" if f["vs_plan"][k] else "n/a")]]) + " |")
    return lines


def summary_table(cases: list[dict], cores: int) -> list[str]:
    lines = ["| pipeline | workers=0 | workers=%d, pin_memory | rule of thumb | best of grid | best grid config "
             "| placer's plan | hand-written loop | executor, workers=0, interleaved with it "
             "| overhead (hand / executor) |" % cores,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        b = c["baselines"]
        rule = next(((k, v) for k, v in b.items() if k.startswith("rule")), None)
        best = best_cell(c)
        o = c["overhead"]
        lines.append(" | ".join([
            f"| {c['label']}", _rate(b["workers=0"]["samples_per_s"]),
            _rate(b[f"workers={cores}, pin_memory"]["samples_per_s"]),
            f"{_rate(rule[1]['samples_per_s'])} {rule[0][len('rule of thumb '):]}" if rule else "n/a (no accelerator)",
            _rate(best and best["samples_per_s"]), _cfg(best) if best else "n/a",
            _plan_cell(c, best), _rate(o["hand"]), _rate(o["executor"]),
            f"{o['ratio']:.2f}×" if o["ratio"] else "n/a"]) + " |")
    return lines


def _plan_cell(case: dict, best: dict | None) -> str:
    plan = case.get("plan")
    if not plan or not plan.get("samples_per_s"):
        return "n/a"
    of_best = f", {plan['samples_per_s'] / best['samples_per_s']:.2f}× best" if best else ""
    return (f"{_rate(plan['samples_per_s'])} (predicted {_rate(plan['predicted_samples_per_s'])}{of_best}"
            f"{'' if plan.get('same_digest_as_sequential') else ', DIFFERS'})")


def grid_table(case: dict) -> list[str]:
    ref = case["baselines"]["workers=0"]["samples_per_s"] or 0
    lines = [f"### {case['label']} — {case['size']:,} samples per epoch, {case['params']}, "
             f"{case['max_batches']} batches per run; stream "
             f"{' → '.join(case['stream'])}", "",
             f"| placement | workers | kind | prefetch | cache | torch threads | samples/s (best of {REPS}) "
             "| × workers=0 | step idle | digest |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in case["grid"]:
        rate = c.get("samples_per_s")
        digest = "same" if c.get("same_digest_as_sequential") else (c.get("error") or "DIFFERS")
        if c.get("same_digest_as_sequential") and not c.get("stable_digest", True):
            digest = "same (varies between repeats)"
        lines.append(f"| {c['placement']} | {c['workers']} | {c['worker_kind']} | {c['prefetch']} | "
                     f"{c['cache'] or 'none'} | {c.get('torch_threads') or 'torch default'} | {_rate(rate)} | "
                     f"{(rate / ref) if rate and ref else float('nan'):.2f} | "
                     f"{c.get('idle', float('nan')):.2f} | {digest} |")
    return lines + [""]


def write(cases: list[dict], info: dict, out: Path, notes: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "reps": REPS,
                                                    "worker_kinds": WORKER_KINDS, "notes": notes,
                                                    "cases": cases}, indent=1, default=str))
    gpu = info["gpu"] or "no GPU"
    load = info.get("load", {})
    md = ["# Stream benchmark", "",
          f"machine: {info['cpu']}, {info['cores']} cores, {gpu}; host {info['host']}; Python {info['python']}, "
          f"torch {info['torch']}, numpy {info['numpy']}; {info['date']}", "",
          f"load average (1, 5, 15 min) at the start {load.get('start')}, at the end {load.get('end')}: the "
          "machine is shared with other work (test runs, other benchmarks) while this runs, so single runs "
          "vary by 2× or more; compare the interleaved medians below, not single cells.", "",
          "## Final comparison (interleaved)", "",
          f"placer's plan, the grid's {FINAL_TOP} best configurations (by their best-of-{REPS} cell) and the "
          f"baselines, run again in turn, {MIN_ROUNDS} to {FINAL_ROUNDS} rounds (as each case's time allowed: the "
          "rounds column); medians, with the lowest and highest run.", "",
          *final_table(cases), "",
          "## Grid and baselines (best of each cell's repeats)", "",
          "Steady-state samples/s (`StreamStats.samples_per_s`), each run reading the whole stream (batches "
          f"per run in each grid's title), best of {REPS} runs.", "",
          *summary_table(cases, info["cores"]), "", *[f"- {n}" for n in notes], "", "## Grid", ""]
    for c in cases:
        md += grid_table(c)
    out.with_suffix(".md").write_text("\n".join(md))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="labels or module names, comma-separated")
    ap.add_argument("--simulated", action="store_true", help="also place on gpu-sim (a labelled test device)")
    ap.add_argument("--machine", default=socket.gethostname(), help="name in the results' file name")
    ap.add_argument("--time-limit-s", type=float, default=540.0,
                    help="seconds for everything, shared by the cases (each at least 30 s; grid cells past their "
                         "share are skipped, the final comparison runs at least three rounds)")
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch's intra-op threads (default: torch's own); 1 steadies runs on a shared machine")
    ap.add_argument("--scale", type=int, default=1,
                    help="samples per epoch times this for every case: longer runs, steadier medians, more time")
    args = ap.parse_args(argv)
    global SCALE
    SCALE = max(1, args.scale)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    if args.simulated:
        os.environ["PLACER_TEST_DEVICES"] = "1"
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from advisor import machine

    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    labels = [k for k in CASES if k in wanted or CASES[k][0] in wanted]
    accs = accelerators(args.simulated)
    t0 = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    cases = []
    for i, label in enumerate(labels):
        share = max(30.0, (args.time_limit_s - (time.perf_counter() - t0)) / (len(labels) - i))
        cases.append(measure_case(label, accs, args.reps, share))
        print(f"{label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    notes = _notes(accs)
    if args.torch_threads:
        notes.append(f"torch intra-op threads set to {args.torch_threads} (--torch-threads).")
    out = args.out or ROOT / "benchmarks" / "results" / f"stream-{args.machine}"
    info = {**machine(), "load": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
            "seconds": round(time.perf_counter() - t0)}
    write(cases, info, out, notes)
    print(out.with_suffix(".md").read_text())
    return 0


def _notes(accs: list[str]) -> list[str]:
    notes = ["placer's plan: plan_stream with a %g s budget (profile, model, search, verification by short "
             "runs), then measured like every cell; in brackets its predicted samples/s and its ratio to the "
             "grid's best." % PLAN_BUDGET_S,
             "worker kinds measured: " + ", ".join(WORKER_KINDS) + "; process workers too on "
             + ", ".join(sorted(PROCESS_CASES)) + " (each such run starts its worker processes, before the "
             "stream's clock).",
             "torch intra-op threads: each cell with torch's own setting and with 1 (StreamConfig.torch_threads).",
             "overhead: a hand-written loop (the same stage functions, called directly, in a torch DataLoader with "
             "num_workers=0 and batch_size=None, then the step) against the executor with workers=0, interleaved, "
             "3 runs each, both with one torch intra-op thread; above 1× the executor is slower.",
             "cache points: the source (unless it takes batch_info) and each deterministic per-batch stage before "
             "the first random one.",
             "digest: whether the run's outputs digest equals the sequential run's at the same torch intra-op "
             "thread count (same batches, same answer; a training step's float reductions follow the thread "
             "count, and over many steps 1 and 2 threads part beyond the digest's tolerance: "
             "`same_digest_as_default_threads` in the JSON says whether it also equals torch's default); "
             "a cell marked DIFFERS or 'varies between repeats' would be left out of 'best of grid'.",
             f"Every run reads the whole stream (all its epochs; stream_images {24 * SCALE} batches, the others {64 * SCALE}); the steady state leaves out the batches "
             "already read when the first one left the step (filling the queues)."]
    if not accs:
        notes.append("No accelerator here: every placement is all-CPU; the rule of thumb needs a GPU (n/a).")
    if "gpu-sim" in accs:
        notes.append("gpu-sim is the simulated test device (GPU implementations run on the CPU): "
                     "its rows test the machinery and are not GPU results.")
    return notes


if __name__ == "__main__":
    sys.exit(main())
