"""Stream throughput: baselines, an exhaustive grid of stream settings, and the executor's overhead.

For each stream pipeline of the gallery (``stream_images`` with numpy and with
pure-Python augmentation, ``stream_tabular``, ``stream_inference``,
``stream_cache``) this measures steady-state samples per second
(``StreamStats.samples_per_s``: samples after the first batch over the time from
its end to the last batch's) on this machine, with a bounded number of batches per
run (:data:`CASES`), every run repeated ``REPS`` times and the best kept (other processes may
share the machine), for:

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
grid cell and compared with the grid's best. On a machine without a GPU the placement is all-CPU; with
``--simulated`` the grid and the rule of thumb also run on ``gpu-sim``, the
labelled simulated test device (GPU implementations on the CPU), never a GPU.

Results go to ``benchmarks/results/stream-<machine>.json`` (every run) and ``.md``
(the tables), with the machine they ran on.

Usage
-----
    python benchmarks/stream.py                         # this machine, about 5-8 minutes on 2 cores
    python benchmarks/stream.py --cases stream_cache --time-limit-s 120
    python benchmarks/stream.py --simulated --machine vm-simulated
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
#: label -> (pipeline module, size, build parameters, batches per run): several epochs where it matters
CASES = {
    "stream_images (numpy)": ("stream_images", 128, {"batch": 32, "epochs": 4, "augment": "numpy"}, 16),
    "stream_images (python)": ("stream_images", 128, {"batch": 32, "epochs": 4, "augment": "python"}, 16),
    "stream_tabular": ("stream_tabular", 2048, {"batch": 256, "epochs": 2}, 16),
    "stream_inference": ("stream_inference", 16384, {"batch": 256, "epochs": 1}, 64),
    "stream_cache": ("stream_cache", 256, {"batch": 64, "epochs": 4, "passes": 12}, 16),
}
WORKERS = (1, 2, 4)
#: worker kinds of the grid; a kind the executor gains is one more entry here
WORKER_KINDS = ["thread"]
PREFETCH = (1, 2, 4)
#: seconds the stream planner may spend on each pipeline (profiling and verification)
PLAN_BUDGET_S = 10.0
REPS = 3


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
    from placer.stream.nodes import takes

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


def grid(p, accs: list[str]) -> list[tuple[str, dict, dict]]:
    """(placement label, placement, StreamConfig fields) for every grid point."""
    out = []
    for (label, pl), w, kind, pf, cache in itertools.product(
            placements(p, accs).items(), WORKERS, WORKER_KINDS, PREFETCH, cache_points(p)):
        batch_stages = stream_of(p)[1:-1]
        out.append((label, pl, {"workers": w, "worker_kind": {m: kind for m in batch_stages},
                                "prefetch": pf, "cache": cache}))
    return out


# -- measuring the executor --------------------------------------------------------------------
def run_executor(p, placement: dict, fields: dict, limit: int) -> dict:
    """One run of at most ``limit`` batches: steady samples/s, the digest, the step's idle share."""
    from placer.executor import execute
    from placer.stream import StreamConfig

    cfg = StreamConfig(max_batches=limit, **fields)
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

    import placer.executor  # noqa: F401 - placer.stream imported first fails on an import cycle
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

    import placer.executor  # noqa: F401 - placer.stream imported first fails on an import cycle
    from placer.stream.nodes import batch_len

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
    """Sequential executor and hand-written loop, interleaved; best of each and their ratio."""
    ex, hand = [], []
    for _ in range(reps):
        ex.append(run_executor(p, {}, {"workers": 0}, limit)["samples_per_s"])
        hand.append(run_hand(p, limit)["samples_per_s"])
    return {"executor": max(ex), "hand": max(hand), "executor_rates": ex, "hand_rates": hand,
            "ratio": max(hand) / max(ex) if max(ex) > 0 else None}


# -- one pipeline ------------------------------------------------------------------------------
def measure_case(label: str, accs: list[str], reps: int, deadline: float) -> dict:
    """Baselines, overhead and the grid of one case (grid points past ``deadline`` are skipped)."""
    import importlib

    module, size, params, max_batches = CASES[label]
    p = importlib.import_module(f"pipelines.{module}").build(size, **params)
    run_executor(p, {}, {"workers": 0}, max_batches)  # warm-up: imports, allocator, first calls
    ref = run_executor(p, {}, {"workers": 0}, max_batches)["digest"]
    cores = os.cpu_count() or 1
    base = {"workers=0": best_of(lambda: run_executor(p, {}, {"workers": 0}, max_batches), reps),
            f"workers={cores}, pin_memory": best_of(
                lambda: run_executor(p, {}, {"workers": cores, "pin_memory": True}, max_batches), reps)}
    for acc in accs:
        pl = placements(p, [acc])[f"rule:{acc}"]
        base[f"rule of thumb ({_device_words(acc)})"] = best_of(
            lambda pl=pl: run_executor(p, pl, {"workers": cores, "pin_memory": True}, max_batches), reps)
    cells = []
    for pl_label, pl, fields in grid(p, accs):
        row = {"placement": pl_label, "workers": fields["workers"],
               "worker_kind": next(iter(fields["worker_kind"].values()), "thread"),
               "prefetch": fields["prefetch"], "cache": fields["cache"]}
        if time.perf_counter() > deadline:
            cells.append({**row, "samples_per_s": None, "error": "not measured: time limit"})
            continue
        cells.append({**row, **best_of(lambda pl=pl, f=fields: run_executor(p, pl, f, max_batches), reps)})
    for rec in [*base.values(), *cells]:
        if rec.get("digest") is not None:
            rec["same_digest_as_sequential"] = rec["digest"] == ref
    plan = measure_plan(p, reps, max_batches, ref)
    return {"label": label, "module": module, "size": size, "params": params, "max_batches": max_batches,
            "stream": stream_of(p), "baselines": base, "overhead": overhead(p, reps, max_batches), "grid": cells,
            "plan": plan}


