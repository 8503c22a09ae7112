"""The profile cache: one file per (pipeline, machine), and one per measured transfer model.

May import: placer.data, placer.errors, placer.files, placer.warnings. No measuring or device code.

Profiles are cached in ``$PLACER_CACHE_DIR`` (default ``~/.cache/placer``), one file
per pipeline source (its file's full path), name and machine
(:meth:`placer.devices.Inventory.fingerprint`). Files are written atomically.

The cache never stops the work:

- a file that cannot be read, is not UTF-8, is not JSON, is nested absurdly deep, fails
  validation (NaN, negative or absurd times, no measured points) or belongs to another
  pipeline or machine is ignored with one :class:`ProfileCacheWarning` naming the file,
  and the stages are measured again;
- a cache folder that cannot be created, read or written (a read-only home, a path under a
  regular file, a folder the user may not enter) turns the cache off for the rest of the
  process with one warning; the measurements are returned (and saved with ``-o``) all the
  same. That covers every file under the cache folder: profiles, transfer models and this
  machine's CPU calibration (:meth:`ProfileCache.read_text` / :meth:`ProfileCache.write_text`,
  used by :func:`placer.target.calibrate.this_cpu`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from pydantic import ValidationError

from placer.data.measures import TransferModel
from placer.data.profile import MAX_DEPTH, Profile, too_deep
from placer.errors import PlacerError
from placer.files import write_text_atomic
from placer.warnings import ProfileCacheWarning

TRANSFER_SCHEMA = "placer.transfer/1"

#: cache roots found unwritable in this process (each warned about once, with the unreadable ones)
_UNWRITABLE: set[str] = set()
#: cache roots found unreadable in this process (also treated as unwritable)
_UNREADABLE: set[str] = set()


def _warn(message: str) -> None:
    warnings.warn(message, ProfileCacheWarning, stacklevel=3)


# -- files -----------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where profiles are cached: ``$PLACER_CACHE_DIR`` or ``~/.cache/placer``."""
    env = os.environ.get("PLACER_CACHE_DIR")
    if env:
        return Path(env)
    try:
        return Path.home() / ".cache" / "placer"
    except (RuntimeError, KeyError):  # no home folder at all: a cache that is never writable
        return Path(os.sep, "nonexistent", "placer-cache")


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:80]


