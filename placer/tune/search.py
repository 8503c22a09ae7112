"""Tuning a script's loader by running the script: the drop-in's search and decision, over whole-script runs.

May import: placer.tune.{runs,caching}, placer.stream.dropin (its search space and decision rule),
placer.data.stream, numpy.

Every measurement is a run of the user's own command (:func:`placer.tune.runs.run_script`),
stopped by the hook after the same number of counted batches of the loader that holds the
loop; its start-up (imports, data set-up) is measured and reported, never counted as loader
time. The settings tried are the drop-in's first candidates
(:func:`placer.stream.dropin.candidates`), the decision is the drop-in's
(:func:`placer.stream.dropin.decide`: a setting is recommended only when its repeated,
interleaved runs beat the script as written by more than their noise), so ``placer tune``
and ``advise_loader`` answer the same question by the same rule; only the runs differ.

The drop-in's cache inside the Dataset is looked for in one run of the script
(:mod:`placer.tune.caching`); where the search offers one, its rounds are reserved before the
settings are searched, and the chosen settings are then run without it and with it over a window
of at least two epochs and a batch.
"""

from __future__ import annotations

import ast
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placer.data.stream import LoaderSettings
from placer.stream.dropin import (FINALISTS, REPEATS, SETTLE_ROUNDS, Trial, candidates, choose, decide, merged,
                                  paired, wait_noise, within_reach)
from placer.tune import caching
from placer.tune.caching import CacheResult
from placer.tune.runs import ScriptRun, TuneError, run_script

#: counted seconds a trial's loop lasts at least (at the script's own speed): shorter runs measure
#: the machine's hiccups and the workers' start more than the loader
WINDOW_S = 2.0
#: counted batches a trial reads at least, and batches not counted at its start: none, so that a run counts what
#: the script pays for its loader from its first ``iter()`` (the workers' start, an epoch's end), not a steady state
MIN_BATCHES, WARMUP = 8, 0
#: a trial reads past the end of the loader's first epoch (where that is at most this many windows), so that it pays
#: an epoch boundary as the script does (workers restarting without ``persistent_workers``, the script's own work there)
EPOCH_WINDOWS = 4
#: a trial is ended when its loop has taken this many times the script's own time for the same batches
SLOW_CAP = 4.0
#: runs of one interleaved round (the user's, the finalists and the first round's choice), reserved for each
#: round after the first while the first round runs
ROUND_RUNS = 2 + FINALISTS


@dataclass
class Tuned:
    """What ``placer tune`` measured and recommends."""

    command: list[str]
    site: str
    others: list[dict[str, Any]]
    user: Trial
    recommended: Trial
    trials: list[Trial]
    noise: str | None
    startup_s: float
    budget_s: float
    used_s: float
    batches: int
    arguments: dict[str, str]
    runs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    iterable: bool = False
    #: the cache inside the Dataset: found, weighed and decided (None: not looked for)
    cache: CacheResult | None = None
    #: what the search was doing when Ctrl-C stopped it (None: it ran to its end; :mod:`placer.tune.stopping`)
    interrupted: str | None = None
    #: whether the settings were decided by their completed rounds: a search stopped before that recommends
    #: nothing (``recommended`` is then the user's trial, as a place holder the words and the JSON leave out)
    decided: bool = True

    @property
    def change(self) -> bool:
        """Whether other settings are recommended (the cache aside: :attr:`cached`)."""
        return self.recommended is not self.user

    @property
    def cached(self) -> bool:
        """Whether the cache inside the Dataset is recommended."""
        return self.cache is not None and self.cache.recommended

    @property
    def speedup(self) -> float:
        """The recommended settings over the script as written (the cache aside: :attr:`speedup_with_cache`)."""
        return self.recommended.score / max(self.user.score, 1e-12)

    @property
    def speedup_with_cache(self) -> float:
        """The whole recommendation over the script as written: the settings' speed-up times the cache's gain
        over the chosen settings (each measured in its own interleaved rounds); the settings' alone without it."""
        return self.speedup * (self.cache.gain or 1.0) if self.cached else self.speedup

    @property
    def wait_fraction(self) -> float:
        return self.user.fetch_fraction

    @property
    def waits(self) -> bool:
        """Whether the loop waits for data beyond noise (:func:`placer.stream.dropin.wait_noise`)."""
        return self.user.fetch_fraction > wait_noise(self.user)

    def memory(self, t: Trial) -> dict[str, int] | None:
        """The most memory the runs of ``t``'s settings held at their end (bytes: the main process's
        own memory and what its workers add: :mod:`placer.stream.procmem`), and its growth over the counted
        batches."""
        ends = [(r["memory_end"], r["memory_start"]) for r in self.runs
                if r["settings"] == settings_dict(t.settings) and r.get("memory_end") and not r.get("cache")]
        if not ends:
            return None
        end, start = max(ends, key=lambda e: e[0]["main"] + e[0]["workers"])
        out = {"main": end["main"], "workers": end["workers"], "worker_processes": end["processes"]}
        if start:
            out["growth"] = end["main"] + end["workers"] - start["main"] - start["workers"]
        return out

    def round_ratios(self) -> list[float]:
        """The recommendation's samples/s over the script as written's, round by round."""
        return [a / b for a, b in paired(self.recommended, self.user) if b > 0]


