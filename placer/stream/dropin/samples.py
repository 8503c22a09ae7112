"""The loader's samples timed one by one, as a worker process reads them: what each costs, and the threads it keeps
busy.

May import: threading, psutil, placer.timing, placer.stream.{dataset_cache,hits,purity,wrappers}; torch inside
functions.

The checks after the search read them: the spread of the samples' costs (a heavy tail that holds
batches back, :mod:`~placer.stream.dropin.reorder`) and the CPU seconds all of this process's threads
spent while the samples were read, over those of the thread that read them (above one, reading a
sample runs work in other threads too, a BLAS pool's: :mod:`~placer.stream.dropin.worker_threads`).
Per thread, not per process: on a machine shared with other work the process gets fewer cores than
its threads ask for, and CPU over wall seconds would read as one thread.
Each ``dataset[key]`` runs in this process at torch's one intra-op thread, as torch's worker loop sets
it in each worker (the BLAS pools as a worker inherits them), with the global random generators put back;
a dataset the loader hands each batch's keys at once reads each sample as ``__getitems__([key])``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import psutil

from placer.stream.dataset_cache import key_batches
from placer.stream.hits import fetches_batches
from placer.stream.wrappers import Batch, fetched
from placer.stream.purity import global_random_state_kept
from placer.timing import Clock, Deadline, torch_threads

#: samples timed at most, and the share of the budget their timing may take (on top of it, as the cache's)
TIMED_SAMPLES = 256
TIME_SHARE = 0.05


@dataclass(frozen=True)
class Timed:
    """Samples of the loader's first batches, each timed: ``costs[b][i]`` the wall seconds of batch ``b``'s
    ``i``-th sample; over all of them, the CPU seconds of the thread that read them (``own_cpu_s``) and
    of the process's other threads (``other_cpu_s``)."""

    costs: tuple[tuple[float, ...], ...]
    own_cpu_s: float
    other_cpu_s: float

    @property
    def threads_busy(self) -> float:
        """CPU seconds of all threads per CPU second of the reading thread: above one, reading runs work in
        other threads too (1.0 where the reading took no measurable CPU)."""
        if self.own_cpu_s <= 0:
            return 1.0
        return (self.own_cpu_s + self.other_cpu_s) / self.own_cpu_s

    @property
    def samples(self) -> int:
        return sum(len(b) for b in self.costs)


def time_samples(loader: Any, batches: int, deadline: Deadline) -> Timed | None:
    """The samples of the loader's first ``batches`` batches timed (at most :data:`TIMED_SAMPLES`, and only
    the first batch past ``deadline``), the slowest again (:func:`_again`); None where the loader has no keys
    to read them by (an iterable dataset)."""
    from torch.utils.data import IterableDataset

    if isinstance(loader.dataset, IterableDataset) or not hasattr(loader.dataset, "__getitem__"):
        return None
    with global_random_state_kept(), torch_threads(1):
        keys = key_batches(loader, batches) or []
        out: list[list[float]] = []
        before = _thread_cpu()
        for batch in keys:
            if sum(map(len, out)) >= TIMED_SAMPLES or (out and deadline.passed()):
                break
            each = []
            for key in batch:
                each.append(_seconds(loader.dataset, units_of(loader, [key])[0]))
                if deadline.passed():
                    break
            if len(each) < len(batch) and out:  # a batch cut short would read cheaper than it is
                break
            out.append(each)  # (the first batch is kept cut short: it is all there is)
        after = _thread_cpu()
        _again(loader.dataset, [units_of(loader, b) for b in keys], out)
    me = threading.get_native_id()
    spent = {t: s - before.get(t, 0.0) for t, s in after.items()}
    own = spent.pop(me, 0.0)
    return Timed(tuple(map(tuple, out)), own, sum(spent.values())) if out else None


#: the slowest samples timed again: this share of them, at least :data:`AGAIN_LEAST`, :data:`AGAIN` times more
AGAIN_SHARE, AGAIN_LEAST, AGAIN = 0.05, 4, 2


def _again(dataset: Any, keys: list[list[Any]], costs: list[list[float]]) -> None:
    """Time the slowest samples again and keep the least time of each: a machine shared with other work only
    ever adds to a sample's time, so a sample slow every time is slow, one slow once met a hiccup."""
    timed = sorted(((c, b, i) for b, each in enumerate(costs) for i, c in enumerate(each)), reverse=True)
    for _, b, i in timed[:max(AGAIN_LEAST, int(AGAIN_SHARE * len(timed)))]:
        costs[b][i] = min([costs[b][i], *(_seconds(dataset, keys[b][i]) for _ in range(AGAIN))])


def units_of(loader: Any, keys: list[Any]) -> list[Any]:
    """Each key as the loader reads one sample by it: the key, or a batch of that key alone where the loader
    hands its dataset each batch's keys at once (``__getitems__``)."""
    return [Batch([k]) for k in keys] if fetches_batches(loader) else list(keys)


def _seconds(dataset: Any, key: Any) -> float:
    with Clock(cpu_clock=None, settle=False) as c:
        fetched(dataset, key)
    return c.wall


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user and system) of each thread of this process, by its native id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
