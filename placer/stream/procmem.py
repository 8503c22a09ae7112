"""The memory a process and its DataLoader's worker processes hold, read with psutil.

May import: the standard library at load time; psutil inside functions. ``placer tune``'s hook
(:mod:`placer.tune.hook`) loads this file by its path into the user's script, where nothing of
placer's may be imported; the drop-in imports it as a module.

What each figure is, and why (Linux's ``/proc/PID/smaps_rollup`` through ``memory_full_info``):

- ``main``: the process's resident anonymous memory (``rss - shared``: its heap, its Python objects,
  its tensors), counted whole. Its unique set size (``main_uss``) is not used for it: the worker
  processes are forks that share the main process's pages until they write to them, and a page
  shared is not unique, so the main process's USS falls by the Dataset's size as soon as workers
  start, though nothing was freed;
- ``workers``: the worker processes' unique set sizes, summed: what each adds to the main process
  (the pages it wrote to, its own allocations). Reading a Python object writes its reference count,
  so a worker that reads a Dataset's list of dicts copies every page it touches (copy-on-read):
  its USS grows as it reads;
- ``main_pss``, ``workers_pss``: proportional set sizes (each shared page split between the
  processes sharing it), where the kernel gives them; the USS where it does not.

``main + workers`` is then the memory the process and its workers hold together: each page
the workers share with the main process counted once, in ``main``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def sizes(pid: int | None = None, full: bool = True) -> dict[str, int | None] | None:
    """``{"anon", "uss", "pss"}`` (bytes) of one process (this one where ``pid`` is None); None where psutil
    is not installed or the process is gone. ``full=False``: ``anon`` alone (``/proc/PID/statm``, a read
    that costs microseconds where the unique and proportional sizes walk the process's pages)."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        p = psutil.Process(pid)
        m = p.memory_full_info() if full else p.memory_info()
    except (psutil.Error, OSError):
        return None
    anon = int(m.rss - getattr(m, "shared", 0))
    if not full:
        return {"anon": anon, "uss": None, "pss": None}
    return {"anon": anon, "uss": int(m.uss), "pss": int(getattr(m, "pss", m.uss))}


def children() -> list[int]:
    """This process's child processes (any depth), by pid; empty where psutil is not installed."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        return [k.pid for k in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def memory(workers: Iterable[int] | None = None, full: bool = True) -> dict[str, int | None] | None:
    """The memory of this process and of its worker processes (bytes; the module's docstring says what each
    figure is): ``main``, ``main_uss``, ``main_pss``, ``workers``, ``workers_pss`` and ``processes`` (the workers
    read). ``workers``: their pids (default: every child process of this one). ``full=False``: the main
    process's unique and proportional sizes are not read (None), its own memory is (cheaply). None where
    psutil is not installed.

    >>> m = memory(workers=[])
    >>> m is None or (m["main"] > 0 and m["workers"] == 0 and m["processes"] == 0)
    True
    """
    me = sizes(full=full)
    if me is None:
        return None
    pids = children() if workers is None else list(workers)
    theirs = [s for s in (sizes(p) for p in pids) if s is not None]
    return {"main": me["anon"], "main_uss": me["uss"], "main_pss": me["pss"],
            "workers": sum(s["uss"] for s in theirs), "workers_pss": sum(s["pss"] for s in theirs),
            "processes": len(theirs)}


def worker_pids(it: Any) -> list[int]:
    """The pids of a DataLoader iterator's worker processes (none for a loader without them, or threads)."""
    return [w.pid for w in getattr(it, "_workers", None) or () if getattr(w, "pid", None) is not None]