def settings_dict(s: LoaderSettings) -> dict[str, Any]:
    """Settings in DataLoader's terms, as the hook applies them and the JSON shows them (``worker_kind`` in the
    drop-in's words: ``main process``, ``processes`` or ``threads``)."""
    return {"num_workers": s.num_workers, "worker_kind": s.worker_kind,
            "prefetch_factor": s.prefetch_factor if s.num_workers else None,
            "persistent_workers": bool(s.persistent_workers and s.num_workers and not s.worker_threads),
            "pin_memory": s.pin_memory, "torch_threads": s.torch_threads,
            **({"in_order": False} if not s.in_order and s.num_workers and not s.worker_threads else {})}


def settings_from(d: dict[str, Any]) -> LoaderSettings:
    """The inverse of :func:`settings_dict` (a saved recommendation; ``thread``, as earlier versions saved it, too)."""
    w = int(d.get("num_workers") or 0)
    return LoaderSettings(num_workers=w, prefetch_factor=d.get("prefetch_factor") if w else None,
                          pin_memory=bool(d.get("pin_memory")), persistent_workers=bool(d.get("persistent_workers")),
                          torch_threads=d.get("torch_threads"), worker_threads=d.get("worker_kind") in ("threads", "thread"),
                          in_order=d.get("in_order", True) is not False)


def user_settings(rec: dict[str, Any]) -> LoaderSettings:
    """The settings the script built its loader with (its arguments as the hook saw them)."""
    args = rec.get("arguments", {})

    def arg(name: str, default: Any) -> Any:
        try:
            return ast.literal_eval(args[name]) if name in args else default
        except (ValueError, SyntaxError):
            return default

    w = int(arg("num_workers", 0) or 0)
    return LoaderSettings(num_workers=w, prefetch_factor=(arg("prefetch_factor", None) or 2) if w else None,
                          pin_memory=bool(arg("pin_memory", False)),
                          persistent_workers=bool(w and arg("persistent_workers", False)),
                          torch_threads=rec.get("torch_threads"))


def trial_of(run: ScriptRun, site: str, settings: LoaderSettings, batches: int | None) -> Trial | None:
    """A drop-in :class:`Trial` from one run of the script (None where no batch was counted)."""
    rec = run.loader(site)
    if rec is None or not rec.get("counted") or rec.get("counted_s", 0) <= 0:
        return None
    rate = rec["counted_samples"] / rec["counted_s"]
    return Trial(settings=settings, samples_per_s=rate, first_batch_s=rec.get("first_batch_s") or 0.0,
                 fetch_fraction=min(1.0, rec["counted_wait_s"] / rec["counted_s"]), batches=rec["counted"],
                 samples=rec["counted_samples"], seconds=rec["counted_s"], started=(run.started,),
                 cut=batches is not None and rec["counted"] < batches)


