"""A profile: what was measured about a pipeline's stages on one machine.

May import: pydantic, placer.errors, placer.files, placer.data.measures, placer.devices
(its registry, to check device kinds). No measuring or device code: :mod:`placer.profile` measures and writes these; the cost model reads
them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from placer.data.measures import PrecisionCheck, TransferModel, Work
from placer.devices import check_kind
from placer.errors import PlacerError
from placer.files import read_json, write_text_atomic

SCHEMA = "placer.profile/1"
#: a profile file nested deeper than this is refused before it is parsed
MAX_DEPTH = 64
#: a measured time above this (seconds per call) is not plausible
MAX_SECONDS = 1e6

Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Bytes = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class Point(BaseModel):
    """One (stage, device, size) measurement.

    ``median_s``/``iqr_s`` summarise ``raw_times`` (seconds per call, steady state);
    ``first_call_s`` is the first call at this size on this device in this process.
    Times are finite and non-negative (a file saying otherwise is refused). ``stalled``
    marks repeats that came in stall-sized steps or split into two clusters (a busy
    machine); ``single_repeat`` a point timed once, whose spread is unknown.
    ``cpu_s`` is the process CPU time per call over the timed repeats (``cpu_s``
    above the wall time: several cores busy; far below: waiting on a device or a lock).
    """

    model_config = ConfigDict(extra="allow")

    size: int = Field(ge=1)
    median_s: Seconds
    iqr_s: Seconds
    reps: int = Field(ge=1)
    number_per_run: int = Field(1, ge=1)
    raw_times: list[Seconds] = Field(min_length=1)
    first_call_s: Seconds | None = None
    noisy: bool = False
    stalled: bool = False
    single_repeat: bool = False
    cpu_s: Seconds | None = None
    #: a size-independent pipeline: the size whose measurement this point repeats
    copied_from: int | None = None
    #: process CPU seconds per call at one intra-op thread (one core's work; measured on the CPU
    #: when profiling at several threads, else None)
    one_core_s: Seconds | None = None
    #: the load average (1 minute) when the point was measured
    load: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    peak_host_bytes: Bytes = 0.0
    peak_device_bytes: Bytes | None = None
    input_bytes: Bytes = 0.0
    output_bytes: Bytes = 0.0


class DeviceProfile(BaseModel):
    """A stage's measurements on one device; ``kind`` is a registered device kind
    (``kind="sim"``: the simulated test device)."""

    device: str
    kind: str
    points: list[Point] = Field(default_factory=list)
    error: str | None = None

    @field_validator("kind")
    @classmethod
    def _registered(cls, v: str) -> str:
        return check_kind(v)


class WorkPoint(BaseModel):
    """A stage's counted work at one size (for predicting absent devices)."""

    size: int
    work: Work


class StageProfile(BaseModel):
    """Everything measured about one stage."""

    name: str
    kind: str = "other"
    inputs: list[str] = Field(default_factory=list)
    key: str
    measured_at: str = ""
    devices: dict[str, DeviceProfile] = Field(default_factory=dict)
    work: list[WorkPoint] = Field(default_factory=list)
    #: CPU seconds of each size's reference run (its first call at that size)
    reference_s: dict[int, float] = Field(default_factory=dict)
    #: device classes the stage has implementations for, and its pin (from the pipeline)
    device_classes: list[str] = Field(default_factory=lambda: ["cpu", "gpu"])
    pin: str | None = None
    #: how the stage was measured: ``{"measured": [sizes], "target_size": N,
    #: "extrapolated": bool, "rel_error": float, "error_from": "leave-one-out"|"fit forms disagree"|"spread"|"none"}``
    coverage: dict[str, Any] = Field(default_factory=dict)
    #: warnings about the stage found while profiling (mutates its input, consumes an iterator)
    warnings: list[str] = Field(default_factory=list)
    #: each allowed lower precision, run here and compared with fp32 (see placer.profile.precision)
    precision_checks: list[PrecisionCheck] = Field(default_factory=list)

    @model_validator(mode="after")
    def _reference_plausible(self) -> StageProfile:
        for n, t in self.reference_s.items():
            if not (n >= 1 and 0.0 <= t <= MAX_SECONDS):  # NaN fails both
                raise ValueError(f"reference time {t!r} at size {n} is not a plausible time")
        return self


class Profile(BaseModel):
    """A pipeline's profile on one machine.

    Attributes
    ----------
    fingerprint : str
        The machine (:meth:`placer.devices.Inventory.fingerprint`).
    sizes : list of int
        Sizes planned; ``measured_sizes`` those that fitted in the budget.
    target_size : int or None
        The size predictions are wanted at (``--size``).
    transfer : dict
        Device name → :class:`~placer.costmodel.bus.TransferModel`, measured here.
    notes : list of str
        What was skipped and why (budget, failures, noisy measurements).
    """

    schema_: Literal["placer.profile/1"] = Field(SCHEMA, alias="schema")
    pipeline: str
    fingerprint: str
    machine: dict[str, Any] = Field(default_factory=dict)
    devices: dict[str, dict[str, Any]] = Field(default_factory=dict)
    sizes: list[int] = Field(default_factory=list)
    measured_sizes: list[int] = Field(default_factory=list)
    target_size: int | None = None
    size_unit: str = "rows"
    budget_s: float | None = None
    elapsed_s: float = 0.0
    created_at: str = ""
    stages: dict[str, StageProfile] = Field(default_factory=dict)
    transfer: dict[str, TransferModel] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    #: where the pipeline came from (its file's full path), so same-named files never share a cache entry
    source: str = ""
    #: the machine's load while profiling: ``{"load_start", "load_end", "cpu_per_wall"}``
    machine_load: dict[str, float | None] = Field(default_factory=dict)

    model_config = {"populate_by_name": True}

    def save(self, path: str | os.PathLike) -> Path:
        """Write this profile as JSON, atomically."""
        return write_text_atomic(path, self.model_dump_json(by_alias=True, indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """Read a profile file (a saved profile, or the document of ``placer profile -o``);
        raise :class:`~placer.errors.PlacerError` naming the problem."""
        p = Path(path)
        again = "; run `placer profile` again"
        data = read_json(p, f"profile {str(p)!r}", "run `placer profile` again")
        if isinstance(data, dict) and isinstance(data.get("profile"), dict):
            data = data["profile"]  # the document `placer profile -o/--json` writes holds the profile
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PlacerError(f"{str(p)!r} is not a placer profile (expected schema {SCHEMA!r})")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            errs = exc.errors()
            parts = [f"field {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errs[:3]]
            more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
            raise PlacerError(f"profile {str(p)!r}: {'; '.join(parts)}{more}{again}") from None
        except RecursionError:
            raise PlacerError(f"profile {str(p)!r} is nested too deeply{again}") from None


def too_deep(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests arrays/objects more than ``limit`` deep (strings skipped)."""
    depth = 0
    for ch in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if ch in "[{" else -1
        if depth > limit:
            return True
    return False


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
