"""What a report asks of a device's kind, answered by the device registry.

May import: placer.devices (the registry), placer.errors. Plain answers about kind names, so that
the report's modules never branch on a kind's name themselves.

A report's devices carry their kind as plain text (a saved report renders where a
kind is not registered): such a kind is answered as an accelerator that is neither
a real GPU nor simulated.
"""

from __future__ import annotations

from placer.devices import canonical_name, kinds
from placer.errors import DeviceError


def is_accelerator(kind: str) -> bool:
    """Whether devices of ``kind`` are accelerators (everything but the host's CPU)."""
    k = kinds().get(kind)
    return True if k is None else k.accelerator


def is_real_gpu(kind: str) -> bool:
    """Whether devices of ``kind`` are real GPUs (the simulated device never is)."""
    k = kinds().get(kind)
    return k is not None and k.real_gpu


def is_simulated(kind: str) -> bool:
    """Whether devices of ``kind`` stand in for hardware in tests."""
    k = kinds().get(kind)
    return k is not None and k.simulated


def rank(kind: str) -> int:
    """Where a device of ``kind`` is listed: the CPU, real GPUs, other accelerators, simulated devices."""
    if not is_accelerator(kind):
        return 0
    return 1 if is_real_gpu(kind) else 3 if is_simulated(kind) else 2


def alias_of(name: str) -> str:
    """The device name ``name`` stands for (``gpu`` is ``gpu:0``); a name no kind knows, as it is."""
    try:
        return canonical_name(name)
    except DeviceError:
        return name


__all__ = ["alias_of", "is_accelerator", "is_real_gpu", "is_simulated", "rank"]
