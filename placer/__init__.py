"""placer: decide where each stage of a data pipeline should run, prove it, run it.

Importing ``placer`` is cheap: torch, dask and numba are imported only by the
functions that touch devices. The main entry points are loaded on first use and
still show in ``dir(placer)`` and work with ``help()``:

- :func:`placer.advise`: profile, plan, run the plan and its alternatives, gather a report's facts;
- :func:`placer.profile`: measure every stage on every device (``placer.profile`` is also the
  package of the profiler; calling it calls :func:`placer.profile.profile`);
- :func:`placer.plan`: the best placement of a cost table;
- :func:`placer.execute`: run a pipeline under a placement;
- :func:`placer.report`: write a report of a plan and its run (calling the package
  :mod:`placer.report` calls :func:`placer.report.report`);
- :class:`placer.Pipeline` and :class:`placer.Stage`: what a pipeline is made of.

The library logs to ``logging.getLogger("placer")`` and warns with the categories of
:mod:`placer.warnings` (all subclasses of :class:`PlacerWarning`).

Examples
--------
>>> import placer
>>> p = placer.Pipeline("demo")
>>> @p.stage(kind="cleaning")
... def double(device, n: int = 3):
...     return [2 * i for i in range(n)]
>>> run = placer.execute(p, "all=cpu", executor="inline")
>>> run.stages[0].name, run.final_outputs["double"]
('double', [0, 2, 4])
"""

from __future__ import annotations

from importlib import import_module as _import_module
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError, version as _dist_version

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
from placer.warnings import NoisyMeasurementWarning, PlacerWarning

try:
    __version__ = _dist_version("placer")
except _PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0.1.0"

#: public names loaded on first use: name -> the module that defines it
_LAZY = {
    "advise": "placer.advisor",
    "Advised": "placer.advisor",
    "execute": "placer.executor",
    "Run": "placer.executor",
    "call_stage": "placer.executor",
    "plan": "placer.optimize",
    "discover": "placer.devices",
    "Device": "placer.devices",
    "Inventory": "placer.devices",
    "outputs_digest": "placer.digest",
    "load_pipeline": "placer.loader",
}
#: subpackages that are also callable entry points (``placer.profile(...)``, ``placer.report(...)``)
_CALLABLE_PACKAGES = ("profile", "report")


def __getattr__(name: str) -> object:
    if name in _CALLABLE_PACKAGES:
        return _import_module(f"placer.{name}")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'placer' has no attribute {name!r}")
    value = getattr(_import_module(mod), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    """placer's API: the names of ``__all__`` and ``__version__`` (not the modules it imports, nor their names)."""
    return sorted({*__all__, "__version__"})


__all__ = [
    "CycleError", "DanglingInputError", "DeviceError", "DeviceUnavailableError",
    "DuplicateStageError", "EmptyPipelineError", "Impl", "MissingImplementationError",
    "NoisyMeasurementWarning", "Pipeline", "PipelineError", "PlacementError", "PlacerError",
    "PlacerWarning", "Stage", "StageFailedError", *_LAZY, *_CALLABLE_PACKAGES,
]
