"""Advice for an existing training script: its own DataLoader and train step, measured.

May import: numpy, placer.data.stream, placer.devices, placer.executor.stream.{nodes,source},
placer.stream.dataset_cache,
placer.timing; torch, placer.executor.stream.threadloader, placer.stream.fresh and placer.stream.wholerun
inside functions.

:func:`advise_loader` runs the user's DataLoader with the user's step for a bounded
number of batches and answers two questions. *Who waits for whom*: the step alone on
batches fetched once (same shapes) gives the rate the consumer could take, the loader
alone the rate it can deliver, and the two together the rate the script gets; the
step's idle share is ``1 - together / step alone`` (the DS-Analyzer differential).
*Which DataLoader settings are faster*: a few settings (``num_workers`` 0, 1, 2 and
the core count; ``prefetch_factor`` 2 and 4; ``pin_memory`` when the step is on a
real GPU) are rebuilt from the user's loader (same dataset, sampler or batch
sampler, batch size, collate function, generator, ``drop_last``) and measured with
the step, within a time budget, with fewer intra-op threads for the step. After one
run of each, the user's settings and the few fastest run again, interleaved, until
each has three runs. The best is recommended only when its median beats the user's
by a clear margin and its slowest run beats the user's fastest; otherwise the user's
settings are kept (or fewer workers, when they are as fast) and a gain within the
spread is called noise. A step that waits for data only within noise gets no loader
setting at all. Samples are counted from each batch's first array (its leading
dimension), else from the loader's batch size.

The rebuilt loader yields the same batches in the same order: it draws from the
same sampler and the same generator. Measuring draws from them too, so the states
of the loader's generators and of torch's global random generator (which an
unseeded ``shuffle=True`` draws each epoch's order from) are restored afterwards:
the script's training reads what it would have read without the measurement.

:func:`measure` wraps the loader of the user's own loop instead and reports the
share of the loop spent waiting on ``next(loader)``, without trying settings.

Caching: first, within a quarter of the budget more (:data:`CACHE_SHARE`; the settings'
runs keep the whole budget), :func:`~placer.stream.dataset_cache.find_cache`
profiles the dataset's ``__getitem__`` and measures caching the deterministic
per-index work that dominates it; :attr:`LoaderAdvice.cache` says what it found, and
:meth:`LoaderAdvice.loader` applies a cache that was offered.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from placer.data.stream import LoaderSettings
from placer.devices import Device, canonical_name, discover, is_real_gpu, torch_device_name
from placer.executor.stream.nodes import leading_len
from placer.executor.stream.source import rebuild_loader
from placer.stream import dataset_cache
from placer.timing import (Clock, Deadline, Measurement, Timings, allocator_as_is, sign_tail, torch_threads,
                           two_speeds)

log = logging.getLogger(__name__)

#: what an exhausted iterator gives ``next``
_END = object()
#: a setting is recommended only when it is this much faster than the user's own
MIN_GAIN = 0.05
#: among settings this close to the fastest, the one with the fewest workers is chosen
NEAR_BEST = 0.95
#: runs of each finalist (the user's settings and the few fastest of the first round), interleaved
REPEATS = 3
#: settings besides the user's (and the cheapest near the fastest) repeated after the first round
FINALISTS = 2
#: more interleaved rounds of the user's settings and the fastest, when ``REPEATS`` rounds left its
#: gain within noise and the budget has room (a gain of 10-15 % on short, noisy runs needs them)
SETTLE_ROUNDS = 4
#: a step that waits for data at most this share of the time waits within noise: even a loader
#: that never kept it waiting would gain at most ``1 / (1 - WAIT_NOISE)``, i.e. ``MIN_GAIN``, so no
#: loader setting is recommended for it (a single run that measured more measured noise)
#: (or half the spread of the user's runs, when larger: a wait the runs cannot tell from noise)
WAIT_NOISE = 1 - 1 / (1 + MIN_GAIN)
#: the search for a cache inside the dataset takes at most this share of the budget, before the settings' runs
CACHE_SHARE = 0.25
#: a run shorter than this measures the machine's hiccups and the workers' start more than the loader:
#: where the budget has room, runs read more batches (up to an epoch) to last this long
MIN_RUN_S = 0.5


def _as_dict(s: LoaderSettings) -> dict[str, Any]:
    """Settings as the advice's JSON shows them (a trial keeps the user's batch size: not shown)."""
    return s.as_dict()


def label(s: LoaderSettings) -> str:
    """Settings in words: ``num_workers=2 (processes), prefetch_factor=2, ...``."""
    parts = [f"num_workers={s.num_workers} ({s.worker_kind})"]
    if s.num_workers:
        parts.append(f"prefetch_factor={s.prefetch_factor}")
        if not s.worker_threads:
            parts.append(f"persistent_workers={s.persistent_workers}")
    return ", ".join([*parts, f"pin_memory={s.pin_memory}", f"torch threads {s.torch_threads}"])


def _cost(s: LoaderSettings) -> tuple:
    """Orders settings by what they hold: workers (threads before processes), then batches in flight,
    then pinned memory."""
    return (s.num_workers, not s.worker_threads, s.prefetch_factor or 0, s.pin_memory, -(s.torch_threads or 0))


@dataclass(frozen=True)
class Trial:
    """One measured run of the loader with the step (steady state, after warm-up batches)."""

    settings: LoaderSettings
    samples_per_s: float
    first_batch_s: float
    fetch_fraction: float
    batches: int
    samples: int
    seconds: float
    #: the wait on each counted ``next(loader)``: every repeat kept (median and spread)
    fetch: Measurement | None = field(default=None, compare=False, repr=False)
    #: samples/s of each run of these settings, in the order run (``samples_per_s`` is their median)
    repeats: tuple[float, ...] = field(default=(), compare=False)
    #: stopping the loader's workers after the run (joining the processes; an epoch's end without
    #: ``persistent_workers``)
    close_s: float = field(default=0.0, compare=False)
    #: every batch read (warm-up included), and the seconds from ``iter(loader)`` to the last one's step
    read: int = field(default=0, compare=False)
    read_s: float = field(default=0.0, compare=False)
    #: samples/s of the script's whole run (its epochs x batches: start-up, epoch ends and the steady
    #: state) as each run of these settings predicts it (:func:`run_rate`); empty when the run's shape
    #: is unknown (an iterable dataset without a length)
    run_rates: tuple[float, ...] = field(default=(), compare=False)
    #: when each run started (``time.perf_counter``), in the order run: pairs a run with the user's
    #: run of the same round (:func:`paired`)
    started: tuple[float, ...] = field(default=(), compare=False)
    #: the run stopped in its warm-up: its first batches came after the user's whole run would have
    #: ended (:func:`run_loader`'s ``give_up_s``); its rate is the batches read over the time taken
    cut: bool = field(default=False, compare=False)
    #: each run's (batches read, ``read_s``, ``first_batch_s``), in the order run; empty for one run
    #: (its own ``read``, ``read_s`` and ``first_batch_s``)
    reads: tuple[tuple[int, float, float], ...] = field(default=(), compare=False)

    @property
    def rates(self) -> tuple[float, ...]:
        return self.repeats or (self.samples_per_s,)

    @property
    def score(self) -> float:
        """What the settings are ranked by: the whole run's samples/s where the run's shape is known
        (over the runs' mean time: a setting that is fast in some runs and several times slower in
        others, e.g. a step's intra-op threads that contend with other work on shared cores, costs
        the script its mean, not its median), else the steady state's (the median of the runs)."""
        if not self.run_rates:
            return self.samples_per_s
        return len(self.run_rates) / sum(1 / max(r, 1e-12) for r in self.run_rates)

    @property
    def scores(self) -> tuple[float, ...]:
        """Each run's :attr:`score`, in the order run."""
        return self.run_rates or self.rates

    @property
    def spread(self) -> float:
        """The repeats' range over their median (0 with one run)."""
        r = self.rates
        return (max(r) - min(r)) / max(self.samples_per_s, 1e-12)

    def as_dict(self) -> dict[str, Any]:
        return {**_as_dict(self.settings), "samples_per_s": round(self.samples_per_s, 2),
                "first_batch_s": round(self.first_batch_s, 4), "fetch_fraction": round(self.fetch_fraction, 4),
                "batches": self.batches, "samples": self.samples, "seconds": round(self.seconds, 4),
                "repeats": [round(r, 2) for r in self.rates], "spread": round(self.spread, 4),
                "close_s": round(self.close_s, 4), "run_rates": [round(r, 2) for r in self.run_rates],
                "reads": [[n, round(s, 4), round(f, 4)] for n, s, f in self.each_read],
                **({"cut": True} if self.cut else {})}

    @property
    def each_read(self) -> tuple[tuple[int, float, float], ...]:
        """Each run's (batches read, seconds from ``iter(loader)`` to the last one's step, first batch)."""
        return self.reads or ((self.read, self.read_s, self.first_batch_s),)


def merged(first: Trial, more: list[Trial]) -> Trial:
    """One setting's runs as one trial: the median samples/s, every run's kept in ``repeats``."""
    if not more:
        return first
    runs = [first, *more]
    rates = tuple(r for t in runs for r in t.rates)
    return replace(first, samples_per_s=float(np.median(rates)), repeats=rates,
                   first_batch_s=float(np.median([t.first_batch_s for t in runs])),
                   close_s=float(np.median([t.close_s for t in runs])),
                   read=min(t.read for t in runs), read_s=float(np.median([t.read_s for t in runs])),
                   fetch_fraction=float(np.mean([t.fetch_fraction for t in runs])),
                   batches=sum(t.batches for t in runs), samples=sum(t.samples for t in runs),
                   seconds=sum(t.seconds for t in runs), run_rates=tuple(r for t in runs for r in t.run_rates),
                   started=tuple(r for t in runs for r in t.started),
                   reads=tuple(r for t in runs for r in t.each_read))


@dataclass
class LoaderAdvice:
    """What :func:`advise_loader` measured and recommends; ``str()`` reads it, :meth:`to_json` saves it.

    Attributes
    ----------
    user, recommended : Trial
        The user's own settings and the recommended ones, each measured with the step.
    trials : list of Trial
        Every setting measured with the step (the user's first).
    bottleneck : str
        ``loader`` when the loader alone delivers fewer samples/s than the step alone
        takes, else ``step``.
    wait_fraction : float
        The step's idle share with the user's settings: ``1 - user / step alone``.
    step_samples_per_s, loader_samples_per_s : float or None
        The step alone on batches fetched once; the loader alone with the user's settings.
    step_device : str
        Where the step runs (the loader runs on the CPU).
    threads : dict or None
        The intra-op thread count tried with the recommended workers, if one was.
    """

    user: Trial
    recommended: Trial
    trials: list[Trial]
    bottleneck: str
    wait_fraction: float
    step_samples_per_s: float | None
    loader_samples_per_s: float | None
    step_device: str
    threads: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    source: Any = field(default=None, repr=False)
    #: the wall-clock budget the runs were given
    budget_s: float | None = None
    #: why a faster-measured setting was not recommended: its gain was within the runs' spread
    within_noise: str | None = None
    #: the loader and step planned for a described machine (``target=``): a StreamPlan, every number predicted
    target: Any = None
    #: the caching found inside the dataset (:class:`~placer.stream.dataset_cache.CacheAdvice`), if looked for
    cache: Any = None
    #: the user's whole run predicted (:func:`whole_run`): epochs, batches, seconds with each setting
    whole_run: dict[str, Any] | None = None
    #: the longer runs that confirmed (or overturned) the recommendation (:func:`confirm`)
    confirmed: dict[str, Any] | None = None
    #: the knobs whose change made the recommendation faster (:func:`decided_by`)
    knobs: list[dict[str, Any]] = field(default_factory=list)
    #: the user's runs at two speeds, where they ran so (:func:`user_speeds`)
    user_speeds: dict[str, Any] | None = None
    #: where the runs were made: ``fresh processes`` (as the script starts) or ``this process``
    runs_in: str = "this process"

    @property
    def steady_speedup(self) -> float:
        """Recommended samples/s over the user's in the steady state, both measured here."""
        return self.recommended.samples_per_s / max(self.user.samples_per_s, 1e-12)

    @property
    def speedup(self) -> float:
        """The speed-up of the user's whole run (start-up and epoch boundaries included) where its
        epochs and batches are known, else the steady state's; where the user's runs ran at two
        speeds, the speed-up over the faster ones (:func:`user_speeds`)."""
        if self.user_speeds is not None and "speedup" in self.user_speeds:
            return self.user_speeds["speedup"]
        return self.mixed_speedup

    @property
    def mixed_speedup(self) -> float:
        """The speed-up over the user's runs as measured here, whatever their speeds."""
        if self.whole_run is not None:
            return self.whole_run["speedup"]
        return self.steady_speedup

    @property
    def change(self) -> bool:
        """Whether the recommendation differs from the user's settings."""
        return self.recommended.settings != self.user.settings

    def loader(self) -> Any:
        """A DataLoader over the user's dataset and sampler with the recommended settings (and cache)."""
        if self.source is None:
            raise ValueError("this advice has no loader to rebuild (it was read back from JSON)")
        cached = self.cache.apply() if self.cache is not None and self.cache.recommended else None
        return rebuild(self.source, self.recommended.settings, dataset=cached)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck, "wait_fraction": round(self.wait_fraction, 4),
            "samples_per_s": {"pipeline": _round(self.user.samples_per_s), "loader": _round(self.loader_samples_per_s),
                              "step": _round(self.step_samples_per_s)},
            "stages": {"loader": "cpu", "step": self.step_device},
            "user": self.user.as_dict(), "recommended": self.recommended.as_dict(),
            "change": self.change, "speedup": round(self.speedup, 3), "threads": self.threads,
            "steady_speedup": round(self.steady_speedup, 3), "whole_run": self.whole_run,
            "confirmed": self.confirmed, "decided_by": list(self.knobs),
            "trials": [t.as_dict() for t in self.trials], "notes": list(self.notes),
            "seconds": round(self.seconds, 3), "budget_s": self.budget_s, "within_noise": self.within_noise,
            "user_speeds": self.user_speeds, "runs_in": self.runs_in,
            **_target_dict(self.target),
            "cache": None if self.cache is None else self.cache.as_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent)

    def __str__(self) -> str:
        return "\n".join([*describe(self), *_target_lines(self.target)])


