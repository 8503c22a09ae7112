"""The memory a setting holds: measured where its run iterates the loader, projected over the user's whole run.

May import: numpy, placer.stream.procmem; placer.timing.

What is measured
----------------
Each run (:func:`~placer.stream.dropin.measuring.run_loader`, in a fresh process or in this one: where the
loader iterates) reads the memory of its process and of the loader's worker processes
(:func:`placer.stream.procmem.memory`: the main process's own memory, the workers' unique set sizes summed,
and both proportional set sizes) three times: after the warm-up batches (the workers started, each has made
its first batches), half-way through the counted batches, and after the last one, before the workers stop.
A drop-in run reads at most one epoch, so these are its per-epoch figures. The half-way reading's seconds
are taken out of the run's timed window.

The projection rule
-------------------
Growth per batch, for the main process and for the workers (summed), is the smaller of the two halves'
growth per batch: growth that goes on in both halves (a worker copying the Dataset's pages as it reads
them) is extrapolated; a step in one half (an allocator's arena, a buffer made once) is not. Growth below
:data:`NOISE_BYTES` a process over the run counts as none. Over the user's run (``epochs`` x the loader's
batches an epoch):

- the main process lives through every batch: ``main = main at the start + growth x epochs x batches``,
  its start no less than the memory of the process that called the advice (the script's main process: a
  fresh run's process holds only a copy of the loader and the step);
- the workers live through one epoch (they start again each epoch), or through the whole run with
  ``persistent_workers`` (as the drop-in recommends them): ``workers = workers at the start + growth x the
  batches they live through``, the growth capped per worker at the Dataset's Python objects where it holds
  many (copy-on-read copies a page once: a worker that has read every record grows no more), else at the
  main process's memory (no worker copies more than the process it forked from holds); a worker that
  leaks past that cap is understated;
- neither is below what the runs measured at their end.

The workers' growth is the Dataset's more than the setting's (each sample read copies its pages into
the worker that reads it, whatever the number of workers): a setting whose runs were too short to show
it grows, for the projection, at least as the setting with worker processes whose runs read the most
batches measured.

Where the batches an epoch are unknown (an iterable dataset without a length), the projection is the
measured end. A setting's runs combine (:func:`combined`): the largest start and end, the median growth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placer.stream import procmem
from placer.timing import Clock

#: growth over a run below this many bytes a process is the allocator's noise (a page or a malloc pad), not growth
NOISE_BYTES = 512 * 2**10
#: the parts a figure has
PARTS = ("main", "workers")


@dataclass(frozen=True)
class RunMemory:
    """One setting's memory, from one run or several (:func:`combined`): bytes."""

    #: :func:`placer.stream.procmem.memory` after the warm-up, and after the last counted batch
    start: dict[str, int]
    end: dict[str, int]
    #: growth per counted batch of ``main`` and of ``workers`` (the projection rule: the module's docstring)
    per_batch: dict[str, float]
    #: counted batches between the readings (summed over runs), and the runs
    batches: int
    runs: int = 1
    #: each run's growth per batch, in the order run
    each: tuple[dict[str, float], ...] = field(default=(), compare=False)

    @property
    def processes(self) -> int:
        return int(self.end.get("processes", 0))

    @property
    def total(self) -> int:
        """The main process and its workers together at the run's end."""
        return int(self.end["main"] + self.end["workers"])

    def as_dict(self) -> dict[str, Any]:
        """The figures at the run's end (``main``, ``workers`` summed), with the start and the growth."""
        e = self.end
        return {"main": e["main"], "workers": e["workers"], "worker_processes": self.processes,
                "main_uss": e.get("main_uss"), "main_pss": e.get("main_pss"), "workers_pss": e.get("workers_pss"),
                "start": {k: self.start[k] for k in PARTS},
                "growth_per_batch": {k: round(v, 1) for k, v in self.per_batch.items()},
                "batches": self.batches, "runs": self.runs}


def growth(start: dict[str, int], mid: dict[str, int] | None, end: dict[str, int], halves: tuple[int, int]) -> \
        dict[str, float]:
    """Growth per batch of each part by the projection rule: the smaller half's, none below the noise.

    >>> s, m, e = {"main": 100, "workers": 0, "processes": 2}, {"main": 9 << 20, "workers": 4 << 20}, \
        {"main": 9 << 20, "workers": 8 << 20, "processes": 2}
    >>> growth(s, m, e, (4, 4))  # main: one step in the first half; workers: steady
    {'main': 0.0, 'workers': 1048576.0}
    """
    n = max(sum(halves), 1)
    out = {}
    for k in PARTS:
        floor = NOISE_BYTES * max(1, end.get("processes", 0) if k == "workers" else 1)
        if end[k] - start[k] < floor:
            out[k] = 0.0
        elif mid is None or min(halves) < 1:
            out[k] = (end[k] - start[k]) / n
        else:
            out[k] = max(0.0, min((mid[k] - start[k]) / halves[0], (end[k] - mid[k]) / halves[1]))
    return out


