"""Discovering this machine's devices: every registered kind finds its own.

May import: placer.devices.{registry,device,cpu}; torch inside :func:`discover` (for
its version).
"""

from __future__ import annotations

import os
import platform
import threading

from placer.devices.cpu import cpu_model
from placer.devices.device import Device, Inventory
from placer.devices.registry import generation, kinds

_lock = threading.RLock()
_cached: tuple[int, Inventory] | None = None


def discover() -> Inventory:
    """Find this machine's devices (cached until a kind is (un)registered; see :func:`refresh`)."""
    global _cached
    with _lock:
        gen = generation()
        if _cached is None or _cached[0] != gen:
            _cached = (gen, _discover())
        return _cached[1]


def refresh() -> Inventory:
    """Forget the cached inventory and discover again."""
    global _cached
    with _lock:
        _cached = None
    return discover()


def _discover() -> Inventory:
    import torch

    host = {
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count() or 1,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numba": _version("numba"),
        "hostname": platform.node(),
    }
    devices: list[Device] = []
    unavailable: dict[str, str] = {}
    for kind in kinds().values():
        found, why = kind.discover(host)
        devices += found
        unavailable.update(why)
    return Inventory(devices=devices, unavailable=unavailable, host=host)


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None
