"""Handles a fresh process opens again: how a Dataset holding open files, arrays mapped from files,
database connections or locks still goes to the drop-in's fresh runs.

May import: cloudpickle, numpy (inside functions).

A Dataset that opens its file once in ``__init__`` (a tar shard, a record file, an
``np.memmap``, an SQLite database) holds handles that do not pickle, so its runs could not
be made in a fresh process as the script starts. Each handle is named here by what opens it
again: a file by its absolute path, its mode and its position; an array mapped from a file by
the file, its dtype, shape, offset and order (a copy-on-write or read-only map as it was, a
``w+`` map as ``r+``, so that opening it does not empty the file); an SQLite connection by its
database file; a lock as a new lock, which nobody holds in the new process. What cannot be
opened again by name (a file opened for writing or appending, which opening would empty or
move; an in-memory database; an anonymous ``mmap``) is left to pickle as before, and fails as
before: the runs are then made in the user's process, and the advice says so.

>>> import io, pickle, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "lines.txt")
>>> with open(path, "w") as f:
...     _ = f.write("one\\ntwo\\n")
>>> f = open(path, "rb"); _ = f.readline()
>>> g = pickle.loads(dumps(f))
>>> g.readline(), g.name == f.name
(b'two\\n', True)
"""

from __future__ import annotations

import io
import os
import sqlite3
import threading
from typing import Any

import cloudpickle

_LOCKS = (type(threading.Lock()), type(threading.RLock()))
_FILES = (io.FileIO, io.BufferedReader, io.BufferedRandom, io.TextIOWrapper)


def reopen_file(path: str, mode: str, position: int, encoding: str | None, errors: str | None,
                newline: str | None) -> Any:
    """A file opened again where it was: ``open(path, mode)`` at ``position``."""
    text = "b" not in mode
    f = open(path, mode, encoding=encoding, errors=errors, newline=newline) if text else open(path, mode)
    f.seek(position)
    return f


def remap(path: str, dtype: Any, mode: str, offset: int, shape: tuple, order: str) -> Any:
    """An array mapped from ``path`` again (:class:`numpy.memmap`)."""
    import numpy as np

    return np.memmap(path, dtype=dtype, mode=mode, offset=offset, shape=shape, order=order)


def reconnect(path: str) -> sqlite3.Connection:
    """An SQLite connection to the database file ``path`` again, usable from any thread (a setting with thread
    workers reads it from theirs; SQLite's own serialised mode keeps that safe)."""
    return sqlite3.connect(path, check_same_thread=False)


def _file(f: Any) -> tuple | None:
    mode = getattr(f, "mode", "")
    name = getattr(f, "name", None)
    if f.closed or not isinstance(name, str) or not isinstance(mode, str) or set(mode) & set("wax"):
        return None  # a descriptor, a closed file, or a mode that opening again would empty or move
    if isinstance(f, io.FileIO):
        mode = mode if "b" in mode else mode + "b"
    try:
        position = f.tell()
    except (OSError, ValueError):  # a pipe, or a text file being iterated: no place to go back to
        return None
    text = isinstance(f, io.TextIOWrapper)
    # a text file opens again in universal-newline mode (the one it was opened with is not kept by the file)
    return (reopen_file, (os.path.abspath(name), mode, position, f.encoding if text else None,
                          f.errors if text else None, None))


def _memmap(a: Any) -> tuple | None:
    import mmap

    import numpy as np

    if not isinstance(a, np.memmap) or not isinstance(a.base, mmap.mmap) or not a.filename:
        return None  # a view of a map (pickled as an array, copied) or an anonymous map
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    mode = "r+" if a.mode == "w+" else a.mode
    return (remap, (os.fspath(a.filename), a.dtype, mode, a.offset, a.shape, order))


def _connection(c: sqlite3.Connection) -> tuple | None:
    try:
        rows = c.execute("PRAGMA database_list").fetchall()
    except sqlite3.Error:
        return None
    path = next((file for _, name, file in rows if name == "main"), "")
    return (reconnect, (path,)) if path else None  # "": an in-memory database, nothing to open again


class Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with the handles above named by what opens them again."""

    def reducer_override(self, obj: Any) -> Any:
        reduced = None
        if isinstance(obj, _FILES):
            reduced = _file(obj)
        elif isinstance(obj, sqlite3.Connection):
            reduced = _connection(obj)
        elif isinstance(obj, _LOCKS):
            reduced = (threading.RLock if isinstance(obj, _LOCKS[1]) else threading.Lock, ())
        elif type(obj).__name__ == "memmap":
            reduced = _memmap(obj)
        return reduced if reduced is not None else super().reducer_override(obj)


def dump(obj: Any, file: Any) -> None:
    """``obj`` pickled to the binary ``file`` (cloudpickle, handles opened again by name)."""
    Pickler(file, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled to bytes, as :func:`dump`."""
    buf = io.BytesIO()
    dump(obj, buf)
    return buf.getvalue()
