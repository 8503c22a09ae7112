"""Writing files atomically: a reader never sees half a file, a failure leaves none.

May import: os, stat, json, tempfile, pathlib, placer.errors.

What a write may replace
------------------------
A write replaces a path only when it is a regular file, or nothing yet:

- a regular file (or a new path) is written to a temporary file in the same folder
  and renamed over it, so a reader sees the old file or the new one, never half;
- a character device or a named pipe (``-o /dev/null``, ``-o /dev/stdout``, a FIFO)
  is written into, as a shell redirection would: the device stays a device;
- a directory, a block device, a socket, or a symbolic link is refused with
  :class:`~placer.errors.OutputPathError` naming the path and the fix; a link is
  never followed, so neither the link nor the file it points to is replaced: give
  the target's own path.

:func:`check_output` asks the same questions before any work starts (and also
whether the folder can be written), so a command that would fail to save its result
fails at once rather than after the work.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from placer.errors import InputFileError, OutputPathError

def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return word
    return "not a regular file"


def _writable_in_place(mode: int) -> bool:
    """Paths written into rather than replaced: character devices and named pipes."""
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _existing(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _refuse(path: Path, st: os.stat_result, what: str) -> None:
    kind = _kind(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        raise OutputPathError(f"{what} {str(path)!r} is a symbolic link (to {target!r}); placer does not write "
                              "through links: give the target's own path, or remove the link")
    fix = "give a file name inside it" if stat.S_ISDIR(st.st_mode) else "give the path of a regular file"
    raise OutputPathError(f"{what} {str(path)!r} is {kind}; {fix}")


def check_output(path: str | os.PathLike, what: str = "output") -> Path:
    """Raise :class:`OutputPathError` unless ``path`` can be written as a file; return it.

    The path must be a regular file, a character device or named pipe, or not exist
    yet; its folder (or the nearest folder that exists, when the rest is to be made)
    must be a directory this process can create files in.
    """
    path = Path(path)
    if str(path) == "" or path.name in ("", ".", ".."):
        raise OutputPathError(f"{what} {str(path)!r} names no file; give a file name")
    st = _existing(path)
    if st is not None:
        if _writable_in_place(st.st_mode):
            if not os.access(path, os.W_OK):
                raise OutputPathError(f"{what} {str(path)!r} is not writable; give another path")
            return path
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, st, what)
    _check_folder(path.parent, what, path)
    return path


def check_output_folder(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """Raise :class:`OutputPathError` unless ``folder`` is (or can be made) a writable directory."""
    folder = Path(folder)
    st = _existing(folder)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{what} {str(folder)!r} is {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}; "
                              "give a directory (it is made when missing)")
    _check_folder(folder if st is not None else folder.parent, what, folder)
    return folder


def _check_folder(folder: Path, what: str, path: Path) -> None:
    """The nearest existing ancestor of ``folder`` must be a directory we can create files in."""
    here = folder if str(folder) else Path(".")
    while _existing(here) is None and here.parent != here:
        here = here.parent
    st = _existing(here)
    if st is None or not stat.S_ISDIR(os.stat(here).st_mode):
        raise OutputPathError(f"{what} {str(path)!r}: {str(here)!r} is not a directory; give a path in a folder")
    try:  # the real test (os.access says yes to root on a read-only file system)
        fd, probe = tempfile.mkstemp(prefix=".placer-probe.", dir=here)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputPathError(f"{what} {str(path)!r}: cannot create files in {str(here)!r} "
                              f"({exc.strerror}); give a path in a writable folder") from None


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and a rename.

    A character device or named pipe is written into instead; a directory, link,
    block device or socket is refused (see the module docstring).
    """
    path = Path(path)
    st = _existing(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not _writable_in_place(st.st_mode):
            _refuse(path, st, "output")
        with open(path, "wb") as f:
            f.write(data)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically; see :func:`write_bytes_atomic`."""
    return write_bytes_atomic(path, text.encode("utf-8"))


# -- reading JSON inputs -------------------------------------------------------------------
def parse_json(text: str | bytes, source: str, fix: str = "fix or regenerate it") -> Any:
    """Parse JSON ``text``; raise :class:`InputFileError` naming ``source`` for bad bytes, syntax or depth."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputFileError(f"{source}: not UTF-8 text (byte {exc.start}); {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{source}: not valid JSON ({exc}); {fix}") from None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply to read (more levels than Python's "
                             f"recursion limit); {fix}") from None


def read_json(path: str | os.PathLike, source: str | None = None, fix: str = "fix or regenerate it") -> Any:
    """Read and parse the JSON file at ``path``; :class:`InputFileError` names ``source`` (default: the path)."""
    p = Path(path)
    source = str(p) if source is None else source
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise InputFileError(f"{source}: a directory, not a file; give the JSON file's path") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {source}: {exc.strerror or exc}") from None
    return parse_json(data, source, fix)
