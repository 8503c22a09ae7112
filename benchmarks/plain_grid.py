"""Plain scripts under an exhaustive grid of loader settings, and given settings scored against its best.

Each script of ``benchmarks/plain/`` is an ordinary PyTorch program (a Dataset with
its work in ``__getitem__``, a DataLoader, a model, an epoch loop) with flags for
its loader settings; its last line of output is JSON with its loop's seconds,
samples/s and a digest of every batch it read. This benchmark runs each script as a
subprocess:

1. **as written** (no loader flags): the reference, which also writes the script's
   data once into a shared folder;
2. **the grid**: every combination of ``num_workers`` 0 to twice the cores, worker
   processes or (where the script has a thread-pool loader) threads, prefetch 1, 2,
   4, 8, persistent workers off and on (processes), torch intra-op threads 1 to the
   cores, the script's ``--cache`` off and on (where it has one) and pinned memory
   (only with a GPU); every configuration repeated (``--repeats``, at least 3),
   round-robin (each round runs every configuration once, in a shuffled order), with
   its median and spread. ``--screen K`` runs every configuration once and only the best K of
   that round for the other rounds (the final comparison then takes its best from those K);
3. **the final comparison**: the grid's best few (by median), the script as written
   and the configurations to score, run again interleaved for ``--final-rounds``
   rounds (more, up to three times as many, where the script's loop is short: until each
   configuration has run ``--final-min-s`` seconds of loop in all); each scored
   configuration's median over the best median of the final
   round (the grid's best is a maximum over many noisy cells, which flatters it,
   so it is re-measured beside the scored ones).

Configurations to score: ``--advise`` adds, for each script that has a
``--placer-advice`` flag, the script run with it in every final round: the drop-in
(``placer.stream.advise_loader``) measures and advises first, then the script's loop runs
with the advice applied as a user would (``advice.loader()``: its settings, its cache, its
thread-pool loader, its step threads), timed by the script's own clock as every other run
(the advice's own time is left out, but its runs have warmed the process up); its claimed
speed-up is compared with the one the same rounds measured against the script as written.
``--advise`` also runs the script with ``--placer-advice`` once before the grid and scores
the settings it recommended written as the script's flags (cache and thread-pool loader
included), each in a new process, as a user who edits the script would run them; where it
kept the user's settings ("keep your settings"), that is the script as written, no flags.
``--pipeline`` does the same for the scripts with a pipeline form
(``benchmarks/plain/pipelines/<script>_pipeline.py``, the script ported to placer): ``placer
advise`` on it once before the grid, at the script's size and epochs within
``--pipeline-budget-s``, then its plan written as the script's flags
(:func:`plain_pipeline.plan_flags`, which says what of the plan no flag expresses) is scored,
and the plan's predicted speed-up over one batch at a time (the script as written) is
compared with the one the final rounds measured. ``--score`` adds any other flags:
``--score "images_train:mine=--num-workers 2 --worker-kind thread --prefetch-factor 4"``.
Every run's digest is checked against the run as written: a setting must not change
the batches a script reads.

``--set judge`` runs the scripts of ``benchmarks/judge/`` instead (twelve scripts of other shapes,
split into a tuning and a judging half: see ``benchmarks/judge/README.md``), with the same conventions.

Results: ``benchmarks/results/plain-<machine>.json`` (every run) and ``.md`` (the
tables; ``judge-<machine>`` with ``--set judge``), naming the machine and its load average at the
start and the end.

Usage
-----
    python benchmarks/plain_grid.py --quick                       # a smoke run: tiny sizes, a few cells
    python benchmarks/plain_grid.py --few-cells --advise --final-rounds 3   # the scripts' own sizes, a few cells
    python benchmarks/plain_grid.py --scripts audio_cache_train --advise
    python benchmarks/plain_grid.py --quick --pipeline --scripts table_train   # the pipeline form's plan
    python benchmarks/plain_grid.py --set judge --quick --scripts memmap_train,hf_map_infer   # judge scripts
    python benchmarks/plain_grid.py --advise --repeats 3 --final-rounds 5   # the full grid: hours on 2 cores
    python benchmarks/plain_grid.py --advise --pipeline --screen 10 --final-rounds 3   # every cell once, 10 repeated
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLAIN = HERE / "plain"
sys.path.insert(0, str(HERE))

from _machine import describe  # noqa: E402
from plain_pipeline import forms, plan_flags  # noqa: E402
from plain_pipeline import advise as advise_pipeline  # noqa: E402

#: name -> the script's file, whether it has a thread-pool loader (--worker-kind thread) and
#: --cache, and the sizes of a --quick run
SCRIPTS = {
    "images_train": dict(thread=True, cache=False, quick=["--size", "96", "--epochs", "2"]),
    "table_train": dict(thread=True, cache=False, quick=["--size", "384", "--epochs", "2"]),
    "text_infer": dict(thread=True, cache=False, quick=["--size", "256", "--epochs", "1"]),
    "audio_cache_train": dict(thread=True, cache=True, quick=["--size", "48", "--epochs", "3"]),
    "mlp_big_train": dict(thread=True, cache=False, quick=["--size", "256", "--epochs", "2"]),
    "numpy_augment_infer": dict(thread=True, cache=False, quick=["--size", "64", "--epochs", "1"]),
}
#: the scripts of ``benchmarks/judge/`` (``--set judge``), as :data:`SCRIPTS`; none has ``--cache``, and the
#: IterableDataset script has no thread-pool loader. benchmarks/judge/README.md names its tuning and judging halves.
JUDGE_SCRIPTS = {
    "imagefolder_train": dict(thread=True, cache=False, quick=["--size", "96", "--epochs", "2"]),
    "tar_shards_train": dict(thread=True, cache=False, quick=["--size", "192", "--epochs", "2"]),
    "memmap_train": dict(thread=True, cache=False, quick=["--size", "256", "--epochs", "2"]),
    "csv_parts_train": dict(thread=True, cache=False, quick=["--size", "1600", "--parts", "8", "--epochs", "2"]),
    "columnar_train": dict(thread=True, cache=False, quick=["--size", "768", "--epochs", "2"]),
    "hf_map_infer": dict(thread=True, cache=False, quick=["--size", "256", "--epochs", "1"]),
    "audio_stft_train": dict(thread=True, cache=False, quick=["--size", "64", "--epochs", "2"]),
    "varsize_pad_train": dict(thread=True, cache=False, quick=["--size", "96", "--epochs", "2"]),
    "lines_iterable_train": dict(thread=False, cache=False, quick=["--size", "1536", "--epochs", "2"]),
    "split_compose_train": dict(thread=True, cache=False, quick=["--size", "320", "--epochs", "2"]),
    "epoch_index_train": dict(thread=True, cache=False, quick=["--size", "128", "--epochs", "2"]),
    "model_bound_infer": dict(thread=True, cache=False, quick=["--size", "128", "--epochs", "1"]),
}
#: ``--set``: the folder of the scripts and their registry
SETS = {"plain": (PLAIN, SCRIPTS), "judge": (HERE / "judge", JUDGE_SCRIPTS)}
PREFETCH = (1, 2, 4, 8)


@dataclass(frozen=True)
class Config:
    """Loader settings of one run, as the scripts' flags."""

    num_workers: int = 0
    worker_kind: str = "process"
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    threads: int | None = None
    cache: bool = False

    def args(self) -> list[str]:
        out = []
        if self.num_workers:
            out += ["--num-workers", str(self.num_workers)]
            if self.worker_kind != "process":
                out += ["--worker-kind", self.worker_kind]
            if self.prefetch_factor is not None:
                out += ["--prefetch-factor", str(self.prefetch_factor)]
            if self.persistent_workers:
                out.append("--persistent-workers")
        if self.pin_memory:
            out.append("--pin-memory")
        if self.threads is not None:
            out += ["--threads", str(self.threads)]
        if self.cache:
            out.append("--cache")
        return out

    def label(self) -> str:
        if not self.num_workers:
            parts = ["0 workers"]
        else:
            kind = "thread" if self.worker_kind == "thread" else "proc"
            parts = [f"{self.num_workers} {kind}", f"prefetch {self.prefetch_factor or 2}"]
            parts += ["persistent"] if self.persistent_workers else []
        parts += ["pinned"] if self.pin_memory else []
        parts += [f"torch threads {self.threads}"] if self.threads is not None else []
        parts += ["cache"] if self.cache else []
        return ", ".join(parts)


