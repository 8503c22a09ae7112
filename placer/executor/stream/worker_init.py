"""A DataLoader ``worker_init_fn`` that sets the threads each worker process computes with, and the BLAS pools it
can reach.

May import: torch and threadpoolctl inside functions.

A DataLoader worker runs torch at one intra-op thread already (torch's worker loop sets it before
``worker_init_fn``), but the BLAS library numpy loaded keeps its own pool of threads, one per core, in
every worker: ``W`` workers doing matrix work on ``C`` cores then run ``W x C`` threads that take turns.
:class:`WorkerThreads` sets torch's threads and every BLAS pool it can reach to ``threads``, then calls
the user's own ``worker_init_fn``. The BLAS pools are set through ``threadpoolctl`` (OpenBLAS, MKL, BLIS
alike); :func:`blas_control` says whether it reached one, and :func:`blas_threads` how many threads the
pools hold now.

It is a module-level class, not a closure: worker processes started by ``spawn`` or ``forkserver``
receive it pickled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

class WorkerThreads:
    """``worker_init_fn``: torch's intra-op threads and the BLAS pools set to ``threads``, then ``user(worker_id)``.

    Parameters
    ----------
    threads : int
        Threads each worker process computes with.
    user : callable, optional
        The loader's own ``worker_init_fn``, called after (what it sets stands).

    Examples
    --------
    >>> import torch
    >>> before, blas = torch.get_num_threads(), blas_threads()
    >>> seen = []
    >>> WorkerThreads(1, seen.append)(3)
    >>> torch.get_num_threads(), seen, blas_threads() <= 1
    (1, [3], True)
    >>> torch.set_num_threads(before)
    >>> set_blas_threads(blas) if blas else None
    """

    def __init__(self, threads: int, user: Callable[[int], Any] | None = None):
        self.threads = int(threads)
        self.user = user

    def __call__(self, worker_id: int) -> None:
        import torch

        torch.set_num_threads(self.threads)
        set_blas_threads(self.threads)
        if self.user is not None:
            self.user(worker_id)

    def __repr__(self) -> str:
        return f"WorkerThreads({self.threads}, {self.user!r})"


def blas_control() -> str:
    """How the BLAS pools are reached: ``threadpoolctl`` where it finds a BLAS library loaded in this process,
    else ``none``."""
    from threadpoolctl import threadpool_info

    return "threadpoolctl" if any(i.get("user_api") == "blas" for i in threadpool_info()) else "none"


def blas_threads() -> int:
    """The most threads a BLAS pool of this process holds (0: no pool reached)."""
    from threadpoolctl import threadpool_info

    return max((int(i.get("num_threads") or 0) for i in threadpool_info() if i.get("user_api") == "blas"), default=0)


def set_blas_threads(threads: int) -> None:
    """Set every BLAS pool of this process to ``threads``, for the rest of the process."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")  # applied now, kept: it is never restored
