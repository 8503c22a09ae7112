"""A DataLoader ``worker_init_fn`` that sets the threads each worker process computes with, and the BLAS pools it
can reach.

May import: torch and threadpoolctl inside functions.

A DataLoader worker runs torch at one intra-op thread already (torch's worker loop sets it before
``worker_init_fn``), but the BLAS library numpy loaded keeps its own pool of threads, one per core, in
every worker: ``W`` workers doing matrix work on ``C`` cores then run ``W x C`` threads that take turns.
:class:`WorkerThreads` sets torch's threads and every BLAS pool it can reach to ``threads``, then calls
the user's own ``worker_init_fn``. The BLAS pools are set through ``threadpoolctl`` where it is installed,
else through OpenBLAS's own ``openblas_set_num_threads`` in the OpenBLAS libraries the process has loaded
(Linux: read from ``/proc/self/maps``); :func:`blas_control` says which, and :func:`blas_threads` how many
threads the pools hold now.

It is a module-level class, not a closure: worker processes started by ``spawn`` or ``forkserver``
receive it pickled.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

#: OpenBLAS's names for its thread setter and getter (numpy's wheels rename them with a prefix and suffix)
_OPENBLAS = (("openblas_set_num_threads", "openblas_get_num_threads"),
             ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
             ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
             ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"))


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
    """How the BLAS pools are reached: ``threadpoolctl``, ``openblas`` (its own setter), or ``none``."""
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return "openblas" if _openblas() else "none"
    return "threadpoolctl"


def blas_threads() -> int:
    """The most threads a BLAS pool of this process holds (0: no pool reached)."""
    if blas_control() == "threadpoolctl":
        from threadpoolctl import threadpool_info

        return max((int(i.get("num_threads") or 0) for i in threadpool_info() if i.get("user_api") == "blas"),
                   default=0)
    return max((int(get()) for _, get in _openblas()), default=0)


def set_blas_threads(threads: int) -> None:
    """Set every BLAS pool reached (:func:`blas_control`) to ``threads``, for the rest of the process."""
    if blas_control() == "threadpoolctl":
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")  # applied now, kept: it is never restored
        return
    for set_, _ in _openblas():
        set_(int(threads))


def _openblas() -> list[tuple[Any, Any]]:
    """The (setter, getter) of each OpenBLAS library loaded in this process."""
    return [f for path in _loaded_openblas() if (f := _functions(path)) is not None]


def _loaded_openblas() -> tuple[str, ...]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return ()
    return tuple(sorted(paths))


@functools.cache
def _functions(path: str) -> tuple[Any, Any] | None:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for set_name, get_name in _OPENBLAS:
        set_, get = getattr(lib, set_name, None), getattr(lib, get_name, None)
        if set_ is not None and get is not None:
            set_.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
            return set_, get
    return None