def config_from_flags(flags: str) -> Config:
    """A configuration from the scripts' flags, e.g. ``--num-workers 2 --prefetch-factor 4``."""
    ap = argparse.ArgumentParser(prog="--score", add_help=False, exit_on_error=False)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cache", action="store_true")
    a = ap.parse_args(shlex.split(flags))
    return Config(a.num_workers, a.worker_kind, a.prefetch_factor, a.persistent_workers, a.pin_memory,
                  a.threads, a.cache)


def config_from_advice(advice: dict) -> Config:
    """The drop-in's recommended settings (``LoaderSettings.as_dict()``) as the scripts' flags; where the
    advice keeps the user's settings (``change`` false), none: the script as written, which is what a user who
    keeps their settings runs (flags that restate them, e.g. ``--threads 2`` for torch's own two, call what the
    script as written does not)."""
    if advice.get("change") is False and not advice.get("cache"):
        return Config()
    w = int(advice["num_workers"])
    threads = bool(w and (advice.get("worker_threads") or advice.get("worker_kind") == "threads"))
    return Config(num_workers=w, worker_kind="thread" if threads else "process",
                  prefetch_factor=advice.get("prefetch_factor") if w else None,
                  persistent_workers=bool(w and not threads and advice.get("persistent_workers")),
                  pin_memory=bool(advice.get("pin_memory")), threads=advice.get("torch_threads"),
                  cache=bool(advice.get("cache")))