def _target_dict(plan: Any) -> dict[str, Any]:
    """``{"target": ...}`` for a plan made for a described machine, else nothing."""
    if plan is None:
        return {}
    from placer.stream.target import target_summary

    return {"target": target_summary(plan)}


def _target_lines(plan: Any) -> list[str]:
    """The target's lines of the advice's text: the bound-by sentence, the settings, the what-ifs."""
    if plan is None:
        return []
    from placer.stream.target import target_summary

    t = target_summary(plan)
    lo = t.get("loader", {})
    out = [t["bottleneck_sentence"] or "",
           f"  settings for {t['machine']} (predicted {t['predicted_samples_per_s']:,.0f} samples/s): "
           f"num_workers={lo.get('num_workers')}, pin_memory={lo.get('pin_memory')}, step on "
           f"{t['settings']['placement'].get(plan.step)}"]
    out += [f"  what if {w['name']}: {w['predicted_samples_per_s']:,.0f} samples/s predicted on {t['machine']}"
            for w in t["what_if"]]
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# -- rebuilding the user's loader ----------------------------------------------------------
def settings_of(loader: Any) -> LoaderSettings:
    """The settings a DataLoader was built with (and torch's current intra-op threads)."""
    import torch

    return LoaderSettings.of(loader).model_copy(update={"torch_threads": torch.get_num_threads()})


def rebuild(loader: Any, settings: LoaderSettings, dataset: Any = None) -> Any:
    """A DataLoader with ``settings`` that reads what ``loader`` reads, in the same order
    (:func:`~placer.executor.stream.source.rebuild_loader`: every other argument kept; ``dataset``, the same
    with a cache); a thread-pool loader for thread workers, one that draws as without persistent workers."""
    workers = bool(settings.num_workers)
    return rebuild_loader(loader, settings.kwargs(), threads=settings.worker_threads and workers, dataset=dataset,
                          same_draws=settings.persistent_workers and workers)


def candidates(user: LoaderSettings, *, cores: int, gpu: bool, iterable: bool) -> list[LoaderSettings]:
    """The settings tried first besides the user's: worker processes 0, 1, 2 and ``cores`` with prefetch
    2 and 4; thread workers (:class:`~placer.executor.stream.threadloader.ThreadLoader`) 1, 2 and ``cores`` with
    prefetch 2 (not for an iterable dataset, whose workers each read their own share). One thread
    worker overlaps loading with the step at no start-up cost: on 2 cores a numpy-augmenting
    inference script of 12 batches ran fastest so (1.44x as written), where worker processes paid
    their start-up within a one-second run.

    For a step on the CPU, each worker count is also tried (prefetch 2) with the step's intra-op
    threads cut to the cores the workers leave (at least one), where that is fewer than the
    user's: workers and the step's threads share the cores, and the pair is what wins or loses
    (on 2 cores, 2 worker processes at 1 torch thread ran a table script 1.6x faster than as
    written, and at 2 torch threads no faster).

    The user's own loader with the step at one intra-op thread comes first (a CPU step whose
    threads are more than one): the change that touches nothing but the step's threads, which
    the search must not run out of budget before (on 2 cores a numpy-decoding inference script
    ran 1.24x faster at one torch thread, where two worker processes took 6 s to their first
    batch and used the budget up).

    They are tried in the order they start in: fewer workers first (processes, then threads, of one
    count), each depth with the step's threads cut right after it; settings slow to
    start cannot spend the budget before the quick ones are measured (on 2 cores two
    numpy-augmenting worker processes took 4-6 s to their first batch, BLAS threads in each, and
    the one thread worker that won was never measured).

    More workers than ``cores`` (:func:`more_workers`) and other prefetch depths (:func:`prefetch_depths`)
    are tried afterwards, where the first runs say they may help.
    """
    counts = [user.num_workers] if iterable else sorted({0, 1, 2, cores})
    out = [user.model_copy(update={"torch_threads": 1})] if not gpu and (user.torch_threads or 1) > 1 else []
    for w in counts:
        for pf in (2, 4) if w else (None,):
            s = LoaderSettings(num_workers=w, prefetch_factor=pf, pin_memory=gpu, persistent_workers=w > 0,
                               torch_threads=user.torch_threads)
            if _measured_as(s) != _measured_as(user) and s not in out:
                out.append(s)
    for w in ([] if iterable else sorted({1, 2, cores})):
        s = LoaderSettings(num_workers=w, prefetch_factor=2, pin_memory=gpu, worker_threads=True,
                           torch_threads=user.torch_threads)
        if _measured_as(s) != _measured_as(user) and s not in out:
            out.append(s)
    if not gpu:
        for s in list(out):
            left = max(1, cores - s.num_workers)
            if s.num_workers and s.prefetch_factor == 2 and left < (user.torch_threads or 1):
                fewer = s.model_copy(update={"torch_threads": left})
                if fewer not in out:
                    out.append(fewer)
    # sooner to start first (a stable sort: the step's own threads before fewer, at one count and depth)
    return sorted(out, key=lambda s: (s.num_workers, s.worker_threads, s.prefetch_factor or 0))


#: a worker count is worth raising while one more step of it raised the rate by this much
RISE = 0.05


def more_workers(trials: list[Trial], *, cores: int) -> list[LoaderSettings]:
    """The next worker count to try for each kind (processes, threads) whose rate still rises.

    For each kind, the fastest setting measured: when it has the most workers measured for
    its kind and beats the next fewer of that kind (same prefetch and step threads; else
    one fewer worker of the other kind) by :data:`RISE`, one more count (``+1`` up to
    twice the cores, then doubling, at most :data:`MAX_WORKERS`) with the same prefetch.
    Workers beyond the cores pay where loading waits (I/O, sleeps) or releases the GIL.
    An empty list: the rate has stopped rising.
    """
    out = []
    for threads in (False, True):
        kind = [t for t in trials if t.settings.num_workers and t.settings.worker_threads == threads]
        if not kind:
            continue
        top = max(kind, key=lambda t: t.samples_per_s)
        w = top.settings.num_workers
        if w < max(t.settings.num_workers for t in kind) or w >= MAX_WORKERS:
            continue
        below = [t for t in kind if t.settings.num_workers < w
                 and (t.settings.prefetch_factor, t.settings.torch_threads)
                 == (top.settings.prefetch_factor, top.settings.torch_threads)]
        if not below:  # the only count of its kind measured: against the other kind's one fewer
            below = [t for t in trials if t.settings.num_workers == w - 1 and t.settings.num_workers
                     and t.settings.torch_threads == top.settings.torch_threads]
        prev = max(below, key=lambda t: t.settings.num_workers, default=None)
        if prev is not None and top.samples_per_s < prev.samples_per_s * (1 + RISE):
            continue
        nxt = min(MAX_WORKERS, w + 1 if w < 2 * cores else 2 * w)
        out.append(top.settings.model_copy(update={"num_workers": nxt}))
    return out


#: the most workers of one kind the drop-in tries
MAX_WORKERS = 32
#: prefetch depths the drop-in may recommend (batches in flight per worker)
PREFETCH = (1, 2, 4, 8)


def prefetch_depths(best: LoaderSettings, measured: list[LoaderSettings]) -> list[LoaderSettings]:
    """The best setting's workers with the prefetch depths of :data:`PREFETCH` not yet measured."""
    if not best.num_workers:
        return []
    seen = {_measured_as(s) for s in measured}
    depths = (best.model_copy(update={"prefetch_factor": pf}) for pf in PREFETCH)
    return [s for s in depths if _measured_as(s) not in seen]


#: a worker count whose fastest setting is within this of the fastest's also gets every prefetch depth
DEPTH_NEAR = 0.9


def depth_bases(trials: list[Trial]) -> list[LoaderSettings]:
    """The settings whose other prefetch depths are tried: the fastest with workers, and the fastest
    of another worker count when it is within :data:`DEPTH_NEAR` of it.

    Worker count and depth interact: on 2 cores a text-tokenising script measured fastest with 4
    processes at depth 2 in the first round, while 2 processes at depth 4 or 8 ran its whole run
    faster as a script (fewer workers start sooner; a deeper queue keeps them busy).
    """
    with_workers = sorted((t for t in trials if t.settings.num_workers), key=lambda t: -t.score)
    if not with_workers:
        return []
    top = with_workers[0]
    other = next((t for t in with_workers if t.settings.num_workers != top.settings.num_workers), None)
    near = other is not None and other.score >= DEPTH_NEAR * top.score
    return [top.settings] + ([other.settings] if near else [])


def _measured_as(s: LoaderSettings) -> LoaderSettings:
    # persistent workers only matter between epochs: a bounded run measures them the same; without
    # workers, neither their kind nor a prefetch depth means anything
    if not s.num_workers:
        return s.model_copy(update={"persistent_workers": False, "worker_threads": False, "prefetch_factor": None})
    return s.model_copy(update={"persistent_workers": False})


# -- measuring -----------------------------------------------------------------------------
def _step_device(device: Any) -> Device:
    if device is None:
        return discover().resolve("cpu")
    if hasattr(device, "type") and not isinstance(device, str):  # a torch.device
        device = torch_device_name(device) or str(device)
    device = str(device).strip().lower()
    if device.startswith("cuda"):  # torch's spelling
        device = "gpu" + device[4:]
    return discover().resolve(canonical_name(device))


