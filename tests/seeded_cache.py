"""A fresh profile cache that already holds this machine's CPU calibration.

``placer`` calibrates a CPU once per machine (about 15 s) and keeps the result in the profile cache;
a test that gives a command a fresh cache would pay it again. :func:`seeded_cache` makes the folder
and copies the calibration in, measuring it once per test session (in the session's cache) the first
time one is asked for. Tests of calibrating itself, or of what a cache holds, use an empty folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from unittest import mock

#: the session's cache (conftest.py sets it before any test module is imported)
SESSION_CACHE = Path(os.environ["PLACER_CACHE_DIR"])


def calibration() -> Path:
    """This machine's CPU calibration file in the session's cache, measured now if it is not there yet."""
    from placer.devices import discover
    from placer.target.calibrate import cpu_key, this_cpu

    path = SESSION_CACHE / f"cpu-{cpu_key(discover().host)}.json"
    if not path.exists():
        with mock.patch.dict(os.environ, {"PLACER_CACHE_DIR": str(SESSION_CACHE)}):
            this_cpu()
    return path


def seeded_cache(root: Path | str) -> Path:
    """``root`` made (if need be), holding only this machine's CPU calibration; returns ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    cal = calibration()
    shutil.copy(cal, root / cal.name)
    return root