def grid(script: str, cores: int, gpu: bool) -> list[Config]:
    """Every configuration of the exhaustive grid for one script."""
    spec = SCRIPTS[script]
    loaders: list[dict] = [dict(num_workers=0)]
    for w in range(1, 2 * cores + 1):
        for pf in PREFETCH:
            loaders += [dict(num_workers=w, prefetch_factor=pf, persistent_workers=p) for p in (False, True)]
            if spec["thread"]:
                loaders.append(dict(num_workers=w, worker_kind="thread", prefetch_factor=pf))
    out = []
    for loader, threads, cache, pin in itertools.product(
            loaders, range(1, cores + 1), (False, True) if spec["cache"] else (False,),
            (False, True) if gpu else (False,)):
        out.append(Config(**loader, threads=threads, cache=cache, pin_memory=pin))
    return out


def quick_grid(script: str, threads: tuple[int, ...] = (1,)) -> list[Config]:
    """A few cells for a smoke run: no workers, two processes, two threads, the cache; each at every
    count of torch intra-op threads in ``threads``."""
    spec = SCRIPTS[script]
    out = []
    for n in threads:
        out += [Config(threads=n), Config(num_workers=2, prefetch_factor=2, threads=n)]
        if spec["thread"]:
            out.append(Config(num_workers=2, worker_kind="thread", prefetch_factor=2, threads=n))
        if spec["cache"]:
            out.append(Config(threads=n, cache=True))
    return out


# -- running -------------------------------------------------------------------------------
@dataclass
class Run:
    """One run of a script: what it printed last (JSON) or why it failed."""

    script: str
    label: str
    args: list[str]
    phase: str
    wall_s: float
    ok: bool
    seconds: float | None = None
    samples_per_s: float | None = None
    digest: str | None = None
    result: float | None = None
    advice: dict | None = None
    error: str | None = None
    output: str | None = field(default=None, repr=False)
    #: the 1-minute load average when the run started
    load: float | None = None


