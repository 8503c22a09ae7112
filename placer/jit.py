"""Compiling stage code with numba, cached on disk only where that is safe.

May import: importlib, warnings; numba inside functions.

numba's on-disk cache finds a cached function again by importing its module by
name. A pipeline file that ``placer run path/to/file.py`` loaded has no importable
name, so entries it wrote would later fail to load (``ModuleNotFoundError``) in the
same file imported as a package module. :func:`njit` therefore caches on disk only
when the function's module is importable under its name, and compiles in memory
otherwise or when no writable cache location exists (a read-only install).

Examples
--------
>>> def total(a):
...     s = 0.0
...     for x in a:
...         s += x
...     return s
>>> import numpy as np
>>> njit(total)(np.arange(4.0))
6.0
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Any


def disk_cache_safe(fn: Callable) -> bool:
    """Whether ``fn``'s module can be imported under its name (so numba can cache it)."""
    mod = getattr(fn, "__module__", None)
    if not mod or mod == "__main__" or mod.startswith("placer_user_"):
        return False
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def njit(fn: Callable, **options: Any) -> Callable:
    """``numba.njit(fn, **options)``, with ``cache=True`` where :func:`disk_cache_safe`."""
    import numba

    if not disk_cache_safe(fn):
        return numba.njit(**options)(fn)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return numba.njit(cache=True, **options)(fn)
    except Exception:  # no writable cache location (read-only install)
        return numba.njit(**options)(fn)