def refuse_unusable(run: ScriptRun, command: list[str]) -> None:
    """Raise :class:`TuneError` where the script as written gives nothing to tune, saying why."""
    shown = " ".join(command)
    if run.report.get("refused"):
        raise TuneError(run.report["refused"])
    iterated = [r for r in run.loaders if r["batches"]]
    if iterated:
        return
    if run.timed_out:
        raise TuneError(f"`{shown}` read no batch of a DataLoader before the time limit ({run.wall_s:.0f} s): "
                        "raise --budget-s, or make the script reach its loop sooner")
    if run.returncode not in (0, None) or run.report.get("error"):
        error = run.report.get("error") or f"exit status {run.returncode}"
        raise TuneError(f"the script failed before its first batch ({error}); its output ended:\n"
                        f"{run.output_tail}")
    built = run.loaders
    if not built:
        raise TuneError(f"`{shown}` built no torch DataLoader: placer tune tunes a DataLoader's settings "
                        "(for a pipeline of your own, declare it and use placer advise)")
    sites = ", ".join(sorted({r["site"] for r in built}))
    raise TuneError(f"`{shown}` built {len(built)} DataLoader{'s' if len(built) > 1 else ''} ({sites}) but "
                    "iterated none: there is no loop to tune")


def holding_loader(run: ScriptRun) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The loader the loop spends the longest on, and the others (iterated or not)."""
    rec = max(run.loaders, key=lambda r: r["iterated_s"])
    return rec, [r for r in run.loaders if r["site"] != rec["site"]]


class _Clock:
    def __init__(self, budget_s: float):
        self.budget_s, self.t0 = budget_s, time.perf_counter()
        #: seconds kept for runs to come (the cache's rounds) while others are planned
        self.reserved = 0.0

    def used(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.used() - self.reserved


#: what :func:`tune` is doing, in the words a stopped search's result says it in (:attr:`TuneState.step`)
FIRST_RUN, YOUR_RUN, CACHE_SEARCH = "the first run of your script", "the run of your settings", \
    "the search for a cache inside the Dataset"
FIRST_ROUND, ROUNDS, WEIGHING, DONE = "the first run of each setting", "the interleaved rounds", \
    "the rounds that weigh the cache", "the end"


@dataclass
class TuneState:
    """What :func:`tune` has measured so far, filled in as it goes, so that a search stopped part-way
    (Ctrl-C) can still show it (:func:`placer.tune.stopping.stopped`).

    Attributes
    ----------
    step : str
        What the search is doing (``FIRST_RUN`` ... ``DONE``).
    rec : dict or None
        The loader that holds the loop, as the first run saw it (None until that run has ended); ``others``
        the other loaders, ``startup_s`` the script's start-up, ``batches`` the window every run counts.
    as_written : LoaderSettings or None
        The settings the script builds that loader with.
    runner : object or None
        The runs so far (``runs``: each run's record; ``measured``: each setting's runs over the window).
    cache : CacheResult or None
        The cache inside the Dataset, once looked for (its rounds fill in while it is weighed).
    tuned : Tuned or None
        The result once the settings are decided (the cache is weighed after).
    """

    command: list[str] = field(default_factory=list)
    budget_s: float = 0.0
    step: str = FIRST_RUN
    clock: _Clock | None = None
    rec: dict[str, Any] | None = None
    others: list[dict[str, Any]] = field(default_factory=list)
    startup_s: float = 0.0
    batches: int = 0
    as_written: LoaderSettings | None = None
    runner: _Runner | None = None
    cache: CacheResult | None = None
    tuned: Tuned | None = None

    def used_s(self) -> float:
        """Seconds since the search started (0 before)."""
        return self.clock.used() if self.clock is not None else 0.0


def tune(command: list[str], *, budget_s: float = 120.0, window_s: float = WINDOW_S,
         progress: Callable[[str], None] | None = None, cores: int | None = None,
         space: list[LoaderSettings] | None = None, cache: bool = True, allow_reorder: bool = False,
         state: TuneState | None = None) -> Tuned:
    """Run ``command`` as written, then with the drop-in's candidate settings, and decide.

    Parameters
    ----------
    command : list of str
        The user's command (``python train.py ARGS``).
    budget_s : float
        Seconds all the runs may take (about: a run under way is finished).
    window_s : float
        Counted seconds each run's loop lasts at least, at the script's own speed.
    progress : callable, optional
        Called with a line of text as each run ends.
    cores : int, optional
        CPU cores to plan workers for (default: the cores this process may use).
    space : list of LoaderSettings, optional
        The settings to try besides the script's own (default: the drop-in's first candidates,
        :func:`placer.stream.dropin.candidates`).
    cache : bool
        Look for a cache inside the Dataset, and weigh it (:mod:`placer.tune.caching`).
    allow_reorder : bool
        Also run the first round's fastest settings with worker processes at ``in_order=False`` (batches handed
        over as the workers finish them, in an order that varies from run to run), decided by the same rounds.
    state : TuneState, optional
        Filled in with what is measured as it is: where the search is stopped (Ctrl-C), what it measured
        is there (:func:`placer.tune.stopping.stopped` makes it a result).
    """
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise TuneError(f"--budget-s must be a positive number of seconds, got {budget_s!r}")
    say = progress or (lambda line: None)
    clock = _Clock(budget_s)
    state = state if state is not None else TuneState()
    state.command, state.budget_s, state.clock = command, budget_s, clock
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    first = run_script(command, {"mode": "trial", "target": None, "settings": None, "warmup": WARMUP,
                                 "min_batches": MIN_BATCHES, "min_s": window_s, "stop_s": max(budget_s / 2, 10)},
                       timeout_s=max(clock.left(), 5.0))
    refuse_unusable(first, command)
    rec, others = holding_loader(first)
    site = rec["site"]
    startup = first.report.get("first_iter_s") or first.wall_s
    per_batch = rec["iterated_s"] / max(rec["batches"], 1)
    batches = max(MIN_BATCHES, math.ceil(window_s / max(per_batch, 1e-6)))
    if rec.get("length"):
        batches = max(batches, min(rec["length"] + 1, EPOCH_WINDOWS * batches))
    per_run = startup + (WARMUP + batches) * per_batch + 1.0
    say(f"as written: {rec['site']}, {rec['batches']} batches, start-up {startup:.1f} s, "
        f"{per_batch * 1e3:.0f} ms a batch; runs of {batches} counted batches")
    user_s = user_settings(rec)
    runner = _Runner(command, site, batches, per_batch, per_run, clock, say)
    state.rec, state.others, state.startup_s, state.batches = rec, others, startup, batches
    state.as_written, state.runner, state.step = user_s, runner, YOUR_RUN
    user = runner.once(user_s)
    if user is None:
        raise TuneError("the script as written could not be measured a second time within the budget "
                        f"({budget_s:.0f} s; one run takes about {per_run:.0f} s): raise --budget-s")
    state.step = CACHE_SEARCH
    found = state.cache = _find_cache(command, rec, runner, startup, budget_s) if cache else None
    todo = space if space is not None else candidates(user_s, cores=cores, gpu=bool(first.report.get("cuda")),
                                                      iterable=bool(rec.get("iterable")))
    state.step = FIRST_ROUND
    trials = [user]
    for s in todo:
        # the first round leaves room for the interleaved rounds that decide
        t = runner.once(s, reserve=ROUND_RUNS * (REPEATS - 1))
        if t is not None:
            trials.append(t)
    if allow_reorder:
        todo += reordered(trials, runner)
    notes = []
    if len(trials) - 1 < len(todo):
        notes.append(f"{len(todo) - (len(trials) - 1)} of the {len(todo)} settings to try were not run within the "
                     f"budget ({budget_s:.0f} s; a run of the script takes about {runner.per_run():.0f} s): a larger "
                     "--budget-s tries them")
    state.step = ROUNDS
    trials = _rounds(trials, runner, clock)
    waits = user_of(trials).fetch_fraction > wait_noise(user_of(trials))
    choice, noise = decide(user_of(trials), trials, waits=waits)
    notes += persistent_note(choice.settings, user_s, rec.get("arguments", {}))
    result = state.tuned = Tuned(
        command=command, site=site, others=[other_loader(r) for r in others], user=user_of(trials),
        recommended=choice, trials=trials, noise=noise, startup_s=startup, budget_s=budget_s, used_s=clock.used(),
        batches=batches, arguments=rec.get("arguments", {}), runs=runner.runs, notes=notes,
        iterable=bool(rec.get("iterable")), cache=found)
    if found is not None and found.batches:
        state.step = WEIGHING
        result.cache = _weigh_cache(found, choice.settings, runner)
    result.used_s, state.step = clock.used(), DONE
    return result


def reordered(trials: list[Trial], runner: _Runner) -> list[LoaderSettings]:
    """The first round's ``FINALISTS`` fastest settings with worker processes, each run once at ``in_order=False``
    (where the installed torch's DataLoader has it); the runs join ``trials``. Returns the settings tried."""
    import inspect

    from torch.utils.data import DataLoader

    if "in_order" not in inspect.signature(DataLoader.__init__).parameters:
        return []
    ranked = sorted((t for t in trials[1:] if t.settings.num_workers and not t.settings.worker_threads),
                    key=lambda t: -t.score)
    tried = [t.settings.model_copy(update={"in_order": False}) for t in ranked[:FINALISTS]]
    trials += [t for s in tried if (t := runner.once(s, reserve=ROUND_RUNS * (REPEATS - 1))) is not None]
    return tried


def _find_cache(command: list[str], rec: dict[str, Any], runner: _Runner, startup: float,
                budget_s: float) -> CacheResult:
    """The search for a cache (:func:`placer.tune.caching.find`); where it offers one, the window its rounds
    read (``batches``) and their seconds reserved on the clock: at most half of what is left, so that the
    settings are still searched. Not looked for where the time left cannot hold the search and the rounds
    that would weigh what it found."""
    clock = runner.clock
    share = caching.FIND_SHARE * budget_s
    window = caching.cache_window(runner.batches, rec.get("length"))
    need = share + startup + caching.runs_needed(runner.cache_run_s(window))
    if not rec.get("iterable") and rec.get("length") and clock.left() < need:
        found = caching.not_searched(
            f"looking for it and weighing it ({2 * caching.FIRST_ROUNDS} runs of {window} batches) takes about {need:.0f} s, "
            f"more than the {max(clock.left(), 0):.0f} s left: a larger --budget-s looks for one")
        runner.say(f"  cache inside the Dataset: not looked for ({found.reason})")
        return found
    found = caching.find(command, runner.site, rec, budget_s=share, startup_s=startup)
    runner.say(f"  cache inside the Dataset: {found.method or 'none'}"
               + (f", epochs 2+ {found.found['epoch_speedup']:.1f}x in the search's passes"
                  if found.found.get("epoch_speedup") else "")
               + ("" if found.found.get("recommended") else f" ({found.reason})")
               + f"  ({clock.used():.0f} of {clock.budget_s:.0f} s)")
    if found.found.get("recommended"):
        found.batches = window
        clock.reserved = min(caching.runs_needed(runner.cache_run_s(found.batches)), max(clock.left(), 0.0) / 2)
    return found


def _weigh_cache(found: CacheResult, settings: LoaderSettings, runner: _Runner) -> CacheResult:
    """The chosen settings without the cache and with it, in interleaved rounds (:func:`placer.tune.caching.weigh`)."""
    runner.clock.reserved = 0.0
    spec = {"method": found.method, "budget_bytes": int(found.found["budget_bytes"])}
    per_run = runner.cache_run_s(found.batches)

    def once(with_cache: bool) -> tuple[float, str | None] | None:
        t = runner.once(settings, cache=spec if with_cache else None, batches=found.batches, digest=True)
        return None if t is None else (t.samples_per_s, runner.runs[-1]["digest"])

    return caching.weigh(found, once, lambda n: runner.clock.left() >= n * per_run, found.batches)


class _Runner:
    """Runs the script with one setting after another, each stopped after the same counted batches."""

    def __init__(self, command: list[str], site: str, batches: int, per_batch: float, per_run: float, clock: _Clock,
                 say: Callable[[str], None]):
        self.command, self.site, self.batches, self.per_batch = command, site, batches, per_batch
        self.first_guess, self.clock, self.say = per_run, clock, say
        self.runs: list[dict[str, Any]] = []
        #: the runs over the search's window without a cache, in the order run (what a stopped search shows)
        self.measured: list[Trial] = []

    def per_run(self) -> float:
        """Seconds one run takes: the median of the runs so far (start-up included)."""
        walls = [r["wall_s"] for r in self.runs]
        return float(np.median(walls)) if walls else self.first_guess

    def fits(self, runs: int) -> bool:
        return self.clock.left() >= runs * self.per_run()

    def cache_run_s(self, batches: int) -> float:
        """Seconds a run that counts ``batches`` takes (a run of the search's window, and the batches past it)."""
        return self.per_run() + max(batches - self.batches, 0) * self.per_batch

    def once(self, s: LoaderSettings, *, reserve: int = 0, cache: dict[str, Any] | None = None,
             batches: int | None = None, digest: bool = False) -> Trial | None:
        """One run of the script with ``s`` (None where the budget, less ``reserve`` runs, has no room, or
        the run counted no batch); with ``cache``, the cache inside the Dataset applied; ``batches``
        counted (default the search's window); with ``digest``, its counted batches hashed."""
        n = self.batches if batches is None else batches
        if batches is None and not self.fits(1 + reserve):
            return None
        run = run_script(self.command, {"mode": "trial", "target": self.site, "settings": settings_dict(s),
                                        "warmup": WARMUP, "batches": n, "cache": cache, "digest": digest,
                                        "stop_s": SLOW_CAP * n * self.per_batch + 5.0},
                         timeout_s=SLOW_CAP * self.cache_run_s(n) + 30.0)
        t = trial_of(run, self.site, s, n)
        if t is not None and cache is None and batches is None:
            self.measured.append(t)
        rec = run.loader(self.site) or {}
        self.runs.append({"settings": settings_dict(s), "cache": None if cache is None else cache["method"],
                          "batches": n, "digest": rec.get("digest") if digest else None,
                          "memory_start": rec.get("memory_start"),
                          "memory_end": rec.get("memory_end"),
                          "samples_per_s": None if t is None else round(t.samples_per_s, 2),
                          "startup_s": run.report.get("first_iter_s"), "wall_s": round(run.wall_s, 3),
                          "stopped": run.report.get("stopped"), "returncode": run.returncode})
        self.say(f"  {_short(s)}{', cache' if cache else ''}: "
                 + ("failed" if t is None else f"{t.samples_per_s:,.0f} samples/s")
                 + f"  ({self.clock.used():.0f} of {self.clock.budget_s:.0f} s)")
        return t


def persistent_note(chosen: LoaderSettings, user: LoaderSettings, arguments: dict[str, str]) -> list[str]:
    """What recommending ``persistent_workers`` changes in a script whose loader has a generator: torch draws the
    workers' base seed from it at each ``iter()``, once with persistent workers, so a shuffle on that generator
    reads other batches from the second epoch on (``placer tune --apply`` draws it each epoch, as written)."""
    if not (chosen.persistent_workers and chosen.num_workers and not chosen.worker_threads
            and not user.persistent_workers and arguments.get("generator") not in (None, "None")):
        return []
    return ["with persistent_workers=True and your DataLoader's generator, torch draws the workers' seed once "
            "instead of each epoch, so a shuffle on that generator reads other batches from the second epoch on; "
            "`placer tune --apply` keeps your batches, and so does persistent_workers=False at the measured cost"]


def user_of(trials: list[Trial]) -> Trial:
    return trials[0]


def _rounds(trials: list[Trial], runner: _Runner, clock: _Clock) -> list[Trial]:
    """``REPEATS`` interleaved rounds of the script as written and the finalists (each round runs the
    user's first), then up to ``SETTLE_ROUNDS`` more of the user's and a setting whose gain the
    runs' spread may hide (:func:`placer.stream.dropin.within_reach`)."""
    user = trials[0]
    finalists = _finalists(trials)
    more: dict[int, list[Trial]] = {id(t): [] for t in [user, *finalists]}
    for _ in range(REPEATS - 1):
        if not runner.fits(1 + len(finalists)):
            break
        _one_round([user, *finalists], runner.once, more)
    trials = [merged(t, more.get(id(t), [])) for t in trials]
    near = within_reach(trials[0], trials)
    if near is not None:
        settle: dict[int, list[Trial]] = {id(trials[0]): [], id(near): []}
        for _ in range(SETTLE_ROUNDS):
            if not runner.fits(2):
                break
            _one_round([trials[0], near], runner.once, settle)
        trials = [merged(t, settle.get(id(t), [])) for t in trials]
    return trials


def _finalists(trials: list[Trial]) -> list[Trial]:
    """The settings repeated beside the user's, as the drop-in picks them: the ``FINALISTS`` fastest of the
    first round, the user's loader at other step threads (a step-bound choice) and the setting the
    first round alone would choose (:func:`placer.stream.dropin.choose`: the cheapest near the fastest)."""
    user = trials[0]
    ranked = sorted(trials[1:], key=lambda t: -t.score)
    out = ranked[:FINALISTS]
    same = [t for t in ranked if (t.settings.num_workers, t.settings.prefetch_factor, t.settings.pin_memory)
            == (user.settings.num_workers, user.settings.prefetch_factor, user.settings.pin_memory)]
    first_choice = choose(user, trials)
    for extra in [*same[:1], first_choice]:
        if extra is not user and extra not in out:
            out.append(extra)
    return out


def _one_round(which: list[Trial], once: Callable[[LoaderSettings], Trial | None],
               more: dict[int, list[Trial]]) -> None:
    """One run of each of ``which``, in turn; a round with a failed run is dropped whole (rounds stay paired)."""
    got = [once(t.settings) for t in which]
    if all(g is not None for g in got):
        for t, g in zip(which, got):
            more[id(t)].append(g)


def other_loader(rec: dict[str, Any]) -> dict[str, Any]:
    """A loader that does not hold the loop, as the result lists it."""
    return {"site": rec["site"], "batches": rec["batches"], "iterated_s": round(rec["iterated_s"], 3)}


def _short(s: LoaderSettings) -> str:
    d = settings_dict(s)
    text = f"num_workers={d['num_workers']} ({s.worker_kind})"  # DataLoader's words, as the drop-in says them
    if d["num_workers"]:
        text += f", prefetch_factor={d['prefetch_factor']}"
    if d["persistent_workers"]:
        text += ", persistent"
    if d["pin_memory"]:
        text += ", pinned"
    return text + f", torch threads {d['torch_threads']}"

