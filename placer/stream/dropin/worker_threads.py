"""Threads inside worker processes: whether one thread per worker is faster, where workers x threads pass the cores.

May import: placer.executor.stream.worker_init, placer.stream.dropin.{headtohead,phases,samples,trial}.

The rule
--------
Each DataLoader worker process runs torch at one intra-op thread (torch's worker loop sets it),
but the BLAS library numpy loaded keeps a pool of threads per process, sized to the cores: ``W``
workers doing matrix work start ``W x T`` threads. Where that passes the cores (``T``: the BLAS
pool's threads as this process holds them, which a worker starts with) and reading a sample keeps
other threads busy (all threads' CPU seconds over the reading thread's pass :data:`BUSY`, timed as a
worker reads it: :func:`~placer.stream.dropin.samples.time_samples`), the recommended settings
(or the user's, where only theirs have worker processes) with one thread per worker
(``threads_per_worker=1``: a ``worker_init_fn`` that sets torch's
threads and the BLAS pools, :class:`~placer.executor.stream.worker_init.WorkerThreads`, then calls
the user's own) are measured against them in interleaved rounds
(:mod:`~placer.stream.dropin.headtohead`), and recommended when faster by the drop-in's rule.
``advice.loader()`` builds the loader with that ``worker_init_fn``; the batches are the same.

The BLAS pools are reached through ``threadpoolctl``; where it finds no BLAS library loaded, only torch's
threads are set, and the advice says so (:func:`~placer.executor.stream.worker_init.blas_control`).
"""

from __future__ import annotations

from typing import Any

from placer.executor.stream.worker_init import blas_control, blas_threads
from placer.stream.dropin.headtohead import head_to_head, measured, with_processes
from placer.stream.dropin.phases import Advising
from placer.stream.dropin.samples import Timed
from placer.stream.dropin.trial import label

#: the threads each worker is given in the check
ONE = 1
#: reading a sample runs work in several threads where all threads' CPU seconds pass the reading thread's by
#: this factor (one thread reads 1; the margin is for the process's other threads and the clocks' ticks)
BUSY = 1.2


def oversubscribed(workers: int, threads: int, cores: int) -> bool:
    """Whether ``workers`` processes of ``threads`` threads each pass ``cores`` (and one thread each would not
    be the same).

    Examples
    --------
    >>> oversubscribed(2, 2, 2), oversubscribed(2, 1, 2), oversubscribed(1, 2, 2), oversubscribed(4, 2, 8)
    (True, False, False, False)
    """
    return threads > ONE and workers * threads > cores


def consider(a: Advising, timed: Timed | None) -> dict[str, Any]:
    """Measure one thread per worker (in the recommended settings, or the user's where only theirs have worker
    processes: :func:`~placer.stream.dropin.headtohead.with_processes`) against the recommendation where
    workers x threads pass the cores and the ``timed`` samples kept several threads busy; recommend it where
    faster. Returns what the advice reports (``advice.per_worker_threads``)."""
    s, control, threads = with_processes(a, 1), blas_control(), blas_threads()
    out: dict[str, Any] = {"workers": 0 if s is None else s.num_workers, "blas_threads": threads, "cores": a.cores,
                           "blas_control": control, "recommended": False,
                           "threads_busy": None if timed is None else round(timed.threads_busy, 2)}
    if s is None:
        out["why_not"] = "no worker processes in the recommended settings nor in yours"
        return out
    if s.threads_per_worker is not None:
        out["why_not"] = f"the threads per worker are set already ({s.threads_per_worker})"
        return out
    if not oversubscribed(s.num_workers, threads, a.cores):
        out["why_not"] = (f"{s.num_workers} workers x {threads or 1} BLAS threads do not pass the {a.cores} cores"
                          if control != "none" else "no BLAS library's threads could be read or set "
                          "(threadpoolctl found no BLAS library loaded): torch's worker threads are "
                          "one already")
        return out
    if timed is None or timed.threads_busy <= BUSY:
        out["why_not"] = ("reading a sample kept no other thread busy: it runs no threads of its own"
                          if timed is not None else "the loader has no keys to time its samples by")
        return out
    base, one = a.best.settings, s.model_copy(update={"threads_per_worker": ONE})
    if head_to_head(a, base, one, out):
        a.notes.append(f"one thread per worker: {label(one)} measured {out['measured_gain']:.2f}x {label(base)} in "
                       f"{out['rounds']} interleaved rounds ({s.num_workers} workers x {threads} BLAS threads on "
                       f"{a.cores} cores took turns); advice.loader() sets it with a worker_init_fn that calls yours "
                       f"after it (placer.stream.WorkerThreads({ONE}, your_worker_init_fn))")
    elif out["measured_gain"] is not None:
        a.notes.append(f"one thread per worker ({s.num_workers} workers x {threads} BLAS threads on {a.cores} "
                       f"cores) measured {measured(out)}: your workers' threads are kept")
    return out
