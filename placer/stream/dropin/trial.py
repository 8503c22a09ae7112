"""A measured run of the user's loader with the step, as plain data: :class:`Trial`, and its settings in words.

May import: numpy, placer.data.stream, placer.timing, placer.stream.dropin.memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from placer.data.stream import LoaderSettings
from placer.stream.dropin.memory import RunMemory, combined
from placer.timing import Measurement


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
    #: the memory of the run's process and of the loader's workers (:mod:`placer.stream.dropin.memory`)
    memory: RunMemory | None = field(default=None, compare=False)

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
        return {**self.settings.as_dict(), "samples_per_s": round(self.samples_per_s, 2),
                "first_batch_s": round(self.first_batch_s, 4), "fetch_fraction": round(self.fetch_fraction, 4),
                "batches": self.batches, "samples": self.samples, "seconds": round(self.seconds, 4),
                "repeats": [round(r, 2) for r in self.rates], "spread": round(self.spread, 4),
                "close_s": round(self.close_s, 4), "run_rates": [round(r, 2) for r in self.run_rates],
                "reads": [[n, round(s, 4), round(f, 4)] for n, s, f in self.each_read],
                "memory_bytes": None if self.memory is None else self.memory.as_dict(),
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
                   reads=tuple(r for t in runs for r in t.each_read), memory=combined([t.memory for t in runs]))


def label(s: LoaderSettings) -> str:
    """Settings in words: ``num_workers=2 (processes), prefetch_factor=2, ...``."""
    parts = [f"num_workers={s.num_workers} ({s.worker_kind})"]
    if s.num_workers:
        parts.append(f"prefetch_factor={s.prefetch_factor}")
        if not s.worker_threads:
            parts.append(f"persistent_workers={s.persistent_workers}")
        if not s.in_order:
            parts.append("in_order=False")
        if s.threads_per_worker is not None:
            parts.append(f"{s.threads_per_worker} thread{'s' if s.threads_per_worker > 1 else ''} per worker")
    return ", ".join([*parts, f"pin_memory={s.pin_memory}", f"torch threads {s.torch_threads}"])


def span(t: Trial) -> str:
    lo, hi = min(t.scores), max(t.scores)
    what = "samples/s over your run" if t.run_rates else "samples/s"
    return f"{lo:,.0f}-{hi:,.0f} {what}, {len(t.scores)} runs" if len(t.scores) > 1 else f"{lo:,.0f} {what}"