def _close(it: Any) -> None:
    """Stop a DataLoader iterator's worker processes now (not when it is collected)."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


class SampleCount:
    """Samples in a batch: its first array's leading dimension, else the loader's batch size.

    When neither is known a batch counts as one sample and :attr:`unknown` is set.
    """

    def __init__(self, batch_size: int | None = None):
        self.batch_size = batch_size
        self.unknown = False

    def __call__(self, batch: Any) -> int:
        n = leading_len(batch)
        if n is not None:
            return n
        if self.batch_size:
            return int(self.batch_size)
        if not self.unknown:
            log.warning("a batch has no array and the loader no batch size: each batch counts as one sample")
        self.unknown = True
        return 1


#: batches counted with neither a leading dimension nor a batch size (a note says so)
UNKNOWN_COUNT = ("samples are counted as batches: a batch has no array with a leading dimension and the "
                 "loader no batch_size, so each batch counts as one sample")


def counter_of(loader: Any) -> SampleCount:
    return SampleCount(getattr(loader, "batch_size", None))


def run_loader(loader: Any, step: Callable[[Any], Any] | None, *, batches: int, warmup: int,
               device: Device, deadline: Deadline, keep: list | None = None,
               count: SampleCount | None = None, drain: int = 0, give_up_s: float | None = None) -> Trial | None:
    """Fetch up to ``batches`` batches (and step on each); the rate counts batches after ``warmup``.

    Stops early at ``deadline`` (after at least one counted batch). ``keep`` collects
    the first batches for the step-alone run. None when the loader runs out during the warm-up.
    ``drain``: the batches the loader's queue holds (workers x prefetch). The workers fill
    it while the first batches are taken, so the first ``drain`` counted batches may come
    from a full queue; the rate leaves them out (up to half of the counted batches), or
    a short run with many workers would measure the queue, not the workers.
    ``give_up_s``: a run still in its warm-up this long after ``iter(loader)`` stops there (``cut``; its
    rate the batches read over the time taken): a setting whose first batches come after the user's
    whole run would have ended cannot make it faster (on 2 cores, numpy_augment's 2 worker processes took
    1-6 s to their first batch and 5-65 samples/s after, against the user's whole run of 2.9 s: three
    such runs spent most of a 60 s budget, and the user's settings ran once).
    """
    count = count or counter_of(loader)
    waits = Timings()
    first = end = None
    samples = counted = read = early = 0
    cut = False
    close_s = 0.0
    starts: list[float] = []  # when each counted batch was asked for
    sizes: list[int] = []
    fetches: list[Clock] = []
    with Clock() as run:
        it = iter(loader)
        try:
            for i in range(batches):
                if i == warmup:
                    device.synchronize()
                with Clock() as fetch:
                    batch = next(it, _END)
                if batch is _END:
                    break
                first = run.elapsed() if first is None else first
                read += 1
                if i >= warmup:
                    starts.append(run.elapsed() - fetch.wall)
                    fetches.append(fetch)
                    sizes.append(count(batch))
                    counted += 1
                else:
                    early += count(batch)
                if keep is not None and len(keep) < 4:
                    keep.append(batch)
                if step is not None:
                    step(batch)
                if counted and deadline.passed():
                    break
                if not counted and give_up_s is not None and run.elapsed() > give_up_s:
                    cut = True
                    break
            device.synchronize()
            end = run.elapsed()
        finally:
            with Clock() as closing:
                _close(it)
            close_s = closing.wall
    if cut:
        return Trial(settings=settings_of(loader), samples_per_s=early / max(end, 1e-12), first_batch_s=first,
                     fetch_fraction=1.0, batches=read, samples=early, seconds=end, close_s=close_s, read=read,
                     read_s=end, cut=True)
    if not counted:  # the loader ran out during the warm-up
        return None
    skip = min(max(drain, 0), (counted - 1) // 2)
    for f in fetches[skip:]:
        waits.add("fetch", f)
    counted, samples = counted - skip, sum(sizes[skip:])
    seconds = end - starts[skip]
    fetch_s = waits.wall_s["fetch"]
    return Trial(settings=settings_of(loader), samples_per_s=samples / seconds, first_batch_s=first,
                 fetch_fraction=sum(fetch_s) / seconds, batches=counted, samples=samples, seconds=seconds,
                 fetch=Measurement(raw_times=fetch_s, label="next(loader)"), close_s=close_s,
                 read=read, read_s=end)


def step_alone(step: Callable[[Any], Any], kept: list, *, batches: int, device: Device, deadline: Deadline,
               count: SampleCount | None = None) -> float:
    """Samples/s of the step on batches fetched once (no loader in the way)."""
    count = count or SampleCount()
    device.synchronize()
    samples = 0
    with Clock() as run:
        for i in range(batches):
            batch = kept[i % len(kept)]
            step(batch)
            samples += count(batch)
            if deadline.passed():
                break
        device.synchronize()
    return samples / run.wall


def _fresh_default() -> bool:
    """:func:`advise_loader`'s ``fresh`` when not given: yes, unless ``PLACER_FRESH_RUNS=0`` (the unit tests
    that fake the runs or count the step's calls in their own process set it)."""
    return os.environ.get("PLACER_FRESH_RUNS", "1").strip() != "0"


@contextlib.contextmanager
def _runs_where(budget: _Budget, loader: Any, step: Any, dev: Device, fresh: bool | None) -> Iterator[dict]:
    """``budget``'s runs in fresh processes (:mod:`placer.stream.fresh`) for the block, where ``fresh`` (default:
    :func:`_fresh_default`) and they can be, else in this process and ``budget.where["here"]`` says why; stopped
    after it. Yields ``{"where": ...}``, filled when the block ends: where the runs were made."""
    out = {"where": "this process"}
    if fresh if fresh is not None else _fresh_default():
        from placer.stream.fresh import start

        runs, why = start(loader, step, dev.kind)
        budget.where = {"fresh": runs, "here": why}
    try:
        yield out
    finally:
        if budget.where["fresh"] is not None:
            out["where"] = "fresh processes"
            budget.where["fresh"].close()


@contextlib.contextmanager
def _random_state_kept(loader: Any) -> Iterator[None]:
    """Restore torch's global random state and the loader's generators afterwards."""
    import torch

    gens = {}
    for owner in (loader, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator):
            gens[id(g)] = (g, g.get_state())
    cpu_state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        for g, state in gens.values():
            g.set_state(state)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# -- the advice ----------------------------------------------------------------------------
class _Budget:
    """Splits what is left of the budget evenly over the runs still to come.

    A run's deadline can stop its counted batches only: starting its workers, its
    warm-up batches and stopping the workers take what they take. The largest such
    fixed cost seen so far is kept, and an optional run starts only when that much is
    left (the budget was overrun by these costs when every run started regardless).
    """

    def __init__(self, budget_s: float, runs: int):
        self.total = Deadline(budget_s)
        self.runs = runs
        self.fixed_s = 0.0
        self.walls: list[float] = []
        #: the script's run (epochs, batches an epoch), when known: each run predicts its whole run
        self.shape: tuple[int, int] | None = None
        #: the user's settings, and their whole run's seconds once measured: another setting's run still
        #: in its warm-up after that long stops there (:func:`run_loader`'s ``give_up_s``)
        self.user: LoaderSettings | None = None
        self.user_run_s: float | None = None
        #: where the runs are made, shared with the budgets made from this one: ``fresh``, the runs' fresh
        #: processes (:mod:`placer.stream.fresh`), or None and ``here``, why they are in this process
        self.where: dict[str, Any] = {"fresh": None, "here": None}

    def deadline(self) -> Deadline:
        share = self.total.left() / max(self.runs, 1)
        self.runs -= 1
        return Deadline(share)

    def allows(self) -> bool:
        """Whether an optional run fits in what is left (it is counted as run either way)."""
        if self.total.left() > self.fixed_s:
            return True
        self.runs -= 1
        return False

    def ran(self, wall_s: float, counted_s: float, *, cut: bool = False) -> None:
        """A run's wall time and its counted batches' seconds; a ``cut`` run's start-up is not a fixed cost
        of the runs to come (its setting is not run again)."""
        if not cut:
            self.fixed_s = max(self.fixed_s, wall_s - counted_s)
        self.walls.append(wall_s)

    def give_up_s(self, settings: LoaderSettings) -> float | None:
        """How long a run of ``settings`` may stay in its warm-up: the user's whole run (none for theirs)."""
        return None if settings == self.user else self.user_run_s

    def leaves(self, runs: int) -> bool:
        """Whether one more optional run still leaves room for ``runs`` runs as long as the mean so far."""
        mean = sum(self.walls) / len(self.walls) if self.walls else 0.0
        if self.total.left() > self.fixed_s + (runs + 1) * mean:
            return True
        self.runs -= 1
        return False


#: the share of the budget kept for the longer runs that confirm a recommendation
CONFIRM_SHARE = 0.3
#: rounds of the confirming runs (each runs the user's settings and the recommended, in turn): three, so
#: that one slow run does not move the median (of two runs, their mean: table_train's one advice before a
#: grid claimed 1.09x from two such rounds where its settings ran 1.56x in the script)
CONFIRM_ROUNDS = 3
#: more rounds, up to this many in all, while either setting's confirming runs spread by more than
#: ``CONFIRM_SPREAD`` (their whole-run predictions' range over their median) and the budget has room for
#: a round as long as the last: audio_cache_train's one advice before v19's grid claimed 2.92x from three
#: rounds in which the user's settings spread by 31 %; the script measured 2.33x
CONFIRM_MAX_ROUNDS = 8
CONFIRM_SPREAD = 0.15
#: rounds, budget permitting, before runs that agree (within ``CONFIRM_SPREAD``) end the confirming: three
#: rounds side by side span a few seconds, and agreeing there says the machine held one speed for them, not
#: that it was its usual one. audio_cache_train's one advice before v39's grid claimed 1.88x from three
#: agreeing rounds where the script measured 2.87x; over v32-v39 its applied drop-in's claims from three
#: rounds read 0.70-1.53x what the script measured (5 of 20 beyond 20 %), from more 0.70-1.35x (3 of 51),
#: though more rounds ran only where the first three disagreed
#: (``benchmarks/results/probes-audio-claims-vm-epyc.md``)
CONFIRM_AGREED = 5
#: a confirming run reads up to this many times ``batches`` (at most one epoch), within its budget
CONFIRM_LENGTH = 4
#: rounds of raising the worker count while the rate rises
MORE_ROUNDS = 3
#: runs widening may take: more workers of both kinds for MORE_ROUNDS, then two worker counts' other depths
WIDEN_RUNS = 2 * MORE_ROUNDS + 2 * (len(PREFETCH) - 1)


@allocator_as_is()  # the user's process: the script runs on in it (placer.timing.allocator_as_is)
def advise_loader(loader: Any, step: Callable[[Any], Any], *, batches: int = 20, budget_s: float = 60.0,
                  device: Any = None, target: Any = None, cache_bytes: int | None = None,
                  epochs: int = 1, precision: Any = None, state: Any = None,
                  fresh: bool | None = None) -> LoaderAdvice:
    """Measure a DataLoader with a train step and recommend DataLoader settings.

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        The script's own loader; it is not changed (its settings are rebuilt for each run).
    step : callable
        ``step(batch)``: the script's train step. It runs for real on the measured
        batches (a training step trains the model on them: a copy of it, where the runs
        are in fresh processes).
    batches : int
        Batches per measured run (the first one, or ``num_workers`` ones, are warm-up); where
        a run of them lasts under ``MIN_RUN_S`` (0.5 s), more, up to an epoch and to half of a
        run's share of the budget (:func:`run_length`).
    budget_s : float
        Wall-clock budget of all runs together; each run stops early at its share
        (a run always counts at least one batch after its warm-up), and a run besides
        the user's first starts only when what is left covers the largest start-up and
        shut-down cost seen so far. The search for a cache inside the dataset takes at
        most a quarter of it more, before those runs, and, where a cache is offered beside other
        settings, measuring it again with them another quarter at most, after them. A share
        (:data:`CONFIRM_SHARE`) is kept for the longer runs that confirm a recommendation.
    epochs : int
        Epochs of the script's run: with the loader's length (its batches per epoch), the
        whole run is predicted (worker start-up, epoch boundaries with and without
        ``persistent_workers``, the steady state) and :attr:`LoaderAdvice.speedup` is the
        whole run's.

    Notes
    -----
    Every setting is run once; then the user's settings, the few fastest and the
    cheapest near the fastest run ``REPEATS`` times in all, interleaved (one run of each
    per round), so that the machine's drift falls on all of them alike. Settings are
    ranked by the script's whole run as each run predicts it (:func:`run_rate`: start-up,
    epoch ends and the steady state over ``epochs`` x the loader's batches), where the
    loader's length is known. A setting is recommended only when its median beats the
    user's by ``MIN_GAIN`` and the gain exceeds the noise (:func:`beats`: its slowest run
    beats the user's fastest, or its runs beat the user's of the same round in enough rounds,
    a sign test); when the fastest's gain is still within noise, it and the user's settings
    run up to ``SETTLE_ROUNDS`` more rounds while the budget has room (:func:`_settle`), and so do
    the fastest whose median is short of ``MIN_GAIN`` but whose fastest run is not (:func:`within_reach`);
    otherwise the advice keeps the user's settings and says the difference is within noise.
    Before that, settings run once that read faster than every repeated one are repeated with the
    user's (:func:`rivals`): a single run's lead is often luck, and so is a finalist's.
    A cache the advice offers is in the whole run it claims (:func:`with_cache`).

    The space: worker processes 0, 1, 2 and the cores, thread workers 1, 2 and the cores
    (a :class:`~placer.executor.stream.threadloader.ThreadLoader`), then more workers of each kind
    while the rate rises (:func:`more_workers`), prefetch 1, 2, 4 and 8 for the fastest
    and for the next worker count when it is near (:func:`depth_bases`), and fewer intra-op
    threads for the step. A recommendation
    is then confirmed by longer runs, interleaved with the user's settings
    (:func:`confirm`): it stands only when the whole run it predicts is still
    ``MIN_GAIN`` faster.
    device : str or torch.device, optional
        Where the step runs (``cpu``, ``gpu``, ``gpu:1``, ``cuda:0``); its queued work
        is waited for at the ends of each timed run. Default: ``cpu``.
    target : str or TargetDescription, optional
        Also plan the loader and step for a described machine (``"h200"``, a file
        ``placer describe`` wrote): ``advice.target`` (:func:`with_target`), every
        number a prediction for it.
    cache_bytes : int, optional
        The memory a cache inside the dataset may take (default: a quarter of the memory
        available); ``0`` looks for no cache.
    precision : str or tuple of str, optional
        Lower precisions the step may run in (``"bf16"``, ``("tf32", "bf16")``, ``"auto"``):
        each is checked here and, with a ``target``, predicted there and planned
        (:mod:`placer.stream.precision_advice`); the advice's notes say what it gives.
    state : object or tuple, optional
        What the step trains (the model, the optimizer: objects with ``state_dict``), put
        back between the precision checks' runs; without it the difference is not measured
        and no lower precision is chosen.
    fresh : bool, optional
        Make each run in a fresh process, as the script starts (:mod:`placer.stream.fresh`):
        a helper interpreter loads a copy of the loader and step, and forks a child per run.
        Default (None): so where it can be (Linux, a step on the CPU, a loader and step that
        pickle), else in this process; the advice's notes say which, and why; the environment
        variable ``PLACER_FRESH_RUNS=0`` makes the default ``False``: in this process, whose
        state the runs then share (the step trains the user's model).

    Returns
    -------
    LoaderAdvice
    """
    took = Deadline(None)
    dev = _step_device(device)
    from torch.utils.data import IterableDataset

    if epochs < 1:
        raise ValueError(f"advise_loader: epochs={epochs}: the script's run has at least one epoch")
    user = settings_of(loader)
    cores = _cores()
    cands = candidates(user, cores=cores, gpu=dev.is_gpu, iterable=isinstance(loader.dataset, IterableDataset))
    threads_tried = 2 * thread_counts(user.torch_threads or 1, 0, cores) if dev.kind == "cpu" else []
    with _random_state_kept(loader):
        cache = _find_cache(loader, step, user, batches, budget_s * CACHE_SHARE, cache_bytes, dev)
    cache_s = took.spent()  # the cache search is on top of budget_s
    more_runs = WIDEN_RUNS
    budget = _Budget(budget_s * (1 - CONFIRM_SHARE),
                     runs=3 + len(cands) + more_runs + len(threads_tried) + (REPEATS - 1) * (FINALISTS + 3))
    count = counter_of(loader)
    per_epoch = _length(loader)
    budget.shape = (epochs, per_epoch) if per_epoch else None
    with _random_state_kept(loader), _runs_where(budget, loader, step, dev, fresh) as runs_in:
        cache_s = took.spent()  # the fresh processes' start is on top of budget_s too
        kept: list = []
        mine = _must(_trial(loader, user, step, batches, dev, budget, keep=kept, count=count))
        longer_runs = run_length(mine, batches, per_epoch, budget)
        if longer_runs > batches:  # the first run was a probe: yours again, at the length every run reads
            batches = longer_runs
            budget.runs += 1
            mine = _must(_trial(loader, user, step, batches, dev, budget, count=count))
        budget.user = user
        if budget.shape:  # your whole run's seconds, as your first run predicts it, and that run's own warm-up
            # (a fresh process's first steps are slow, in every setting's warm-up alike)
            budget.user_run_s = budget.shape[0] * budget.shape[1] * (mine.samples / max(mine.batches, 1)) / mine.score \
                + max(0.0, (mine.read_s or 0.0) - mine.seconds)
        step_rate = step_alone(step, kept, batches=mine.batches, device=dev, deadline=budget.deadline(), count=count)
        alone = _trial(loader, user, None, batches, dev, budget, count=count) if budget.allows() else None
        # the first round yields to the repeats of your settings and of one finalist: a recommendation
        # needs them (settings slow to start can spend the budget on their single runs)
        first = (REPEATS - 1) * 2
        trials = [mine] + [t for s in cands if budget.allows() and budget.leaves(first)
                           and (t := _trial(loader, s, step, batches, dev, budget, count=count)) is not None]
        # widening yields to what decides: the step's threads and the repeats of the finalists
        _widen(loader, trials, step, batches, dev, budget, count, cores,
               keep=len(threads_tried) + (REPEATS - 1) * (FINALISTS + 2))
        waits = max(0.0, 1 - mine.samples_per_s / step_rate) > WAIT_NOISE
        best = choose(mine, trials, waits=waits)
        threads = None
        if dev.kind == "cpu":
            best, threads = _try_threads(loader, best, step, batches, dev, budget, trials)
        trials = _repeat(loader, trials, best, step, batches, dev, budget, count)
        mine = trials[0]
        waits = max(0.0, 1 - mine.samples_per_s / step_rate) > wait_noise(mine)  # the median of the user's runs
        trials = _race(loader, trials, step, batches, dev, budget, count, waits=waits)
        mine = trials[0]
        best, noise = decide(mine, trials, waits=waits)
        near = contender(mine, trials, waits=waits) if noise is not None else \
            within_reach(mine, trials, waits=waits) if best is mine else None
        if near is not None:
            trials = _settle(loader, trials, near, step, batches, dev, budget, count)
            mine = trials[0]
            best, noise = decide(mine, trials, waits=waits)
        if threads is not None:
            top = max((t for t in trials if t.settings.torch_threads == threads["tried"]
                       and t.settings.num_workers == best.settings.num_workers), key=lambda t: t.samples_per_s,
                      default=None)
            threads |= {"helped": best.settings.torch_threads != mine.settings.torch_threads,
                        **({"samples_per_s": round(top.samples_per_s, 2)} if top is not None else {})}
        if best is not mine:
            best = _persistent(best)
        longer = overturned = None

        def rest() -> _Budget:  # what is left of the budget, for a recommendation's longer runs
            left = _Budget(max(budget_s + cache_s - took.spent(), 0.0), 2 * CONFIRM_ROUNDS)
            left.fixed_s, left.shape, left.where = budget.fixed_s, budget.shape, budget.where
            return left

        if best is not mine:
            n = max(batches, min(CONFIRM_LENGTH * batches, per_epoch or CONFIRM_LENGTH * batches))
            longer = confirm(loader, mine, best, step, n, dev, rest(), count)
            not_held = longer is not None and _gain(
                whole_run(mine, best, trials, longer, epochs=epochs, batches=per_epoch), longer) < 1 + MIN_GAIN
            if not_held and (nxt := runner_up(mine, best, trials, waits=waits)) is not None:
                # the next setting that also beat yours in repeated runs gets its own longer runs
                if (again := confirm(loader, mine, nxt, step, n, dev, rest(), count)) is not None:
                    overturned, best, longer = best, nxt, again
                    if threads is not None:
                        threads["helped"] = best.settings.torch_threads != mine.settings.torch_threads
    run = whole_run(mine, best, trials, longer, epochs=epochs, batches=per_epoch)
    confirmed = None
    if longer is not None:
        steady = longer[1].samples_per_s / max(longer[0].samples_per_s, 1e-12)
        held, faster = _gain(run, longer) >= 1 + MIN_GAIN, over_faster(mine, longer, run)
        confirmed = {"batches": longer[2], "runs": min(len(longer[0].rates), len(longer[1].rates)),
                     "user": longer[0].as_dict(), "recommended": longer[1].as_dict(),
                     "steady_speedup": round(steady, 3),
                     "held": held and (faster is None or faster >= 1 + MIN_GAIN)}
        if faster is not None:
            confirmed["over_faster"] = round(faster, 3)
        if not confirmed["held"]:
            what = (f"your runs ran at two speeds here, and over your faster runs it would be {faster:.2f}x yours "
                    f"({_gain(run, longer):.2f}x over the mix of both): a run of your script may meet either speed"
                    if held else
                    f"over your whole run ({run['epochs']} x {run['batches']} batches) it would take "
                    f"{run['recommended_s']:.2f} s, yours {run['user_s']:.2f} s" if run is not None
                    else f"it measured {_span(longer[1])}, yours {_span(longer[0])}")
            noise = f"{label(best.settings)} was not confirmed by longer runs of {longer[2]} batches: {what}"
            best = mine  # your whole run as your confirming runs measured it
            run = whole_run(mine, best, trials, (longer[0], longer[0], longer[2]), epochs=epochs, batches=per_epoch)
            if threads is not None:
                threads["helped"] = False
    found = cache
    if cache is not None and cache.recommended and best is not mine and not best.settings.worker_threads:
        cache = _cache_at(cache, loader, step, best.settings, batches, budget_s * CACHE_SHARE, dev)
    run, cache = _cache_over_the_run(run, cache)
    lighter = _without_workers(mine, best, trials, longer, found, run, loader, step, batches, budget_s * CACHE_SHARE,
                               dev, epochs=epochs, per_epoch=per_epoch, at_best=cache)
    swapped = None
    if lighter is not None:
        name = "your settings" if lighter[0] is mine else label(lighter[0].settings)
        swapped = (f"with the cache, {name} {lighter[3]} and {label(best.settings)}, the fastest without it, "
                   f"{lighter[4]}: once the cache holds what the workers computed, they have little left to overlap, "
                   "and fewer is simpler")
        best, run, cache = lighter[:3]
        confirmed = None  # the longer runs confirmed the setting with workers
        if best is mine:
            noise = swapped
        if threads is not None:
            threads["helped"] = best.settings.torch_threads != mine.settings.torch_threads
    advice = _advice(mine, best, trials, step_rate, alone, dev, threads, loader, took.spent(), cores=cores)
    advice.runs_in = runs_in["where"]
    if budget.where["here"] is not None:
        advice.notes.append(f"measured in this process, not in fresh ones as your script starts: "
                            f"{budget.where['here']}")
    advice.budget_s, advice.within_noise, advice.cache = budget_s, noise, cache
    advice.whole_run, advice.confirmed = run, confirmed
    advice.knobs = decided_by(mine, best, trials, run)
    if overturned is not None:
        advice.notes.append(f"{label(overturned.settings)} measured fastest in the search, but longer runs did not "
                            f"confirm it over your whole run; {label(best.settings)} got longer runs next")
    if swapped is not None and best is not mine:
        advice.notes.append(swapped + f"; {label(best.settings)} was measured in the search's repeated runs and "
                            "the cache's passes, not in longer runs")
    elif best is not mine and longer is None:
        advice.notes.append("not confirmed by longer runs: the budget was spent first (a larger budget_s "
                            "leaves room for them)")
    basis = longer[0] if longer is not None else mine  # the user's runs the whole run was predicted from
    speeds = user_speeds(merged(mine, [longer[0]]) if longer is not None else mine,
                         (longer[1] if longer is not None else best) if advice.change else None,
                         basis=basis, speedup=advice.mixed_speedup)
    if speeds is not None:
        advice.user_speeds = speeds
        advice.notes.append(speeds["sentence"])
    if count.unknown:
        advice.notes.append(UNKNOWN_COUNT)
    if target is not None and not precision:
        with _random_state_kept(loader):
            with_target(advice, loader, step, kept, target, dev)
    elif precision:
        from placer.stream.precision_advice import advise_precision

        with _random_state_kept(loader):
            advise_precision(advice, loader, step, kept, precision, state, target, dev)
    return advice


def with_target(advice: LoaderAdvice, loader: Any, step: Any, kept: list, target: Any, dev: Device) -> None:
    """Plan the loader and step for ``target`` (:func:`placer.stream.target.plan_loader_for_target`):
    ``advice.target`` holds the plan, its JSON and text say what the target would be bound by."""
    from placer.stream.target import plan_loader_for_target

    advice.target = plan_loader_for_target(loader, step, kept, target, step_on_cpu=dev.kind == "cpu")


def _find_cache(loader: Any, step: Any, user: LoaderSettings, batches: int, budget_s: float,
                cache_bytes: int | None, dev: Device) -> Any:
    """Caching inside the dataset, found and measured with the user's settings (None when not looked for)."""
    if cache_bytes == 0:
        return None
    try:
        with torch_threads(user.torch_threads), _past_the_cores():
            return dataset_cache.find_cache(loader, step, loader_kwargs=user.kwargs(), batches=batches,
                                            budget_s=budget_s, budget_bytes=cache_bytes, sync=dev.synchronize)
    except Exception as e:  # noqa: BLE001 - a dataset that cannot be probed still gets its loader advice
        log.warning("could not look for a cache inside the dataset: %s: %s", type(e).__name__, e)
        return dataset_cache.CacheAdvice(None, reason=f"probing the dataset failed: {type(e).__name__}: {e}")


def _cache_at(cache: Any, loader: Any, step: Any, settings: LoaderSettings, batches: int, budget_s: float,
              dev: Device) -> Any:
    """The cache's passes measured again with the recommended ``settings`` (its workers, its step
    threads), so that the whole run it claims is that of the settings it runs with
    (:func:`placer.stream.dataset_cache.measure_at`); as found where that fails. Not for a thread-pool
    loader, which the cache's passes (a DataLoader) cannot run."""
    try:
        with _random_state_kept(loader), torch_threads(settings.torch_threads), _past_the_cores():
            return dataset_cache.measure_at(cache, loader, step, loader_kwargs=settings.kwargs(), batches=batches,
                                            budget_s=budget_s, sync=dev.synchronize)
    except Exception as e:  # noqa: BLE001 - the cache's first measurement still stands
        log.warning("could not measure the cache again with the recommended settings: %s: %s", type(e).__name__, e)
        return cache


def _repeat(loader: Any, trials: list[Trial], best: Trial, step: Any, batches: int, dev: Device, budget: _Budget,
            count: SampleCount) -> list[Trial]:
    """Run the finalists again, round-robin, until each has ``REPEATS`` runs (or the budget ends).

    The finalists: the user's settings (``trials[0]``), the ``FINALISTS`` fastest of the
    first round and the setting the first round chose. Returns ``trials`` with each
    finalist's runs merged (:func:`merged`), in the same order.
    """
    ranked = sorted(trials[1:], key=lambda t: -t.score)
    finalists = [trials[0], *[t for t in ranked[:FINALISTS]]]
    same = [t for t in ranked if (t.settings.num_workers, t.settings.prefetch_factor, t.settings.pin_memory)
            == (trials[0].settings.num_workers, trials[0].settings.prefetch_factor, trials[0].settings.pin_memory)]
    if same and same[0] not in finalists:  # the user's loader with other step threads: a step-bound choice
        finalists.append(same[0])
    if best not in finalists:
        finalists.append(best)
    return _rounds(loader, trials, finalists, step, batches, dev, budget, count, fits=budget.allows)


def _rounds(loader: Any, trials: list[Trial], finalists: list[Trial], step: Any, batches: int, dev: Device,
            budget: _Budget, count: SampleCount, fits: Callable[[], bool]) -> list[Trial]:
    """``REPEATS - 1`` more runs of each of ``finalists``, round-robin in the order given, each while
    ``fits()``. Returns ``trials`` with each finalist's runs merged (:func:`merged`), in the same order."""
    more: dict[int, list[Trial]] = {id(t): [] for t in finalists}
    for _ in range(REPEATS - 1):
        for t in finalists:
            if not fits():
                continue
            again = _trial(loader, t.settings, step, batches, dev, budget, count=count)
            if again is not None:
                more[id(t)].append(again)
    return [merged(t, more.get(id(t), [])) for t in trials]


#: settings run once that read faster than every repeated one, raced (repeated with the user's) per round
RIVALS = 2
#: rounds of racing: after one, the next fastest single runs may still read faster than the repeated
RACES = 2


def rivals(user: Trial, trials: list[Trial], *, waits: bool = True) -> list[Trial]:
    """The settings run once whose run read faster than the median of every repeated setting and
    ``MIN_GAIN`` faster than the user's (``RIVALS`` at most, fastest first): a single run is the luckiest
    of many, so the finalists of the first round often fall back when repeated, and the next fastest
    must be repeated before the user's settings are kept. On 2 cores a text-tokenising script's two
    repeated finalists (4 and 8 worker processes) fell back below the user's, while 2 processes at one
    torch thread, run once at 1.30x the user's, were never repeated and the advice kept the user's settings.
    A step that waits within noise (``waits=False``) races the user's loader at other step threads only."""
    repeated = _eligible(user, trials, waits=waits)
    bar = max([user.score * (1 + MIN_GAIN), *(t.score for t in repeated)])
    single = [t for t in trials if t is not user and len(t.rates) == 1 and t.score > bar
              and (waits or _loader_part(t.settings) == _loader_part(user.settings))]
    return sorted(single, key=lambda t: -t.score)[:RIVALS]


def _race(loader: Any, trials: list[Trial], step: Any, batches: int, dev: Device, budget: _Budget,
          count: SampleCount, *, waits: bool) -> list[Trial]:
    """Repeat the :func:`rivals` with the user's settings (the user's first in each round), up to
    ``RACES`` times, while each run leaves the budget room for two more (a round of :func:`_settle`)."""
    for _ in range(RACES):
        racers = rivals(trials[0], trials, waits=waits)
        if not racers:
            break
        budget.runs += (REPEATS - 1) * (len(racers) + 1)  # each either runs or, not fitting, is uncounted
        trials = _rounds(loader, trials, [trials[0], *racers], step, batches, dev, budget, count,
                         fits=lambda: budget.leaves(2))
    return trials


def _widen(loader: Any, trials: list[Trial], step: Any, batches: int, dev: Device, budget: _Budget,
           count: SampleCount, cores: int, keep: int = 0) -> None:
    """After the first round: more workers while the rate rises, then other prefetch depths (:func:`depth_bases`).

    A run starts only while it leaves room for ``keep`` more runs (those that decide: the
    step's threads and the repeats), at the mean run's length so far.
    """
    def seen(s: LoaderSettings) -> bool:
        return any(_measured_as(s) == _measured_as(t.settings) for t in trials)

    def attempt(s: LoaderSettings) -> None:
        nonlocal planned
        planned -= 1
        if budget.leaves(keep) and (t := _trial(loader, s, step, batches, dev, budget, count=count)) is not None:
            trials.append(t)

    planned = WIDEN_RUNS  # the runs the budget counted for widening
    for _ in range(MORE_ROUNDS):
        more = [s for s in more_workers(trials, cores=cores) if not seen(s)]
        if not more:
            break
        for s in more:
            attempt(s)
    for base in depth_bases(trials):
        for s in prefetch_depths(base, [t.settings for t in trials]):
            attempt(s)
    budget.runs -= max(planned, 0)  # counted but not tried: their shares go to the runs to come


def _length(loader: Any) -> int | None:
    """Batches per epoch, where the loader knows them."""
    try:
        return int(len(loader))
    except TypeError:
        return None


def confirm(loader: Any, user: Trial, best: Trial, step: Any, batches: int, dev: Device, budget: _Budget,
            count: SampleCount) -> tuple[Trial, Trial, int] | None:
    """Longer runs of the user's settings and the recommended, in turn, ``CONFIRM_ROUNDS`` rounds, then
    more while what is left of ``budget`` holds a round as long as the last: up to ``CONFIRM_AGREED`` in
    all, and on (up to ``CONFIRM_MAX_ROUNDS``) while either setting's runs spread by more than
    ``CONFIRM_SPREAD`` (:func:`run_spread`).

    Each run reads up to ``batches`` batches (each stops early at its share of ``budget``)
    from the start of an iterator, so that it measures the start-up, the steady state and
    the workers' shut-down again, at a length nearer the script's. A round starts only
    when what is left of ``budget`` covers the start-up costs seen so far. Returns both
    settings' runs merged (:func:`merged`) and the batches asked for, or None when no
    round fitted (or a run could not count a batch).
    """
    runs: dict[str, list[Trial]] = {"user": [], "best": []}
    for k in range(CONFIRM_MAX_ROUNDS):
        if budget.total.left() <= 2 * budget.fixed_s:  # both runs of the round, or none
            break
        if k >= CONFIRM_ROUNDS:
            if k >= CONFIRM_AGREED and max(run_spread(runs["user"]), run_spread(runs["best"])) <= CONFIRM_SPREAD:
                break
            # a round as long as the last one, or none: a run cut short by its deadline reads less
            if budget.total.left() <= sum(budget.walls[-2:]) + 2 * budget.fixed_s:
                break
            budget.runs = max(budget.runs, 0) + 2
        for key, t in (("user", user), ("best", best)):
            again = _trial(loader, t.settings, step, batches, dev, budget, count=count)
            if again is not None:
                runs[key].append(again)
    if not runs["user"] or not runs["best"]:
        return None
    return merged(runs["user"][0], runs["user"][1:]), merged(runs["best"][0], runs["best"][1:]), batches


def runner_up(user: Trial, best: Trial, trials: list[Trial], *, waits: bool = True) -> Trial | None:
    """The fastest setting besides ``best`` that also beat the user's in repeated runs (:func:`beats`),
    with persistent workers where it has worker processes; None if none. Where the longer runs overturn
    ``best``, it gets its own: on 2 cores a text-tokenising script's fastest in the search, 3 processes at
    prefetch 8, read its whole run slower than the user's in longer runs (three processes and the step
    on two cores), where 2 processes at prefetch 2, which also beat the user's, ran the script 1.3x faster."""
    key = _measured_as(best.settings)
    won = [t for t in _eligible(user, trials, waits=waits) if _measured_as(t.settings) != key and beats(t, user)]
    if not won:
        return None
    return _persistent(max(won, key=lambda t: t.score))


def _persistent(t: Trial) -> Trial:
    """A recommended setting with worker processes keeps them between epochs (``persistent_workers``)."""
    if t.settings.num_workers and not t.settings.worker_threads:
        return replace(t, settings=t.settings.model_copy(update={"persistent_workers": True}))
    return t


def _gain(run: dict[str, Any] | None, longer: tuple[Trial, Trial, int]) -> float:
    """The recommendation's gain as its longer runs measured it: over the whole run they predict
    (:func:`whole_run`), or, the run's shape unknown, in the steady state."""
    return run["speedup"] if run is not None else longer[1].samples_per_s / max(longer[0].samples_per_s, 1e-12)


def over_faster(mine: Trial, longer: tuple[Trial, Trial, int], run: dict[str, Any] | None) -> float | None:
    """The recommendation's gain over the user's faster runs, where all of theirs (the search's and the confirming
    runs) ran at two speeds (:func:`user_speeds`); None where they ran at one.

    A change is confirmed only where this gain, the one the advice claims, clears ``MIN_GAIN`` too: a 2-core Xeon
    VM ran text_infer as written at 4,000-5,000 or 7,000-7,700 samples/s, and the drop-in recommended worker
    processes in 2 of 12 runs with a claim of 0.91x and 0.95x yours (over the faster runs): a change whose
    claim is no gain is no advice (the script ran them 1.40x and 0.89x as written in those rounds, as the
    machine's speed met each)."""
    speeds = user_speeds(merged(mine, [longer[0]]), longer[1], basis=longer[0], speedup=_gain(run, longer))
    return None if speeds is None else speeds.get("speedup")


def run_spread(runs: list[Trial]) -> float:
    """How far one setting's runs disagree: the range of their whole-run samples/s (each run's own
    steady samples/s where the run's shape is unknown) over their median; 0 for fewer than two runs."""
    rates = [r for t in runs for r in (t.run_rates or (t.samples_per_s,))]
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / max(float(np.median(rates)), 1e-12)


def _refill(trials: list[Trial]) -> float | None:
    """One batch loaded while workers run: the first batch of a run without workers (none measured: None)."""
    zero = [t.first_batch_s for t in trials if not t.settings.num_workers]
    return float(np.median(zero)) if zero else None


def _costs(t: Trial, refill: float | None, per_epoch: int | None = None) -> Any:
    """A setting's run costs; from a run that read a whole epoch, its time per batch is that run's own
    (first batch to last), not the steady window's: an epoch too short to reach a steady state (its
    batches fit the workers' queue) runs as that run did."""
    from placer.stream.wholerun import costs

    if per_epoch and t.read >= per_epoch > 1 and t.read_s > t.first_batch_s:
        rate = (t.read - 1) * (t.samples / max(t.batches, 1)) / (t.read_s - t.first_batch_s)
        t = replace(t, samples_per_s=rate)
    return costs(first_batch_s=t.first_batch_s, samples_per_s=t.samples_per_s,
                 samples_per_batch=t.samples / max(t.batches, 1), close_s=t.close_s, refill_s=refill,
                 workers=t.settings.num_workers,
                 persistent=t.settings.persistent_workers and not t.settings.worker_threads)


def whole_run(user: Trial, best: Trial, trials: list[Trial], longer: tuple[Trial, Trial, int] | None, *,
              epochs: int, batches: int | None) -> dict[str, Any] | None:
    """The user's run (``epochs`` x ``batches``) predicted with their settings and the recommended.

    Each setting's costs (:class:`~placer.stream.wholerun.RunCosts`) come from its longer
    confirming runs where there are some, else from the search's runs; the recommended
    setting's costs are those of its own ``persistent_workers``. None when the batches
    per epoch are unknown (an iterable dataset without a length).
    """
    from placer.stream.wholerun import run_seconds

    if not batches:
        return None
    refill = _refill(trials)
    u, b = (longer[0], longer[1]) if longer is not None else (user, best)
    b = replace(b, settings=best.settings)
    cu, cb = _costs(u, refill, batches), _costs(b, refill, batches)
    user_s, best_s = run_seconds(cu, epochs=epochs, batches=batches), run_seconds(cb, epochs=epochs, batches=batches)
    samples = epochs * batches * (u.samples / max(u.batches, 1))
    out = {"epochs": epochs, "batches": batches, "user_s": round(user_s, 3), "recommended_s": round(best_s, 3),
           "speedup": round(user_s / max(best_s, 1e-12), 3),
           "user_samples_per_s": round(samples / user_s, 2), "recommended_samples_per_s": round(samples / best_s, 2),
           "user_costs": cu.as_dict(), "recommended_costs": cb.as_dict(),
           "from": "confirming runs" if longer is not None else "search runs"}
    if best.settings.num_workers and not best.settings.worker_threads and epochs > 1:
        other = replace(cb, persistent=not cb.persistent)
        out["without_persistent_s" if cb.persistent else "with_persistent_s"] = round(
            run_seconds(other, epochs=epochs, batches=batches), 3)
    return out


def with_cache(run: dict[str, Any] | None, cache: Any) -> dict[str, Any] | None:
    """The whole run with the cache the advice offers (``advice.loader()`` applies it): its first epoch
    fills the cache, the later ones read it, each at the ratio the cache search measured over the
    same batches with the user's settings (:func:`~placer.stream.wholerun.cached_run_seconds`).
    ``run`` unchanged when no cache is offered; its ``speedup`` is then the settings' alone."""
    from placer.stream.wholerun import RunCosts, cached_run_seconds

    if run is None or cache is None or not cache.recommended or not cache.uncached_s or not cache.cached_s \
            or cache.fill_s is None:
        return run
    uncached = float(np.median(cache.uncached_s))
    # filling does an uncached epoch's work and stores it: a fill measured faster is the machine's noise
    fill = max(1.0, cache.fill_s / max(cache.first_uncached_s, 1e-12))
    hit = float(np.median(cache.cached_s)) / max(uncached, 1e-12)
    costs = RunCosts(**{k: run["recommended_costs"][k] for k in
                        ("start_s", "per_batch_s", "close_s", "refill_s", "persistent")})
    best_s = cached_run_seconds(costs, epochs=run["epochs"], batches=run["batches"], fill=fill, hit=hit)
    samples = run["user_samples_per_s"] * run["user_s"]
    return {**run, "settings_speedup": run["speedup"], "settings_recommended_s": run["recommended_s"],
            "recommended_s": round(best_s, 3), "speedup": round(run["user_s"] / max(best_s, 1e-12), 3),
            "recommended_samples_per_s": round(samples / best_s, 2),
            "cache": {"fill": round(fill, 4), "hit": round(hit, 4)}}


def _without_workers(user: Trial, best: Trial, trials: list[Trial], longer: tuple[Trial, Trial, int] | None,
                     found: Any, run: dict[str, Any] | None, loader: Any, step: Any, batches: int, budget_s: float,
                     dev: Device, *, epochs: int, per_epoch: int | None,
                     at_best: Any = None) -> tuple[Trial, dict[str, Any], Any, str, str] | None:
    """The fastest setting measured without workers, with its whole run and cache and the two runs' words
    (its, ``best``'s), where the cache is offered beside ``best``'s workers and that setting runs the
    user's whole run with the cache within ``MIN_GAIN`` of ``best``'s (``run``); else None.

    The search ranks the settings without the cache, and a worker earns its place there by overlapping
    the work the cache then keeps: audio_cache_train's drop-in, on 2 cores, recommended one worker process
    (persistent) with the cache in 2 of 13 runs, tied without it with no workers at one torch thread (591
    and 593 samples/s over the run), and the script ran it 0.81x as fast as no workers with the cache
    (``benchmarks/results/plain-vm-epyc-quiet-v33-screened.md``). The setting without workers has its
    cache passes measured at its own settings (``found``, the cache search's, where they are the user's).

    Each whole run scales the cache's passes by its setting's own runs in the search, whose spread the
    passes then carry: in v38's advice before the grid (``plain-vm-epyc-quiet-v38-screened.md``) no
    workers' three search runs read 515 samples/s over the run against one worker's 602, and the worker
    with the cache stayed, which the script ran 0.87x as fast as no workers with it. So where ``best``'s
    passes were measured at its own settings (``at_best``), the passes also decide directly: both loaders
    ran the same batches, filling the cache and reading it, so the filling pass and ``epochs - 1`` reads
    are each setting's epochs with the cache, measured without a search run's rate in between.
    """
    if run is None or "cache" not in run or not best.settings.num_workers or not per_epoch:
        return None
    bare = [t for t in trials if not t.settings.num_workers]
    if not bare:
        return None
    alt = max(bare, key=lambda t: t.score)
    at = found if alt.settings == user.settings else _cache_at(found, loader, step, alt.settings, batches,
                                                                budget_s, dev)
    u = (longer[0], alt, longer[2]) if longer is not None else None
    alt_run, cache = _cache_over_the_run(whole_run(user, alt, trials, u, epochs=epochs, batches=per_epoch), at)
    if alt_run is None or "cache" not in alt_run:
        return None
    words = (f"would take {alt_run['recommended_s']:.2f} s over your whole run", f"{run['recommended_s']:.2f} s")
    if alt_run["recommended_s"] <= run["recommended_s"] * (1 + MIN_GAIN):
        return alt, alt_run, cache, *words
    mine, theirs = cached_passes_s(at, epochs), cached_passes_s(at_best, epochs)
    # each setting's passes measured at its own settings (where a new measurement failed, it is the user's)
    measured = all(c is not found or t.settings == user.settings for c, t in ((at, alt), (at_best, best)))
    if not measured or mine is None or theirs is None or mine > theirs * (1 + MIN_GAIN):
        return None
    n = at.batches or batches
    return alt, alt_run, cache, (f"ran the cache's passes over the same {n} batches (filling it, then {epochs - 1} "
                                 f"reads, as your {epochs} epochs would) in {mine:.2f} s"), f"in {theirs:.2f} s"


def cached_passes_s(cache: Any, epochs: int) -> float | None:
    """Seconds of ``epochs`` epochs over the cache's passes, measured at one setting: the filling pass
    (median), then ``epochs - 1`` cached reads (median); None where it has no such passes."""
    if cache is None or not getattr(cache, "recommended", False) or cache.fill_s is None or not cache.cached_s:
        return None
    return cache.fill_s + (epochs - 1) * float(np.median(cache.cached_s))


def _cache_over_the_run(run: dict[str, Any] | None, cache: Any) -> tuple[dict[str, Any] | None, Any]:
    """The whole run with the cache (:func:`with_cache`), when the cache makes it ``MIN_GAIN`` faster;
    otherwise the cache is not offered (``recommended`` False, and why): over a run of one epoch, or
    of a few short ones, filling the cache costs more than reading it saves."""
    cached = with_cache(run, cache)
    if cached is run or cached["recommended_s"] * (1 + MIN_GAIN) <= cached["settings_recommended_s"]:
        return cached, cache
    n = run["epochs"]
    why = (f"over your run ({n} epoch{'s' if n != 1 else ''} x {run['batches']} batches) it would take "
           f"{cached['recommended_s']:.2f} s against {run['recommended_s']:.2f} s without it: filling it costs "
           "more than reading it saves")
    return run, replace(cache, recommended=False, reason=why)


#: the knobs of a loader setting, as :func:`decided_by` names them
KNOBS = ("num_workers", "worker_threads", "prefetch_factor", "torch_threads", "persistent_workers")


def decided_by(user: Trial, best: Trial, trials: list[Trial], run: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The knobs the recommendation changes, each with what it gained where that was measured.

    A knob's gain: the recommended rate over that of the measured setting equal to the
    recommended but for that knob, set back to the user's value (``None``: no such run).
    ``persistent_workers``'s gain is the whole run's with and without it (predicted), both without the
    cache where one is offered (``without_persistent_s`` is the settings' alone: set against the run with
    the cache, a sensor script's advice read "persistent_workers False -> True (2.92x)" where keeping the
    workers saved 1.5 % of the run).
    """
    out = []
    for k in KNOBS:
        mine, theirs = getattr(user.settings, k), getattr(best.settings, k)
        if k == "prefetch_factor" and mine is None:  # no workers: the DataLoader's default depth
            mine = 2
        if k == "prefetch_factor" and not best.settings.num_workers or mine == theirs:
            continue
        if k == "persistent_workers" and not best.settings.num_workers:
            continue
        gain = None
        if k == "persistent_workers":
            if run is not None and "without_persistent_s" in run:
                with_it = run.get("settings_recommended_s", run["recommended_s"])
                gain = round(run["without_persistent_s"] / max(with_it, 1e-12), 3)
        else:
            back = _measured_as(best.settings.model_copy(update={k: mine}))
            base = next((t for t in trials if _measured_as(t.settings) == back), None)
            if base is not None:
                gain = round(best.score / max(base.score, 1e-12), 3)
        out.append({"knob": k, "yours": mine, "recommended": theirs, "gain": gain})
    return out


def wait_noise(user: Trial) -> float:
    """The step's wait that is within noise: ``WAIT_NOISE``, or half the spread of the user's runs if larger."""
    return max(WAIT_NOISE, user.spread / 2)


def decide(user: Trial, trials: list[Trial], *, waits: bool = True) -> tuple[Trial, str | None]:
    """The recommendation from repeated runs, and why a faster one was not taken (or None).

    Only settings run more than once (the user's too) may be recommended. A setting
    beats the user's when its median is ``MIN_GAIN`` faster and its slowest run is
    faster than the user's fastest (:func:`beats`). Of those, the cheapest within
    ``NEAR_BEST`` of the fastest; and a cheaper setting ranked at least as fast as
    that one is taken instead. A step that waits within noise (``waits=False``)
    gets no loader change: only fewer step threads, or fewer workers as fast.
    """
    repeated = [t for t in trials if len(t.rates) > 1 or t is user]
    eligible = _eligible(user, trials, waits=waits)
    winners = [t for t in eligible if beats(t, user)]
    if winners:
        fastest = max(winners, key=lambda t: t.score)
        near = [t for t in winners if t.score >= NEAR_BEST * fastest.score]
        choice = min(near, key=lambda t: _cost(t.settings))
        # a cheaper setting whose runs read at least as fast as the choice's: its own runs did not clear
        # the noise against yours, but a setting they match did (v36's numpy_augment_infer: one thread
        # worker at prefetch 2 beat yours in every round, no workers at one torch thread read faster
        # over the run, 699 against 697 samples/s, and the script ran it 1.11x the thread worker)
        cheaper = [t for t in eligible if _cost(t.settings) < _cost(choice.settings) and t.score >= choice.score]
        return min([*cheaper, choice], key=lambda t: _cost(t.settings)), None
    noise = None
    fastest = contender(user, trials, waits=waits)
    if fastest is not None:
        noise = (f"{label(fastest.settings)} measured {_span(fastest)}, yours {_span(user)}: "
                 "the difference is within noise")
    fewer = [t for t in repeated if t.settings.num_workers < user.settings.num_workers
             and t.score >= NEAR_BEST * user.score]
    return (min(fewer, key=lambda t: _cost(t.settings)) if fewer else user), noise


def _eligible(user: Trial, trials: list[Trial], *, waits: bool) -> list[Trial]:
    """The settings besides the user's that may be recommended: those run more than once and, for a step
    that waits within noise (``waits=False``), only the user's loader at other step threads."""
    return [t for t in trials if t is not user and len(t.rates) > 1
            and (waits or _loader_part(t.settings) == _loader_part(user.settings))]


def _loader_part(s: LoaderSettings) -> tuple:
    return s.num_workers, s.prefetch_factor, s.pin_memory


def contender(user: Trial, trials: list[Trial], *, waits: bool = True) -> Trial | None:
    """The fastest repeated setting whose median is ``MIN_GAIN`` faster than the user's (None if none):
    what :func:`decide` keeps the user's settings against when the gain is within noise. A step that
    waits within noise (``waits=False``) is compared with the user's loader at other step threads only."""
    fastest = max(_eligible(user, trials, waits=waits), key=lambda t: t.score, default=None)
    return fastest if fastest is not None and fastest.score > user.score * (1 + MIN_GAIN) else None


def within_reach(user: Trial, trials: list[Trial], *, waits: bool = True) -> Trial | None:
    """The fastest repeated setting whose median is not ``MIN_GAIN`` faster than the user's but whose
    fastest run is (None if none): a gain its runs' spread may hide, which :func:`_settle`'s more rounds
    tell from noise before the user's settings are kept. v29's text_infer (one epoch of 64 batches,
    0.4 s a run) kept the user's settings in 2 of 13 advice runs where 2 or 3 worker processes read
    0.99-1.03x yours over 3 runs spread by 14-37 %, with 41-46 s of its 60 s budget left; the script
    ran 2 at one torch thread 1.31x as fast as written."""
    reach = [t for t in _eligible(user, trials, waits=waits)
             if t.score <= user.score * (1 + MIN_GAIN) < max(t.scores)]
    return max(reach, key=lambda t: t.score, default=None)


def run_length(first: Trial, batches: int, per_epoch: int | None, budget: _Budget) -> int:
    """Batches per run: ``batches``, or more where a run of them lasts under ``MIN_RUN_S`` (at the
    rate of the user's ``first`` run), up to an epoch and to half of a run's share of the budget."""
    per_batch = first.seconds / max(first.batches, 1)
    if per_batch <= 0 or per_batch * batches >= MIN_RUN_S:
        return batches
    share = budget.total.left() / max(budget.runs, 1)
    n = min(math.ceil(MIN_RUN_S / per_batch), int(0.5 * share / per_batch))
    if per_epoch:
        n = min(n, per_epoch)
    return max(batches, n)


def _settle(loader: Any, trials: list[Trial], near: Trial, step: Any, batches: int, dev: Device, budget: _Budget,
            count: SampleCount) -> list[Trial]:
    """Up to ``SETTLE_ROUNDS`` more rounds of the user's settings (``trials[0]``) and ``near``, in turn,
    while the budget leaves room for both runs of a round (a round with a failed run is dropped whole,
    so that the rounds stay paired). Returns ``trials`` with the two settings' runs merged."""
    more: dict[int, list[Trial]] = {id(trials[0]): [], id(near): []}
    budget.runs += 2 * SETTLE_ROUNDS  # what is left is shared over these runs
    for done in range(SETTLE_ROUNDS):
        if not budget.leaves(1):
            budget.runs -= 2 * (SETTLE_ROUNDS - done) - 1
            break
        mine = _trial(loader, trials[0].settings, step, batches, dev, budget, count=count)
        theirs = _trial(loader, near.settings, step, batches, dev, budget, count=count)
        if mine is not None and theirs is not None:
            more[id(trials[0])].append(mine)
            more[id(near)].append(theirs)
    return [merged(t, more.get(id(t), [])) for t in trials]


def beats(t: Trial, user: Trial) -> bool:
    """Whether ``t`` beats the user's settings by more than the noise of their runs.

    Its median (:attr:`Trial.score`) must be ``MIN_GAIN`` faster, and either its slowest run
    faster than the user's fastest, or its runs faster than the user's run of the same round in
    so many of at least ``REPEATS`` rounds that a setting no faster would win as many at most as
    often as it wins all of ``REPEATS`` rounds (a sign test at 1/8: 3 of 3, 4 of 4, 5 of 6, 6 of 7).
    Runs are interleaved: one round's two runs share the machine's load, which on a shared
    machine moves both far more than a setting does, so a noisy setting's range alone would hide
    a gain that the rounds show.
    """
    if t.score <= user.score * (1 + MIN_GAIN):
        return False
    mine, yours = t.scores, user.scores
    if min(mine) > max(yours):
        return True
    pairs = paired(t, user)
    wins = sum(a > b for a, b in pairs)
    return len(pairs) >= REPEATS and sign_tail(wins, len(pairs)) <= 0.5 ** REPEATS


def paired(t: Trial, user: Trial) -> list[tuple[float, float]]:
    """Each run of ``t`` with the user's run of the same round: the user's last run started before it
    (every round runs the user's settings first), else the user's first. Runs without start times
    pair in the order run."""
    mine, yours = t.scores, user.scores
    if len(t.started) != len(mine) or len(user.started) != len(yours) or not yours:
        return list(zip(mine, yours))
    out = []
    for score, when in zip(mine, t.started):
        before = [k for k, w in enumerate(user.started) if w <= when]
        out.append((score, yours[before[-1] if before else 0]))
    return out


def user_speeds(user: Trial, recommended: Trial | None, *, basis: Trial | None = None,
                speedup: float | None = None) -> dict[str, Any] | None:
    """The user's runs split into two speeds (:func:`placer.timing.two_speeds`), with the recommendation's
    median over each and a sentence saying so; None where the runs show one speed.

    The same settings at two speeds is the machine, not the loader: a 2-core Xeon VM ran text_infer as
    written at 4,900 or 8,000 samples/s (4 and 8 of 12 runs of the script), and the drop-in's runs of it
    mostly at the slower, so a speed-up over their median held over the slower runs only (1.42x claimed;
    the script measured 1.03x over 12 rounds). Its pure-Python item work alone read 5,000-5,600 or
    8,200-9,200 items/s in one process minutes apart, with no fork or thread change between: the host's
    periods. The user is told both.

    ``speedup``, the whole run's speed-up over ``basis`` (the user's runs it was predicted from), is
    claimed over the faster runs instead (``speedup`` and ``over_the_mix`` in the result): the claim
    that holds whichever speed the user's script meets. ``user`` holds all the user's runs."""
    split = two_speeds(list(user.scores))
    if split is None:
        return None
    slow, fast = split
    what = "samples/s over your run" if user.run_rates else "samples/s"
    out: dict[str, Any] = {"slow": [round(x, 1) for x in slow], "fast": [round(x, 1) for x in fast]}
    text = (f"your settings ran at two speeds here, {len(slow)} runs at {slow[0]:,.0f}-{slow[-1]:,.0f} and "
            f"{len(fast)} at {fast[0]:,.0f}-{fast[-1]:,.0f} {what}: the same settings, so the machine moved them, "
            "not the loader")
    if recommended is not None:
        rec = float(np.median(list(recommended.scores)))
        out["over_slow"] = round(rec / float(np.median(slow)), 3)
        out["over_fast"] = round(rec / float(np.median(fast)), 3)
        text += (f". The recommendation's runs ({rec:,.0f} {what}) are {out['over_slow']:.2f}x your slower runs and "
                 f"{out['over_fast']:.2f}x your faster ones")
        if speedup is not None and basis is not None and basis.scores:
            mix = float(np.median(list(basis.scores)))
            out["over_the_mix"] = round(speedup, 3)
            out["speedup"] = round(min(speedup, speedup * mix / float(np.median(fast))), 3)
            text += (f"; the speed-up claimed above ({out['speedup']:.2f}x) is over your faster runs, "
                     f"{speedup:.2f}x over the mix measured here: a run of your script may meet either speed")
        else:
            text += "; a run of your script may meet either speed"
    else:
        text += f": a run of your script may take {fast[len(fast) // 2] / slow[len(slow) // 2]:.2f}x as long as another"
    out["sentence"] = text
    return out


def _span(t: Trial) -> str:
    lo, hi = min(t.scores), max(t.scores)
    what = "samples/s over your run" if t.run_rates else "samples/s"
    return f"{lo:,.0f}-{hi:,.0f} {what}, {len(t.scores)} runs" if len(t.scores) > 1 else f"{lo:,.0f} {what}"


def _trial(loader: Any, settings: LoaderSettings, step: Any, batches: int, dev: Device, budget: _Budget,
           keep: list | None = None, count: SampleCount | None = None) -> Trial | None:
    measured = settings.model_copy(update={"persistent_workers": False})
    started = time.perf_counter()
    queue = settings.num_workers * (settings.prefetch_factor or 2)
    kw = dict(batches=min(max(batches, 2 * queue + 2), 4 * batches), warmup=max(1, settings.num_workers),
              device=dev, deadline=budget.deadline(), keep=keep, count=count or counter_of(loader), drain=queue,
              give_up_s=budget.give_up_s(settings))
    with Clock() as wall:
        trial = _fresh_run(budget, measured, step, settings.torch_threads, kw)
        if trial is _HERE:
            with torch_threads(settings.torch_threads), _past_the_cores():
                trial = run_loader(rebuild(loader, measured), step, **kw)
    budget.ran(wall.wall, trial.seconds if trial is not None else 0.0, cut=trial is not None and trial.cut)
    if trial is None:
        return None
    trial = replace(trial, settings=settings, started=(started,))
    return replace(trial, run_rates=(run_rate(trial, *budget.shape),)) if budget.shape else trial


#: what :func:`_fresh_run` gives where the run is to be made in this process
_HERE = object()


def _fresh_run(budget: _Budget, settings: LoaderSettings, step: Any, threads: int | None,
               kw: dict[str, Any]) -> Any:
    """The run in a fresh process (:mod:`placer.stream.fresh`), or ``_HERE``: where the budget has none, or
    the fresh process failed (its runs then go on in this process, and the budget says why)."""
    where = budget.where
    if where["fresh"] is None:
        return _HERE
    from placer.stream.fresh import FreshUnavailable

    try:
        return where["fresh"].run(settings, step is not None, threads, kw)
    except FreshUnavailable as e:
        where["fresh"].close()
        where["fresh"], where["here"] = None, str(e)
        log.warning("placer: the loader's runs go on in this process: %s", e)
        return _HERE


@contextlib.contextmanager
def _past_the_cores() -> Iterator[None]:
    """torch's warning that a DataLoader starts more worker processes than the cores, silenced for the
    advice's own runs: the search tries more on purpose, while the rate rises (:func:`more_workers`);
    a recommendation of more says so in its notes."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


def run_rate(t: Trial, epochs: int, batches: int) -> float:
    """Samples/s of the script's whole run (``epochs`` x ``batches``) as one measured run predicts it.

    Start-up, the workers' shut-down at each epoch's end (none with persistent workers) and
    the steady state, as :func:`whole_run` adds them up: a setting whose workers take long
    to start, or whose queue holds a short epoch whole (its steady window then measures the
    queue, not the workers), is ranked by what the script's own clock would see.
    """
    from placer.stream.wholerun import run_seconds

    seconds = run_seconds(_costs(t, None, batches), epochs=epochs, batches=batches)
    return epochs * batches * (t.samples / max(t.batches, 1)) / max(seconds, 1e-12)


def _must(trial: Trial | None) -> Trial:
    if trial is None:
        raise ValueError("the loader yielded too few batches to measure: it needs at least two "
                         "(more with workers: one per worker, then one counted)")
    return trial


def choose(user: Trial, trials: list[Trial], *, waits: bool = True) -> Trial:
    """The recommendation: the cheapest setting near the fastest when that beats the user's clearly.

    Otherwise the user's own settings, or fewer workers when they are as fast. A step
    that waits for data only within noise (``waits=False``) sets the pace: no faster
    loader setting is recommended for it, whatever a single run measured.
    """
    best = max(trials, key=lambda t: t.score)
    if waits and best.score > user.score * (1 + MIN_GAIN):
        near = [t for t in trials if t.score >= NEAR_BEST * best.score]
        return min(near, key=lambda t: _cost(t.settings))
    fewer = [t for t in trials if t.settings.num_workers < user.settings.num_workers
             and t.score >= NEAR_BEST * user.score]
    return min(fewer, key=lambda t: _cost(t.settings)) if fewer else user


def thread_counts(now: int, workers: int, cores: int) -> list[int]:
    """Intra-op thread counts tried for the step: the cores the workers leave, and 1; fewer than ``now``.

    Tried with or without workers: a step whose threads contend with other work on the
    cores (the loader's, or another program's) can run several times faster on fewer.
    """
    return sorted({n for n in (max(1, cores - workers), 1) if n < now}, reverse=True)


def _try_threads(loader: Any, best: Trial, step: Any, batches: int, dev: Device, budget: _Budget,
                 trials: list[Trial]) -> tuple[Trial, dict[str, Any] | None]:
    """Fewer intra-op threads for the step: measured with the best loader setting found, the user's,
    and the best of each kind of workers (processes, threads).

    Knobs interact: on a machine with few cores, loader workers and the step's intra-op
    threads compete for them, so workers that lose to the user's settings at the step's
    threads may win with fewer (2 loader threads and 1 torch thread beat the rest by 1.3x
    on a 2-core machine, where 2 loader threads at 2 torch threads did not).
    """
    now = best.settings.torch_threads
    tried = []
    # with the best loader setting found, and with the user's (which a step that waits for data
    # only within noise keeps: fewer threads may still make its step faster)
    bases = [best.settings, *([trials[0].settings] if best is not trials[0] else [])]
    for kind in (False, True):  # the best process workers, the best thread workers
        same = [t for t in trials if t.settings.num_workers and t.settings.worker_threads is kind
                and t.settings.torch_threads == now]
        top = max(same, key=lambda t: t.score, default=None)
        if top is not None and top.settings not in bases:
            bases.append(top.settings)
    for base in bases:
        for n in thread_counts(now, base.num_workers, _cores()):
            s = base.model_copy(update={"torch_threads": n})
            seen = next((t for t in trials if _measured_as(t.settings) == _measured_as(s)), None)
            t = seen if seen is not None else (_trial(loader, s, step, batches, dev, budget)
                                               if budget.allows() else None)
            if t is not None and t not in tried:  # measured in the first round: not run again
                if seen is None:
                    trials.append(t)
                tried.append(t)
    if not tried:
        return best, None
    top = max(tried, key=lambda t: t.score)
    helped = top.score > best.score * (1 + MIN_GAIN)
    info = {"current": now, "tried": top.settings.torch_threads, "samples_per_s": round(top.samples_per_s, 2),
            "helped": helped, "all_tried": {str(t.settings.torch_threads): round(t.samples_per_s, 2) for t in tried}}
    return (top if helped else best), info


def _advice(mine: Trial, best: Trial, trials: list[Trial], step_rate: float, alone: Trial | None, dev: Device,
            threads: dict | None, loader: Any, seconds: float, cores: int | None = None) -> LoaderAdvice:
    loader_rate = alone.samples_per_s if alone is not None else None
    bottleneck = "loader" if loader_rate is not None and loader_rate < step_rate else "step"
    notes = []
    if best.settings.worker_threads:
        pass  # a thread pool has no processes to keep
    elif best.settings.num_workers and not best.settings.persistent_workers:
        notes.append("for more than one epoch, persistent_workers=True keeps the worker processes between "
                     f"epochs (starting them took {best.first_batch_s:.2f} s before the first batch)")
    elif best.settings.num_workers and best is not mine:
        notes.append("persistent_workers=True keeps the worker processes between epochs (starting them took "
                     f"{best.first_batch_s:.2f} s before the first batch); written into your DataLoader it also "
                     "makes torch draw one random number fewer per epoch (the workers' seed), so a shuffled "
                     "order or your script's own random draws differ from epoch 2 on: advice.loader() draws it "
                     "and reads your batches")
    if best.settings.num_workers != mine.settings.num_workers and draws_unseeded(loader.dataset):
        notes.append("a dataset that draws random numbers in __getitem__ draws them in the workers, each seeded "
                     "from the loader's generator and its worker id: with other num_workers, other draws")
    if cores and best is not mine and not best.settings.worker_threads and best.settings.num_workers > cores:
        notes.append(f"num_workers={best.settings.num_workers} starts more worker processes than this machine's "
                     f"{cores} cores: torch warns about that when the loader starts; the runs above measured it "
                     "faster than fewer")
    if best.settings.pin_memory and not mine.settings.pin_memory:
        notes.append("pinned batches copy to the GPU faster, and without blocking with .to(device, non_blocking=True)")
    return LoaderAdvice(user=mine, recommended=best, trials=trials, bottleneck=bottleneck,
                        wait_fraction=max(0.0, 1 - mine.samples_per_s / step_rate), step_samples_per_s=step_rate,
                        loader_samples_per_s=loader_rate, step_device=dev.name, threads=threads, notes=notes,
                        seconds=seconds, source=loader)


def draws_unseeded(dataset: Any) -> bool:
    """Whether ``dataset[i]`` draws random numbers that the index does not fix.

    The check: read the first sample twice, under two different states of Python's,
    numpy's and torch's global random generators (restored afterwards). A dataset that
    draws none, or seeds its own generator from the index, gives equal samples; one
    that draws from a global generator gives different ones. Only such a dataset draws
    other numbers when ``num_workers`` changes (each worker seeds its own generators).
    An iterable dataset, or one that cannot be read here, is assumed not to draw.
    """
    import numpy as np
    import torch

    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return False
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        if len(dataset) == 0:
            return False
        out = []
        for seed in (12345, 54321):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            out.append(dataset[0])
        return not _equal(out[0], out[1])
    except Exception as e:  # a dataset that cannot be read twice: say nothing rather than guess
        log.debug("could not check whether the dataset draws random numbers: %s", e)
        return False
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _equal(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes") and hasattr(b, "tobytes"):  # PIL images and the like
        try:
            return a.tobytes() == b.tobytes()
        except Exception:
            return False
    try:
        return bool(a == b)
    except Exception:
        return False


# -- words ---------------------------------------------------------------------------------
def _rate(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f} samples/s"


def verdict(a: LoaderAdvice) -> str:
    """One sentence: who waits for whom."""
    who = "The GPU" if is_real_gpu(a.step_device) else "The step"
    waits = f"{who} waits for data {a.wait_fraction:.0%} of the time"
    if a.step_samples_per_s is None:
        return f"{waits} (measured in your loop)."
    if a.bottleneck == "loader":
        return (f"{waits}: the loader caps you at {_rate(a.loader_samples_per_s)}, the step could take "
                f"{a.step_samples_per_s:,.0f}.")
    if a.wait_fraction > wait_noise(a.user):
        return (f"{waits}: the loader alone delivers {_rate(a.loader_samples_per_s)}, more than the step's "
                f"{_rate(a.step_samples_per_s)}, yet together they are slower (they share the cores).")
    if a.change and a.speedup > 1 + MIN_GAIN:
        return (f"{waits}: the step sets the pace ({_rate(a.step_samples_per_s)}; the loader alone delivers "
                f"{_rate(a.loader_samples_per_s)}).")
    return (f"{waits}: the loader is fast enough ({_rate(a.loader_samples_per_s)} alone); the step takes "
            f"{_rate(a.step_samples_per_s)}.")


def _row(t: Trial, yours: bool) -> str:
    s = t.settings
    workers = f"{s.num_workers} threads" if s.worker_threads else str(s.num_workers)
    return (f"  {workers:>11} {s.prefetch_factor or '-':>15} {str(s.pin_memory):>10} {s.torch_threads:>13} "
            f"{t.samples_per_s:>10,.0f} {t.first_batch_s:>9.2f} s {len(t.rates):>4} {t.spread:>6.0%}"
            + (f" {t.score:>9,.0f}" if t.run_rates else "") + f"{'  (yours)' if yours else ''}"
            + ("  (stopped in its warm-up: slower to its first batches than your whole run)" if t.cut else ""))


def describe(a: LoaderAdvice) -> list[str]:
    """The advice as lines of text."""
    budget = f" of a {a.budget_s:g} s budget" if a.budget_s is not None else ""
    lines = [f"Loader advice ({len(a.trials)} settings measured in {a.seconds:.1f} s{budget}; "
             f"loader on cpu, step on {a.step_device})", verdict(a),
             f"Your settings: {label(a.user.settings)} -> {_rate(a.user.samples_per_s)}"]
    if a.change:
        kw = ", ".join(f"{k}={v}" for k, v in a.recommended.settings.kwargs().items())
        where = "over your whole run" if a.whole_run is not None else "in the steady state"
        if a.speedup != a.mixed_speedup:
            where += f" at your faster runs' speed ({a.mixed_speedup:.2f}x over the mix of both measured here)"
        lines += [f"Recommended:   {label(a.recommended.settings)} -> {_rate(a.recommended.samples_per_s)}, "
                  f"{a.speedup:.2f}x yours {where}",
                  f"  placer.stream.ThreadLoader(dataset, ..., {kw})  (advice.loader() builds it; threads, not "
                  "processes: a Dataset read from several threads must guard any state it changes)"
                  if a.recommended.settings.worker_threads else f"  DataLoader(..., {kw})"]
        if a.recommended.settings.torch_threads != a.user.settings.torch_threads:
            lines.append(f"  torch.set_num_threads({a.recommended.settings.torch_threads})")
    elif a.within_noise:
        lines.append(f"Recommended:   keep your settings ({a.within_noise})")
    elif len(a.trials) > 1 and a.bottleneck == "step" and a.wait_fraction <= wait_noise(a.user):
        lines.append("Recommended:   keep your settings (the step waits for data only within noise: "
                     "no loader setting can make it faster)")
    elif len(a.trials) > 1:
        lines.append("Recommended:   keep your settings (no setting tried was more than "
                     f"{MIN_GAIN:.0%} faster)")
    if a.cache is not None and a.cache.recommended:  # what was not offered, and why: in the JSON
        lines.append(a.cache.sentence())
    lines += _whole_run_lines(a)
    lines += ["Measured (steady state, the median of the runs; the first batch waits for the workers to start; "
              "spread: the runs' range over their median; your run: samples/s over your epochs x batches, "
              "start-up and epoch ends included, which ranks them):" if len(a.trials) > 1
              else "Measured (your loop, after its first batch):",
              f"  {'num_workers':>11} {'prefetch_factor':>15} {'pin_memory':>10} {'torch_threads':>13} "
              f"{'samples/s':>10} {'first batch':>11} {'runs':>4} {'spread':>6}"
              + (f" {'your run':>9}" if a.user.run_rates else "")]
    lines += [_row(t, t is a.user) for t in a.trials]
    return lines + [f"Note: {n}" for n in a.notes]


def _whole_run_lines(a: LoaderAdvice) -> list[str]:
    """The whole run predicted, the confirming runs, and the knobs that decided."""
    out = []
    w = a.whole_run
    if w is not None:
        uc, rc = w["user_costs"], w["recommended_costs"]
        line = (f"Your whole run ({w['epochs']} epoch{'s' if w['epochs'] != 1 else ''} x {w['batches']} batches), "
                f"predicted from the {w['from']}: {w['user_s']:.2f} s with your settings (start-up "
                f"{uc['start_s']:.2f} s, {uc['per_batch_s'] * 1000:.1f} ms a batch)")
        if a.change:
            line += (f", {w['recommended_s' if 'cache' not in w else 'settings_recommended_s']:.2f} s "
                     f"recommended (start-up {rc['start_s']:.2f} s, {rc['per_batch_s'] * 1000:.1f} ms a batch): "
                     f"{w['speedup' if 'cache' not in w else 'settings_speedup']:.2f}x")
        out.append(line)
        if "cache" in w:
            c = w["cache"]
            out.append(f"  with the cache (advice.loader()): {w['recommended_s']:.2f} s, {w['speedup']:.2f}x yours "
                       f"(its first epoch fills it at {c['fill']:.2f}x an uncached epoch's time, later epochs "
                       f"read it at {c['hit']:.2f}x)")
        if "without_persistent_s" in w:
            out.append(f"  without persistent_workers: {w['without_persistent_s']:.2f} s (the workers would "
                       "start again every epoch)")
    c = a.confirmed
    if c is not None:
        out.append(f"Confirmed by longer runs ({c['runs']} each of up to {c['batches']} batches, interleaved): "
                   f"{c['recommended']['samples_per_s']:,.0f} vs your {c['user']['samples_per_s']:,.0f} samples/s"
                   + ("" if c["held"] else
                      f" - not enough over your faster runs ({c['over_faster']:.2f}x; your runs ran at two "
                      "speeds): your settings are kept" if c.get("over_faster", 2.0) < 1 + MIN_GAIN else
                      " - faster in the steady state, but not by enough over your whole run (worker start-up "
                      "and epoch ends take back the gain): your settings are kept"
                      if c.get("steady_speedup", 1.0) > 1 + MIN_GAIN and a.whole_run is not None
                      else " - not enough: your settings are kept"))
    if a.knobs:
        def part(k: dict) -> str:
            return f"{k['knob']} {k['yours']} -> {k['recommended']}" + (
                f" ({k['gain']:.2f}x)" if k["gain"] is not None else "")

        # a knob whose own measured gain is within noise came along with the others
        decided = [k for k in a.knobs if k["gain"] is None or k["gain"] > 1 + MIN_GAIN]
        along = [k for k in a.knobs if k not in decided]
        if decided:
            out.append("Decided by: " + "; ".join(part(k) for k in decided))
        if along:
            out.append("Changed along (no clear gain of its own measured): " + "; ".join(part(k) for k in along))
    return out


# -- measuring the user's own loop ---------------------------------------------------------
class MeasuredLoader:
    """The user's loader, iterated as usual, with the wait on each ``next(loader)`` recorded.

    The step's time is the time between fetches. :meth:`advice` reports, like
    :func:`advise_loader`, who waits for whom, from this loop alone (no settings tried).
    """

    def __init__(self, loader: Any, *, device: Any = None):
        self.loader = loader
        self.device = _step_device(device)
        self.fetch_s: list[float] = []
        self.samples: list[int] = []
        self.count = counter_of(loader)
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.fetch_s, self.samples = [], []
        it = iter(self.loader)
        with Clock(settle=False) as loop:  # the user's loop, in their allocator's state
            try:
                while True:
                    with Clock(settle=False) as fetch:
                        batch = next(it, _END)
                    if batch is _END:
                        break
                    self.fetch_s.append(fetch.wall)
                    self.samples.append(self.count(batch))
                    self.seconds = loop.elapsed()
                    yield batch
            finally:
                self.device.synchronize()
                self.seconds = loop.elapsed()

    def trial(self) -> Trial:
        """The loop's steady state: every batch but the first (whose wait includes starting workers)."""
        if len(self.fetch_s) < 2:
            raise ValueError("measure() needs a loop of at least two batches")
        seconds = self.seconds - self.fetch_s[0]
        samples = sum(self.samples[1:])
        return Trial(settings=settings_of(self.loader), samples_per_s=samples / seconds,
                     first_batch_s=self.fetch_s[0], fetch_fraction=sum(self.fetch_s[1:]) / seconds,
                     batches=len(self.samples) - 1, samples=samples, seconds=seconds)

    def advice(self) -> LoaderAdvice:
        """Who waits for whom in this loop: the share of its time spent in ``next(loader)``."""
        t = self.trial()
        fetch = t.fetch_fraction * t.seconds
        step = t.seconds - fetch
        loader_rate = t.samples / fetch if fetch > 0 else None
        step_rate = t.samples / step if step > 0 else None
        loader_bound = fetch > step
        notes = ["measured in your loop: no settings were tried (advise_loader tries them)"]
        if self.count.unknown:
            notes.append(UNKNOWN_COUNT)
        return LoaderAdvice(user=t, recommended=t, trials=[t], bottleneck="loader" if loader_bound else "step",
                            wait_fraction=t.fetch_fraction, step_samples_per_s=step_rate,
                            loader_samples_per_s=loader_rate, step_device=self.device.name, notes=notes,
                            seconds=self.seconds, source=self.loader)

    def __str__(self) -> str:
        return str(self.advice())


def measure(loader: Any, *, device: Any = None) -> MeasuredLoader:
    """Wrap a DataLoader so that ``for batch in measure(loader)`` records its fetch times.

    ``str()`` of the result (or its :meth:`~MeasuredLoader.advice`) after the loop
    says what share of the loop waited on the loader.
    """
    return MeasuredLoader(loader, device=device)