def measure_plan(p, reps: int, max_batches: int, ref: str) -> dict:
    """placer's plan for the stream (profiled and planned here), and its measured samples/s."""
    from placer.stream.planner import plan_stream, stream_config

    t0 = time.perf_counter()
    sp = plan_stream(p, budget_s=PLAN_BUDGET_S)
    planning_s = time.perf_counter() - t0
    fields = stream_config(sp).model_dump(include={"workers", "stage_workers", "worker_kind", "prefetch",
                                                   "pin_memory", "cache"})
    rec = best_of(lambda: run_executor(p, sp.placement, fields, max_batches), reps)
    return {**rec, "placement": sp.placement, "config": fields, "predicted_samples_per_s": sp.predicted_samples_per_s,
            "bottleneck": sp.bottleneck, "planning_s": planning_s, "same_digest_as_sequential": rec.get("digest") == ref}


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
    return (f"{c['placement']}, {c['workers']} {c['worker_kind']}, prefetch {c['prefetch']}, "
            f"cache {c['cache'] or 'none'}")


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
             "| placement | workers | kind | prefetch | cache | samples/s (best of 3) | × workers=0 | step idle "
             "| digest |", "|---|---|---|---|---|---|---|---|---|"]
    for c in case["grid"]:
        rate = c.get("samples_per_s")
        digest = "same" if c.get("same_digest_as_sequential") else (c.get("error") or "DIFFERS")
        if c.get("same_digest_as_sequential") and not c.get("stable_digest", True):
            digest = "same (varies between repeats)"
        lines.append(f"| {c['placement']} | {c['workers']} | {c['worker_kind']} | {c['prefetch']} | "
                     f"{c['cache'] or 'none'} | {_rate(rate)} | "
                     f"{(rate / ref) if rate and ref else float('nan'):.2f} | "
                     f"{c.get('idle', float('nan')):.2f} | {digest} |")
    return lines + [""]


def write(cases: list[dict], info: dict, out: Path, notes: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "reps": REPS,
                                                    "worker_kinds": WORKER_KINDS, "notes": notes,
                                                    "cases": cases}, indent=1, default=str))
    gpu = info["gpu"] or "no GPU"
    md = ["# Stream benchmark", "",
          f"machine: {info['cpu']}, {info['cores']} cores, {gpu}; host {info['host']}; Python {info['python']}, "
          f"torch {info['torch']}, numpy {info['numpy']}; {info['date']}", "",
          "Steady-state samples/s (`StreamStats.samples_per_s`), a bounded number of batches per run (in each "
          f"grid's title), best of {REPS} runs; other processes may share the machine.", "", "## Summary", "",
          *summary_table(cases, info["cores"]), "", *[f"- {n}" for n in notes], "", "## Grid", ""]
    for c in cases:
        md += grid_table(c)
    out.with_suffix(".md").write_text("\n".join(md))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="labels or module names, comma-separated")
    ap.add_argument("--simulated", action="store_true", help="also place on gpu-sim (a labelled test device)")
    ap.add_argument("--machine", default=socket.gethostname(), help="name in the results' file name")
    ap.add_argument("--time-limit-s", type=float, default=450.0)
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch's intra-op threads (default: torch's own); 1 steadies runs on a shared machine")
    args = ap.parse_args(argv)
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
    cases = []
    for i, label in enumerate(labels):
        share = (args.time_limit_s - (time.perf_counter() - t0)) / (len(labels) - i)
        cases.append(measure_case(label, accs, args.reps, time.perf_counter() + share))
        print(f"{label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    notes = _notes(accs)
    if args.torch_threads:
        notes.append(f"torch intra-op threads set to {args.torch_threads} (--torch-threads).")
    out = args.out or ROOT / "benchmarks" / "results" / f"stream-{args.machine}"
    write(cases, machine(), out, notes)
    print(out.with_suffix(".md").read_text())
    return 0


def _notes(accs: list[str]) -> list[str]:
    notes = ["placer's plan: plan_stream with a %g s budget (profile, model, search, verification by short "
             "runs), then measured like every cell; in brackets its predicted samples/s and its ratio to the "
             "grid's best." % PLAN_BUDGET_S,
             "worker kinds measured: " + ", ".join(WORKER_KINDS) + " (process workers exist; add 'process' to "
             "WORKER_KINDS to measure them: each run then starts its worker processes).",
             "overhead: a hand-written loop (the same stage functions, called directly, in a torch DataLoader with "
             "num_workers=0 and batch_size=None, then the step) against the executor with workers=0, interleaved; "
             "above 1× the executor is slower.",
             "cache points: the source (unless it takes batch_info) and each deterministic per-batch stage before "
             "the first random one.",
             "digest: whether the run's outputs digest equals the sequential run's (same batches, same answer); "
             "a cell marked DIFFERS or 'varies between repeats' would be left out of 'best of grid'.",
             "Runs are short (16 batches; 64 for stream_inference) and the machine is shared: the fastest of "
             "a configuration's repeats is typically 1.5× its slowest here, so compare large ratios only."]
    if not accs:
        notes.append("No accelerator here: every placement is all-CPU; the rule of thumb needs a GPU (n/a).")
    if "gpu-sim" in accs:
        notes.append("gpu-sim is the simulated test device (GPU implementations run on the CPU): "
                     "its rows test the machinery and are not GPU results.")
    return notes


if __name__ == "__main__":
    sys.exit(main())