class Watch:
    """The readings of one run: :meth:`start` after the warm-up, :meth:`counted` after each counted batch (the
    reading half-way through ``planned`` counted batches), :meth:`end` after the last; :attr:`paused_s`, the
    half-way reading's seconds (inside the timed window)."""

    def __init__(self, it: Any, planned: int):
        self.it = it
        # just past half: the reading comes after the first counted batch the timed window keeps (run_loader
        # leaves out fewer than half), so its seconds are inside that window
        self.half = max(min(planned // 2 + 1, planned), 1)
        self.readings: dict[str, tuple[dict[str, int], int]] = {}
        self.paused_s = 0.0

    def _read(self, when: str, counted: int) -> float:
        with Clock(settle=False) as took:  # the main process's unique and proportional sizes at the end only
            m = procmem.memory(procmem.worker_pids(self.it), full=when == "end")
        if m is not None:
            self.readings[when] = (m, counted)
        return took.wall

    def start(self) -> None:
        self._read("start", 0)

    def counted(self, n: int) -> None:
        if n == self.half and "start" in self.readings:
            self.paused_s += self._read("mid", n)

    def end(self, n: int) -> None:
        if "start" in self.readings:
            self._read("end", n)

    def result(self) -> RunMemory | None:
        """The run's memory (None where psutil is missing or the run counted no batch)."""
        if "start" not in self.readings or "end" not in self.readings:
            return None
        (start, _), (end, n) = self.readings["start"], self.readings["end"]
        mid = self.readings.get("mid")
        halves = (mid[1], n - mid[1]) if mid is not None and n > mid[1] else (n, 0)
        per = growth(start, mid[0] if mid is not None else None, end, halves)
        return RunMemory(start=start, end=end, per_batch=per, batches=n, each=(per,))


def combined(runs: list[RunMemory | None]) -> RunMemory | None:
    """One setting's runs as one: the largest start and end (by total), the median growth per batch."""
    runs = [r for r in runs if r is not None]
    if not runs:
        return None
    if len(runs) == 1:
        return runs[0]
    each = tuple(e for r in runs for e in (r.each or (r.per_batch,)))
    per = {k: float(np.median([e[k] for e in each])) for k in PARTS}
    return RunMemory(start=max((r.start for r in runs), key=lambda m: m["main"] + m["workers"]),
                     end=max((r.end for r in runs), key=lambda m: m["main"] + m["workers"]),
                     per_batch=per, batches=sum(r.batches for r in runs), runs=sum(r.runs for r in runs), each=each)


def lives(settings: Any, epochs: int, per_epoch: int) -> int:
    """Batches a setting's worker processes live through: an epoch, or the run with persistent workers."""
    persistent = settings.persistent_workers and settings.num_workers and not settings.worker_threads
    return per_epoch * (epochs if persistent else 1)


def projected(m: RunMemory | None, settings: Any, epochs: int, per_epoch: int | None,
              copyable: int | None = None, read_growth: float = 0.0, main_at_least: int = 0) -> dict[str, Any] | None:
    """The memory over the user's run (bytes: ``main``, ``workers``, ``total``), by the module's rule; None
    where nothing was measured. ``copyable``: the bytes of Python objects a worker can copy by reading the
    Dataset (:func:`~placer.stream.dropin.fits.python_bytes`), a tighter cap than the main process's memory.
    ``read_growth``: the workers' growth per batch measured over the longest runs of any setting with worker
    processes, used where ``m``'s own is less. ``main_at_least``: the main process's memory at the start where
    the run's process held less (a fresh process holds a copy of the loader and step, the script's own holds
    all the script made)."""
    if m is None:
        return None
    if not per_epoch:
        return {"main": m.end["main"], "workers": m.end["workers"], "total": m.total, "extrapolated": False}
    main = max(m.end["main"], max(m.start["main"], main_at_least) + m.per_batch["main"] * epochs * per_epoch)
    rate = max(m.per_batch["workers"], read_growth) if m.processes else 0.0
    grown = rate * lives(settings, epochs, per_epoch)
    cap = m.processes * min(m.start["main"], copyable or m.start["main"])
    workers = max(m.end["workers"], m.start["workers"] + min(grown, cap))
    return {"main": int(main), "workers": int(workers), "total": int(main + workers), "extrapolated": True,
            "epochs": epochs, "batches": per_epoch, "worker_batches": lives(settings, epochs, per_epoch),
            **({"capped": True} if grown > cap else {})}


def mib(n: float) -> str:
    """Bytes in words: ``812 MiB``, ``3.1 GiB``."""
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:,.0f} MiB"
