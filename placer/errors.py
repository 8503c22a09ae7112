"""placer's exceptions.

May import: nothing from placer.

Every error that concerns one stage carries it in ``.stage`` and names it in its
message, together with what to do about it.
"""

from __future__ import annotations

from typing import Any


class PlacerError(Exception):
    """Base class of every error placer raises on purpose."""

    def __init__(self, message: str, *, stage: str | None = None):
        super().__init__(message)
        self.stage = stage


class PipelineError(PlacerError, ValueError):
    """The pipeline's graph is malformed (validation failed)."""


class EmptyPipelineError(PipelineError):
    """The pipeline has no stages."""


class DuplicateStageError(PipelineError):
    """Two stages share a name."""


class CycleError(PipelineError):
    """The stages' dependencies form a cycle."""


class DanglingInputError(PipelineError):
    """A stage reads an input that no stage produces."""


class MissingImplementationError(PipelineError):
    """A stage is asked to run on a device it has no implementation for."""


class DeviceError(PlacerError):
    """A device is unknown, or not available on this machine."""


class DeviceUnavailableError(DeviceError):
    """A placement or pin names a device that this machine does not have."""


class PlacementError(PlacerError, ValueError):
    """A placement specification cannot be parsed or does not fit the pipeline."""


class StageFailedError(PlacerError):
    """A stage raised while running.

    ``.outputs`` holds the outputs of every stage that finished before the failure,
    and ``.run`` the partial timeline, so nothing already computed is lost.
    """

    def __init__(self, message: str, *, stage: str, outputs=None, run=None):
        super().__init__(message, stage=stage)
        self.outputs = outputs if outputs is not None else {}
        self.run = run


class CostTableError(PlacerError, ValueError):
    """A cost table is malformed: the message names the stage or field and the fix."""


class InfeasibleError(PlacerError, ValueError):
    """No placement satisfies the constraints (devices, memory, pins, deadline)."""


class CostModelError(PlacerError, KeyError):
    """The cost model has no prediction for a stage on a device; the message says why."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0]) if self.args else ""


class OutputPathError(PlacerError, OSError):
    """An output path cannot be written as a file (a directory, a link, a read-only folder, ...).

    Also an ``OSError``, so code that handles a failed write handles this one too.
    """


class InputFileError(PlacerError, ValueError):
    """An input file (JSON) cannot be read: missing, not UTF-8, not JSON, nested too deeply."""


class ArgumentError(PlacerError, ValueError):
    """An argument of a public call has a value it cannot take: the message names the argument and the fix."""


class ArgumentTypeError(PlacerError, TypeError):
    """An argument of a public call is of a type it cannot take: the message names the argument and the fix."""


def validation_line(exc: BaseException) -> str | None:
    """A pydantic ``ValidationError`` as one line naming every bad field; None for other exceptions.

    ``1 validation error for Stage`` alone says nothing: this gives
    ``Stage: name: Input should be a valid string (got 5)`` with each error.
    """
    errors = getattr(exc, "errors", None)
    title = getattr(exc, "title", None)
    if not callable(errors) or title is None or type(exc).__name__ != "ValidationError":
        return None
    parts = []
    for err in errors():
        where = ".".join(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        got = _short(err.get("input"))
        parts.append(f"{where + ': ' if where else ''}{msg}" + (f" (got {got})" if got is not None else ""))
    return f"{title}: " + "; ".join(parts)


def _short(value: Any) -> str | None:
    if isinstance(value, (dict, list)) or value is None:
        return None
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
