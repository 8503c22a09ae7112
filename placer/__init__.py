"""placer: decide where each stage of a data pipeline should run, prove it, run it.

Importing ``placer`` is cheap: torch, dask and numba are imported only by the
functions that touch devices.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from placer.errors import (
    CycleError,
    DanglingInputError,
    DeviceError,
    DeviceUnavailableError,
    DuplicateStageError,
    EmptyPipelineError,
    MissingImplementationError,
    PipelineError,
    PlacementError,
    PlacerError,
    StageFailedError,
)
from placer.pipeline import Impl, Pipeline, Stage

__version__ = "0.1.0"

_LAZY = {
    "execute": "placer.executor",
    "Run": "placer.executor",
    "call_stage": "placer.executor",
    "discover": "placer.devices",
    "Device": "placer.devices",
    "Inventory": "placer.devices",
    "outputs_digest": "placer.digest",
    "load_pipeline": "placer.loader",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'placer' has no attribute {name!r}")
    return getattr(import_module(mod), name)


__all__ = [
    "CycleError", "DanglingInputError", "DeviceError", "DeviceUnavailableError",
    "DuplicateStageError", "EmptyPipelineError", "Impl", "MissingImplementationError",
    "Pipeline", "PipelineError", "PlacementError", "PlacerError", "Stage",
    "StageFailedError", *_LAZY,
]
