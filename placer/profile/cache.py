"""The profile cache: one file per (pipeline, machine), and one per measured transfer model.

May import: placer.data, placer.errors, placer.files. No measuring or device code.

Profiles are cached in ``$PLACER_CACHE_DIR`` (default ``~/.cache/placer``), one file
per pipeline and machine (:meth:`placer.devices.Inventory.fingerprint`). A corrupt or
foreign file is ignored with a :class:`ProfileCacheWarning` and re-measured. Files
are written atomically.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from pydantic import ValidationError

from placer.data.measures import TransferModel
from placer.data.profile import Profile
from placer.errors import PlacerError
from placer.files import write_text_atomic

TRANSFER_SCHEMA = "placer.transfer/1"



class ProfileCacheWarning(UserWarning):
    """A cached profile was unreadable or foreign; it is ignored and re-measured."""


# -- files -----------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where profiles are cached: ``$PLACER_CACHE_DIR`` or ``~/.cache/placer``."""
    return Path(os.environ.get("PLACER_CACHE_DIR") or Path.home() / ".cache" / "placer")


class ProfileCache:
    """Cached profiles, one file per (pipeline, machine) under ``root``."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    def path(self, pipeline: str, fingerprint: str) -> Path:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in pipeline)
        return self.root / "profiles" / f"{safe}-{fingerprint}.json"

    def transfer_path(self, device: str, fingerprint: str) -> Path:
        return self.root / "transfer" / f"{device.replace(':', '_')}-{fingerprint}.json"

    def load(self, pipeline: str, fingerprint: str) -> Profile | None:
        """The cached profile, or None (with a warning when the file is unusable)."""
        p = self.path(pipeline, fingerprint)
        if not p.exists():
            return None
        try:
            prof = Profile.load(p)
        except PlacerError as exc:
            warnings.warn(f"ignoring cached profile: {exc}; re-measuring", ProfileCacheWarning, stacklevel=2)
            return None
        if prof.fingerprint != fingerprint or prof.pipeline != pipeline:
            warnings.warn(
                f"ignoring cached profile {str(p)!r}: it is for pipeline {prof.pipeline!r} on machine "
                f"{prof.fingerprint}, not {pipeline!r} on {fingerprint}; re-measuring",
                ProfileCacheWarning,
                stacklevel=2,
            )
            return None
        return prof

    def save(self, prof: Profile) -> Path:
        return prof.save(self.path(prof.pipeline, prof.fingerprint))

    def load_transfer(self, device: str, fingerprint: str) -> TransferModel | None:
        p = self.transfer_path(device, fingerprint)
        if not p.exists():
            return None
        try:
            data = json.loads(p.read_text())
            if data.get("schema") != TRANSFER_SCHEMA:
                raise ValueError(f"schema is {data.get('schema')!r}, expected {TRANSFER_SCHEMA!r}")
            tm = TransferModel.model_validate(data["model"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
            warnings.warn(f"ignoring cached transfer model {str(p)!r}: {exc}; re-measuring",
                          ProfileCacheWarning, stacklevel=2)
            return None
        return tm if tm.fingerprint == fingerprint else None

    def save_transfer(self, tm: TransferModel) -> Path:
        doc = {"schema": TRANSFER_SCHEMA, "model": tm.model_dump(mode="json")}
        return write_text_atomic(self.transfer_path(tm.device, tm.fingerprint), json.dumps(doc, indent=1))