def run_script(script: str, config: Config | None, *, base: list[str], phase: str, timeout_s: float,
               extra: list[str] = (), label: str | None = None, keep_output: bool = False,
               prefix: list[str] = ()) -> Run:
    """One run of ``script`` with ``config``'s flags; ``prefix``: a command the script runs under (e.g.
    ``python -m placer tune --apply FILE --``)."""
    args = [*(config.args() if config else []), *extra]
    cmd = [*prefix, sys.executable, str(PLAIN / f"{script}.py"), *base, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    label = label or (config.label() if config else "as written")
    load = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return Run(script, label, args, phase, time.perf_counter() - t0, False, error=f"timed out after {timeout_s} s",
                   load=load)
    wall = time.perf_counter() - t0
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return Run(script, label, args, phase, wall, False, error=(p.stderr or p.stdout)[-2000:],
                   output=p.stdout[-8000:], load=load)
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError:
        return Run(script, label, args, phase, wall, False, error=f"last line is not JSON: {lines[-1][:200]}",
                   load=load)
    return Run(script, label, args, phase, wall, True, seconds=out["seconds"], samples_per_s=out["samples_per_s"],
               digest=out["digest"], result=out.get("result"), advice=out.get("advice"),
               output=p.stdout[-8000:] if keep_output else None, load=load)


def stats(runs: list[Run]) -> dict:
    rates = [r.samples_per_s for r in runs if r.ok]
    if not rates:
        return {"runs": len(runs), "ok": 0, "median": None, "min": None, "max": None, "spread": None}
    med = statistics.median(rates)
    return {"runs": len(runs), "ok": len(rates), "median": round(med, 2), "min": round(min(rates), 2),
            "max": round(max(rates), 2), "spread": round((max(rates) - min(rates)) / med, 3)}


#: the final comparison's entry for the drop-in: the script with ``--placer-advice`` (advice applied)
DROPIN = "drop-in: advice applied"


def interleaved(script: str, configs: dict[str, Config | None], rounds: int, *, base, phase, timeout_s, seed,
                log, extras: dict[str, list[str]] | None = None,
                prefixes: dict[str, list[str]] | None = None) -> dict[str, list[Run]]:
    """``rounds`` rounds, each running every configuration once in a shuffled order.

    ``extras``: more flags for some entries (e.g. ``--placer-advice``); their output is kept.
    ``prefixes``: a command some entries run the script under (``placer tune --apply FILE --``).
    Entries that run the script with the same flags (a choice that is one of the grid's best, or
    that keeps the script as written) are one configuration: run once a round, the run counted
    for each (run twice, the same flags measured up to 15 % apart within one comparison).
    """
    extras, prefixes = extras or {}, prefixes or {}
    runs: dict[str, list[Run]] = {k: [] for k in configs}
    same: dict[tuple, list[str]] = {}
    for k, c in configs.items():
        same.setdefault((tuple(c.args()) if c is not None else None, tuple(extras.get(k, [])),
                         tuple(prefixes.get(k, []))), []).append(k)
    rng = random.Random(seed)
    for r in range(rounds):
        order = list(same.values())
        rng.shuffle(order)
        for keys in order:
            k = keys[0]
            run = run_script(script, configs[k], base=base, phase=phase, timeout_s=timeout_s, label=k,
                             extra=extras.get(k, []), keep_output=k in extras, prefix=prefixes.get(k, []))
            for each in keys:
                runs[each].append(run)
            log(f"  {phase} round {r + 1}/{rounds} {' = '.join(keys)}: "
                + (f"{run.samples_per_s:,.1f} samples/s" if run.ok else f"FAILED {run.error[-200:]!r}"))
    return runs


def final_rounds(rounds: int, loop_s: float | None, min_s: float) -> int:
    """Rounds of the final comparison: at least ``rounds``, and more (up to three times as many) until
    each configuration's runs add up to ``min_s`` seconds of the script's loop. ``loop_s``: the shortest
    loop among the configurations compared. A loop of half a second swings by a third from run to run on
    a shared 2-core machine (text_infer as written: 7,141-10,251 samples/s in 12 runs in a row); a median
    of four such runs does not settle a 20 % claim."""
    if not loop_s or min_s <= 0:
        return rounds
    return max(rounds, min(3 * rounds, math.ceil(min_s / loop_s)))


def bench_script(script: str, a: argparse.Namespace, data_dir: Path, log) -> dict:
    cores = os.cpu_count() or 1
    base = ["--data-dir", str(data_dir), *(SCRIPTS[script]["quick"] if a.quick else [])]
    log(f"{script}: as written")
    ref = run_script(script, None, base=base, phase="reference", timeout_s=a.timeout_s, keep_output=True)
    if not ref.ok:
        log(f"  FAILED: {ref.error}")
        return {"script": script, "reference": asdict(ref), "error": "the script as written failed"}
    scored: dict[str, Config | None] = {}
    extras: dict[str, list[str]] = {}
    settings_key: str | None = None
    before: Run | None = None
    if a.advise and "--placer-advice" in (PLAIN / f"{script}.py").read_text():
        scored[DROPIN], extras[DROPIN] = None, ["--placer-advice"]
        # and its settings written as the script's flags, as a user who edits the script runs them (a new
        # process: nothing warmed up by the advice's own runs)
        log(f"{script}: the drop-in's settings (--placer-advice once)")
        before = run_script(script, None, base=base, phase="advice", timeout_s=a.timeout_s,
                            extra=["--placer-advice"], label="drop-in run", keep_output=True)
        if before.ok and before.advice and before.advice.get("cache") and not SCRIPTS[script]["cache"]:
            log("  its settings include a cache inside the dataset, which this script has no flag for: "
                "scored as applied only")
        elif before.ok and before.advice:
            settings_key = "drop-in settings: " + config_from_advice(before.advice).label()
            scored[settings_key] = config_from_advice(before.advice)
        else:
            log(f"  the drop-in run FAILED: {before.error}")
    pipe, pipe_key = (pipeline_choice(script, base, a, log) if a.pipeline and script in forms() else (None, None))
    if pipe_key:
        scored[pipe_key] = config_from_flags(shlex.join(pipe["flags"]))
    for spec in a.score:
        name, _, rest = spec.partition(":")
        if name == script:
            label, _, flags = rest.partition("=")
            scored[f"{label}: {config_from_flags(flags).label()}"] = config_from_flags(flags)

    if a.quick or a.few_cells:  # --few-cells: at one torch thread and at the cores (torch's own count)
        cells = quick_grid(script, (1,) if a.quick or cores == 1 else (1, cores))
    else:
        cells = grid(script, cores, a.gpu)
    screen = getattr(a, "screen", None)
    if screen and screen < len(cells):
        # every configuration once, then the best `screen` of that round to `repeats` rounds in all
        log(f"{script}: grid of {len(cells)} configurations x 1 round, the best {screen} x {a.repeats - 1} more")
        grid_runs = interleaved(script, {c.label(): c for c in cells}, 1, base=base, phase="grid",
                                timeout_s=a.timeout_s, seed=1, log=log)
        first = sorted((k for k, v in grid_runs.items() if v[0].ok), key=lambda k: -grid_runs[k][0].samples_per_s)
        by_label = {c.label(): c for c in cells}
        more = interleaved(script, {k: by_label[k] for k in first[:screen]}, a.repeats - 1, base=base,
                           phase="grid", timeout_s=a.timeout_s, seed=3, log=log)
        for k, v in more.items():
            grid_runs[k] += v
        repeated = set(first[:screen])
    else:
        log(f"{script}: grid of {len(cells)} configurations x {a.repeats} rounds")
        grid_runs = interleaved(script, {c.label(): c for c in cells}, a.repeats, base=base, phase="grid",
                                timeout_s=a.timeout_s, seed=1, log=log)
        repeated = set(grid_runs)
    table = {k: stats(v) for k, v in grid_runs.items()}
    # the final comparison takes its best from the repeated configurations (a single run is not a median)
    ranked = sorted((k for k in table if table[k]["median"] is not None and k in repeated),
                    key=lambda k: -table[k]["median"])
    by_label = {c.label(): c for c in cells}
    final = {"as written": Config(), **{f"grid #{i + 1}: {k}": by_label[k] for i, k in enumerate(ranked[:a.top])},
             **scored}
    loop_s = [r.seconds for k in ranked[:a.top] for r in grid_runs[k] if r.ok and r.seconds] + \
        ([ref.seconds] if ref.seconds else [])
    rounds = final_rounds(a.final_rounds, min(loop_s) if loop_s else None, getattr(a, "final_min_s", 0.0))
    log(f"{script}: final comparison of {len(final)} configurations x {rounds} rounds")
    final_runs = interleaved(script, final, rounds, base=base, phase="final", timeout_s=a.timeout_s,
                             seed=2, log=log, extras=extras)
    final_table = {k: stats(v) for k, v in final_runs.items()}
    best = max((s["median"] for k, s in final_table.items() if k.startswith("grid #") and s["median"]), default=None)
    scores = {k: (round(final_table[k]["median"] / best, 3) if best and final_table[k]["median"] else None)
              for k in final_table}
    every = [r for v in [*grid_runs.values(), *final_runs.values()] for r in v] + ([before] if before else [])
    dropin = final_runs.get(DROPIN, [])
    claim = claim_check(dropin, final_runs["as written"]) if dropin else None
    claim_settings = claim_check(final_runs[settings_key], final_runs["as written"],
                                 claims=[before.advice["claimed_speedup"]]) if settings_key else None
    claim_pipeline = model_pipeline = None
    if pipe_key and pipe.get("claimed_speedup"):
        claim_pipeline = claim_check(final_runs[pipe_key], final_runs["as written"], claims=[pipe["claimed_speedup"]])
    if pipe_key and pipe.get("predicted_speedup"):
        model_pipeline = claim_check(final_runs[pipe_key], final_runs["as written"],
                                     claims=[pipe["predicted_speedup"]])
    advice_runs = [r for r in dropin if r.output]
    mismatched = sorted({r.label for r in every if r.ok and r.digest != ref.digest})
    failed = sorted({r.label for r in every if not r.ok})
    return {"script": script, "reference": asdict(ref), "grid": table, "final": final_table, "final_rounds": rounds,
            "score_vs_grid_best": scores,
            "scored": {k: (asdict(v) if v is not None else {"flags": extras.get(k)}) for k, v in scored.items()},
            "advice": [{"round": i + 1, **(r.advice or {}),
                        "settings": config_from_advice(r.advice).label() if r.advice else None}
                       for i, r in enumerate(dropin)],
            "digest_mismatch": mismatched, "failed": failed,
            "advice_output": [r.output for r in advice_runs], "claimed_vs_measured": claim,
            "claimed_vs_measured_settings": claim_settings,
            "pipeline": pipe, "claimed_vs_measured_pipeline": claim_pipeline,
            "predicted_vs_measured_pipeline": model_pipeline,
            "advice_before": ({**before.advice, "settings": settings_key, "output": before.output}
                              if before and before.ok and before.advice else None),
            "runs": [asdict(r) | {"output": None} for r in every]}


def pipeline_choice(script: str, base: list[str], a: argparse.Namespace, log) -> tuple[dict, str | None]:
    """``placer advise`` on the script's pipeline form, once; its plan as the script's flags, and the
    final comparison's key for them (None when the advice failed)."""
    log(f"{script}: the pipeline form's plan (placer advise, {a.pipeline_budget_s:g} s budget)")
    pipe = advise_pipeline(script, base, budget_s=a.pipeline_budget_s, timeout_s=a.timeout_s)
    if "error" in pipe:
        log(f"  placer advise FAILED: {pipe['error'][-500:]}")
        return pipe, None
    flags, notes = plan_flags(pipe["settings"], pipe["source"], pipe["step"], cache_flag=SCRIPTS[script]["cache"],
                              thread_flag=SCRIPTS[script]["thread"])
    pipe |= {"flags": flags, "notes": notes, "label": "pipeline form: " + config_from_flags(shlex.join(flags)).label()}
    log(f"  plan {pipe['settings']}, claimed {pipe['claimed_speedup'] or 0:.2f}x over one batch at a time "
        f"(predicted {pipe['predicted_speedup'] or 0:.2f}x); as flags: "
        f"{shlex.join(flags) or '(none)'}" + "".join(f"; {n}" for n in notes))
    return pipe, pipe["label"]


#: the advice's claimed speed-up may differ from the script's measured one by this much
CLAIM_TOLERANCE = 0.20


def claim_check(dropin: list[Run], written: list[Run], claims: list[float] | None = None) -> dict | None:
    """The drop-in's claimed speed-up against the one the script measured: its loop with the advice
    applied over the script as written, both of the final comparison (interleaved, so each ratio is
    taken under one load). ``claimed``: the median of the claims of its runs (each run advises
    anew; ``claims`` given: those); ``ratio``: claimed over measured (medians of the runs)."""
    claims = claims or [r.advice["claimed_speedup"] for r in dropin if r.ok and r.advice]
    a = [r.samples_per_s for r in dropin if r.ok]
    b = [r.samples_per_s for r in written if r.ok]
    if not claims or not a or not b:
        return None
    claimed = round(statistics.median(claims), 3)
    measured = statistics.median(a) / statistics.median(b)
    pairs = [x.samples_per_s / y.samples_per_s for x, y in zip(dropin, written) if x.ok and y.ok]
    loads = [r.load for r in [*dropin, *written] if r.load is not None]
    return {"claimed": claimed, "measured": round(measured, 3), "ratio": round(claimed / measured, 3),
            "within": abs(claimed / measured - 1) <= CLAIM_TOLERANCE, "per_round": [round(p, 3) for p in pairs],
            "claims": claims,
            "load": [min(loads), max(loads)] if loads else None}


# -- writing -------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


#: the claim checks of a script's result: its key, and what was scored
CLAIMS = (("claimed_vs_measured", "advice applied"), ("claimed_vs_measured_settings", "its settings as flags"),
          ("claimed_vs_measured_pipeline", "pipeline form's plan as flags"))
#: the model's predicted speed-up of the pipeline form's plan, which its report does not state as a speed-up
#: (its options table shows the measured one): its accuracy, shown apart from the claims
MODEL_ROWS = (("predicted_vs_measured_pipeline", "pipeline form's plan as flags, the model's predicted speed-up"),)


def pipeline_lines(pipe: dict | None) -> list[str]:
    """The pipeline form's plan, its speed-ups as placer advise measured them, and its flags."""
    if not pipe:
        return []
    if "error" in pipe:
        return ["", f"The pipeline form's advice FAILED: `{pipe['error'][-300:]}`"]
    settings = {k: v for k, v in pipe["settings"].items() if v not in ({}, None)}
    command = shlex.join(["placer", *pipe["command"][3:]]).replace(f"{ROOT}{os.sep}", "")
    out = ["", f"The pipeline form's plan (`{command}`): `{settings}`; "
           f"predicted {_rate(pipe['predicted_samples_per_s'])} samples/s, measured by placer advise "
           f"{_rate(pipe['measured_samples_per_s'])}; over one batch at a time predicted "
           f"{pipe.get('predicted_speedup', pipe['claimed_speedup']) or 0:.2f}x, measured "
           f"{pipe['measured_speedup'] or 0:.2f}x. "
           f"As the script's flags: `{shlex.join(pipe['flags']) or '(none)'}`"]
    out += [f"- not expressed by the flags: {n}" for n in pipe["notes"]]
    return out


def markdown(doc: dict) -> str:
    lines = [f"# Plain scripts: loader grid and scored settings ({doc['mode']})", "", doc["machine"], "",
             f"Load average at the start {doc['load_start']}, at the end {doc['load_end']}; "
             f"{doc['seconds']:.0f} s in all. Command: `{doc['command']}`.", "",
             "Samples/s of each script's own loop (its epochs, worker start-up included), median of the "
             "runs with the lowest and highest; spread = (max - min) / median.", ""]
    claims = [(s["script"], what, s[key]) for s in doc["scripts"] for key, what in CLAIMS if s.get(key)]
    if claims:
        lines += ["The claimed speed-up against the script's own, measured in the final comparison (interleaved, "
                  "over the script as written): *advice applied* runs the script with --placer-advice (the "
                  "drop-in advises anew each run, then its loop runs with advice.loader() and the step threads it "
                  "recommends, after the advice's runs warmed the process up; it claims its whole-run "
                  "prediction); *its settings as flags* runs, in a new process, the settings of one drop-in run "
                  "before the grid; *pipeline form's plan as flags* runs the plan `placer advise` made for the "
                  "script's pipeline form before the grid, written as the script's flags (it claims the speed-up "
                  "its report states: the plan's over one batch at a time, placer advise's `num_workers=0` "
                  "option, as placer advise measured the two in its interleaved runs; the model's predicted "
                  "speed-up where it ran neither; the model's prediction is set against the script below the "
                  "table):", "",
                  "| script | scored | claimed | measured | claimed / measured | within 20 % | load |",
                  "|---|---|---|---|---|---|---|"]
        for name, what, c in claims:
            lines.append(f"| {name} | {what} | {c['claimed']:.2f}x | {c['measured']:.2f}x | {c['ratio']:.2f} | "
                         f"{'yes' if c['within'] else 'no'} | {c['load']} |")
        lines.append("")
    model = [(s["script"], what, s[key]) for s in doc["scripts"] for key, what in MODEL_ROWS if s.get(key)]
    if model:
        lines += ["The model's predicted speed-up of the pipeline form's plan over one batch at a time (in the JSON "
                  "as `plan_speedup_predicted`; the report states the measured one), against the script's:", "",
                  "| script | predicted | measured | predicted / measured |", "|---|---|---|---|"]
        lines += [f"| {name} | {c['claimed']:.2f}x | {c['measured']:.2f}x | {c['ratio']:.2f} |" for name, _, c in model]
        lines.append("")
    for s in doc["scripts"]:
        lines += [f"## {s['script']}", ""]
        if "error" in s:
            lines += [f"FAILED as written: `{(s['reference'].get('error') or '')[-300:]}`", ""]
            continue
        ranked = sorted((k for k in s["grid"] if s["grid"][k]["median"]), key=lambda k: -s["grid"][k]["median"])
        lines += [f"Grid: {len(s['grid'])} configurations; the best {min(10, len(ranked))}:", "",
                  "| configuration | median | min–max | spread | runs |", "|---|---|---|---|---|"]
        for k in ranked[:10]:
            g = s["grid"][k]
            lines.append(f"| {k} | {_rate(g['median'])} | {_rate(g['min'])}–{_rate(g['max'])} | {g['spread']} "
                         f"| {g['ok']}/{g['runs']} |")
        lines += ["", f"Final comparison ({s.get('final_rounds', '?')} rounds, "
                  "interleaved; rows with the same flags are one configuration, run once a round):", "",
                  "| configuration | median | min–max | ÷ grid's best | runs |", "|---|---|---|---|---|"]
        for k, g in sorted(s["final"].items(), key=lambda kv: -(kv[1]["median"] or 0)):
            lines.append(f"| {k} | {_rate(g['median'])} | {_rate(g['min'])}–{_rate(g['max'])} | "
                         f"{s['score_vs_grid_best'].get(k)} | {g['ok']}/{g['runs']} |")
        for key, what in (*CLAIMS, *MODEL_ROWS):
            c = s.get(key)
            if not c:
                continue
            who = ("placer advise's model predicted" if key.startswith("predicted") else
                   "placer advise claimed" if "pipeline" in key else "the drop-in claimed")
            lines += ["", f"{what}: {who} {c['claimed']:.2f}x (its runs: "
                      f"{', '.join(f'{x:.2f}x' for x in c.get('claims', []))}); the script measured "
                      f"{c['measured']:.2f}x "
                      f"(rounds: {', '.join(f'{p:.2f}x' for p in c['per_round'])}; load {c['load']}): "
                      f"claimed / measured {c['ratio']:.2f}, "
                      + ("within" if c["within"] else "NOT within") + f" {CLAIM_TOLERANCE:.0%}"]
        lines += ["", f"Digest equal to the run as written: "
                  + ("every run" if not s["digest_mismatch"] else "NOT for " + "; ".join(s["digest_mismatch"]))]
        if s["failed"]:
            lines.append(f"Failed: {'; '.join(s['failed'])}")
        if s.get("advice"):
            lines += ["", "The drop-in's advice in each final round (it advises anew every run):", ""]
            lines += [f"- round {d['round']}: {d['settings'] or 'FAILED'}"
                      + (f", claimed {d['claimed_speedup']:.2f}x" if d.get("claimed_speedup") else "")
                for d in s["advice"]]
        lines += pipeline_lines(s.get("pipeline"))
        for out in s["advice_output"][:1]:
            if out:
                text = "\n".join(line for line in out.splitlines() if not line.startswith("{"))
                lines += ["", "The drop-in's advice as printed:", "", "```", text.strip(), "```"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="plain",
                    help="which scripts: benchmarks/plain/ (the default) or benchmarks/judge/")
    ap.add_argument("--scripts", default=None, help="comma-separated names (default: all of the --set)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, a few cells, 2 rounds")
    ap.add_argument("--few-cells", action="store_true",
                    help="the --quick grid's few cells, at 1 torch thread and at the cores, at the scripts' own "
                         "sizes (runs long enough that start-up does not decide; not the exhaustive grid)")
    ap.add_argument("--repeats", type=int, default=None, help="grid rounds (default 3; 2 with --quick)")
    ap.add_argument("--final-rounds", type=int, default=None, help="final rounds (default 5; 2 with --quick)")
    ap.add_argument("--final-min-s", type=float, default=None,
                    help="more final rounds (up to 3x --final-rounds) until each configuration has run its loop "
                         "this many seconds in all (default 8; 0 with --quick)")
    ap.add_argument("--screen", type=int, default=None, metavar="K",
                    help="run every grid configuration once, then only the best K of that round for the other "
                         "--repeats rounds (the full grid in a third of the time)")
    ap.add_argument("--top", type=int, default=3, help="grid configurations in the final comparison")
    ap.add_argument("--advise", action="store_true", help="score the drop-in's choice (--placer-advice)")
    ap.add_argument("--pipeline", action="store_true",
                    help="score the plan of each script's pipeline form (benchmarks/plain/pipelines) as its flags")
    ap.add_argument("--pipeline-budget-s", type=float, default=None,
                    help="placer advise's budget for a pipeline form (default 30 s; 8 with --quick)")
    ap.add_argument("--score", action="append", default=[], metavar="SCRIPT:LABEL=FLAGS",
                    help="score these flags on SCRIPT, e.g. 'images_train:pipeline=--num-workers 2'")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    ap.add_argument("--gpu", action="store_true", help="add pin_memory to the grid (default: when CUDA is there)")
    ap.add_argument("--machine", default="vm", help="names the result files")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    global PLAIN, SCRIPTS
    PLAIN, SCRIPTS = SETS[a.set]
    a.scripts = a.scripts or ",".join(SCRIPTS)
    a.repeats = a.repeats or (2 if a.quick else 3)
    a.final_rounds = a.final_rounds or (2 if a.quick else 5)
    a.final_min_s = (0.0 if a.quick else 8.0) if a.final_min_s is None else a.final_min_s
    a.pipeline_budget_s = a.pipeline_budget_s or (8.0 if a.quick else 30.0)
    if not a.quick and (a.repeats < 3 or a.final_rounds < 3):
        ap.error("a recorded grid needs --repeats and --final-rounds of at least 3 (or --quick)")
    names = [s.strip() for s in a.scripts.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        ap.error(f"unknown script(s) {unknown}: choose from {', '.join(SCRIPTS)}")
    try:
        import torch
        a.gpu = a.gpu or torch.cuda.is_available()
    except ImportError:
        pass

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.screen is not None and a.screen < a.top:
        ap.error(f"--screen {a.screen} must keep at least --top {a.top} configurations")
    mode = ("quick" if a.quick else "few cells" if a.few_cells
            else f"full, screened: every configuration once, the best {a.screen} to {a.repeats} rounds"
            if a.screen else "full")
    stem = f"{a.set}-{a.machine}" + ("-quick" if a.quick else "-few-cells" if a.few_cells
                                   else "-screened" if a.screen else "")
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="plain_grid_") as data:
        for n in names:
            results.append(bench_script(n, a, Path(data), log))
            # after every script, so that a long run keeps what it measured
            doc = {"machine": describe(), "mode": mode, "load_start": load_start,
                   "load_end": [round(x, 2) for x in os.getloadavg()],
                   "seconds": round(time.perf_counter() - t0, 1),
                   "command": shlex.join(["python", "benchmarks/plain_grid.py", *sys.argv[1:]]),
                   "settings": {"repeats": a.repeats, "final_rounds": a.final_rounds,
                                "final_min_s": a.final_min_s, "top": a.top,
                                "screen": a.screen,
                                "cores": os.cpu_count()},
                   "scripts": results}
            _write(out / f"{stem}.json", json.dumps(doc, indent=1))
            _write(out / f"{stem}.md", markdown(doc))
    log(f"wrote {out / stem}.json and .md")


if __name__ == "__main__":
    main()