class ProfileCache:
    """Cached profiles, one file per (pipeline source, pipeline, machine) under ``root``."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    @property
    def writable(self) -> bool:
        """False once a write (or a read) was refused: nothing is written for the rest of the process."""
        return str(self.root) not in _UNWRITABLE

    @property
    def readable(self) -> bool:
        """False once a read was refused: the cache is off for the rest of the process."""
        return str(self.root) not in _UNREADABLE

    def _turn_off(self, verb: str, exc: OSError, path: Path) -> None:
        """Stop writing (``verb`` "written") or reading and writing ("read"), with one warning a process."""
        warned = not self.writable
        _UNWRITABLE.add(str(self.root))
        if verb == "read":
            _UNREADABLE.add(str(self.root))
        if warned:
            return
        _warn(f"the profile cache {str(self.root)!r} cannot be {verb} ({exc.strerror or exc}: "
              f"{exc.filename or path}); continuing without a cache (set PLACER_CACHE_DIR to a "
              "writable folder to keep measurements between runs)")

    def _exists(self, path: Path) -> bool:
        """Whether ``path`` is a file that can be opened; a refusal turns the cache off (one warning)."""
        if not self.readable:
            return False
        try:
            if not path.is_file():
                return False
            with open(path, "rb"):
                return True
        except PermissionError as exc:
            self._turn_off("read", exc, path)
        except OSError:
            pass
        return False

    def read_text(self, path: str | os.PathLike) -> str | None:
        """The text of a file under the cache folder, or None when it is absent or cannot be read
        (a refused read turns the cache off with one warning; an undecodable file is None)."""
        p = Path(path)
        if not self._exists(p):
            return None
        try:
            return p.read_text(encoding="utf-8")
        except PermissionError as exc:
            self._turn_off("read", exc, p)
        except (OSError, UnicodeDecodeError):
            pass
        return None

    def write_text(self, path: str | os.PathLike, text: str) -> Path | None:
        """Write ``text`` atomically to ``path`` under the cache folder; on failure warn once,
        turn the cache off and return None."""
        return self._write(Path(path), lambda p: write_text_atomic(p, text))

    def path(self, pipeline: str, fingerprint: str, source: str = "") -> Path:
        tag = f"-{hashlib.sha256(source.encode()).hexdigest()[:10]}" if source else ""
        return self.root / "profiles" / f"{_safe(pipeline)}{tag}-{_safe(fingerprint)}.json"

    def transfer_path(self, device: str, fingerprint: str) -> Path:
        return self.root / "transfer" / f"{_safe(device.replace(':', '_'))}-{_safe(fingerprint)}.json"

    def load(self, pipeline: str, fingerprint: str, source: str = "") -> Profile | None:
        """The cached profile, or None (with one warning naming the file when it is unusable)."""
        p = self.path(pipeline, fingerprint, source)
        if not self._exists(p):
            return None
        try:
            prof = Profile.load(p)
        except PlacerError as exc:
            _warn(f"ignoring cached profile {str(p)!r}: {_reason(exc)}; re-measuring")
            return None
        except (RecursionError, MemoryError, ValueError, TypeError) as exc:
            _warn(f"ignoring cached profile {str(p)!r}: {type(exc).__name__}: {exc}; re-measuring")
            return None
        if prof.fingerprint != fingerprint or prof.pipeline != pipeline or (source and prof.source != source):
            _warn(f"ignoring cached profile {str(p)!r}: it is for pipeline {prof.pipeline!r} "
                  f"({prof.source or 'unknown file'}) on machine {prof.fingerprint}, not {pipeline!r} "
                  f"({source or 'unknown file'}) on {fingerprint}; re-measuring")
            return None
        bad = implausible(prof)
        if bad:
            _warn(f"ignoring cached profile {str(p)!r}: {bad}; re-measuring")
            return None
        return prof

    def save(self, prof: Profile) -> Path | None:
        """Write ``prof``; on failure warn once, turn the cache off and return None."""
        return self._write(self.path(prof.pipeline, prof.fingerprint, prof.source),
                           lambda path: prof.save(path))

    def load_transfer(self, device: str, fingerprint: str) -> TransferModel | None:
        p = self.transfer_path(device, fingerprint)
        if not self._exists(p):
            return None
        try:
            raw = p.read_bytes()
            text = raw.decode("utf-8")
            if too_deep(text, MAX_DEPTH):
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("schema") != TRANSFER_SCHEMA:
                found = data.get("schema") if isinstance(data, dict) else type(data).__name__
                raise ValueError(f"schema is {found!r}, expected {TRANSFER_SCHEMA!r}")
            tm = TransferModel.model_validate(data["model"])
        except PermissionError as exc:
            self._turn_off("read", exc, p)
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, ValidationError) as exc:
            _warn(f"ignoring cached transfer model {str(p)!r}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}; re-measuring")
            return None
        return tm if tm.fingerprint == fingerprint else None

    def save_transfer(self, tm: TransferModel) -> Path | None:
        doc = {"schema": TRANSFER_SCHEMA, "model": tm.model_dump(mode="json")}
        return self._write(self.transfer_path(tm.device, tm.fingerprint),
                           lambda path: write_text_atomic(path, json.dumps(doc, indent=1)))

    def _write(self, path: Path, write) -> Path | None:
        if not self.writable:
            return None
        try:
            return write(path)
        except OSError as exc:
            self._turn_off("written", exc, path)
            return None


def _reason(exc: Exception) -> str:
    """The part of a load error after the file's name (the warning names the file itself)."""
    msg = str(exc).splitlines()[0]
    return msg.split("': ", 1)[-1] if "': " in msg else msg


def implausible(prof: Profile) -> str | None:
    """Why a cached profile cannot be trusted (None when it can): no measured points at all,
    or a stage whose devices hold neither points nor an error."""
    if prof.stages and not any(dp.points for sp in prof.stages.values() for dp in sp.devices.values()):
        return "it holds no measured points"
    for name, sp in prof.stages.items():
        for dev, dp in sp.devices.items():
            if not dp.points and not dp.error:
                return f"stage {name!r} on {dev} has no measured points"
            sizes = [pt.size for pt in dp.points]
            if any(pt.median_s < min(pt.raw_times) * 0.999 or pt.median_s > max(pt.raw_times) * 1.001
                   for pt in dp.points):
                return f"stage {name!r} on {dev}: a median outside its own repeats (sizes {sizes})"
    return None
