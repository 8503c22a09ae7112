"""A profile: what was measured about a pipeline's stages on one machine.

May import: pydantic, placer.errors, placer.files, placer.data.measures, placer.devices
(its registry, to check device kinds). No measuring or device code: :mod:`placer.profile` measures and writes these; the cost model reads
them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from placer.data.measures import TransferModel, Work
from placer.devices import check_kind
from placer.errors import PlacerError
from placer.files import read_json, write_text_atomic

SCHEMA = "placer.profile/1"



class Point(BaseModel):
    """One (stage, device, size) measurement.

    ``median_s``/``iqr_s`` summarise ``raw_times`` (seconds per call, steady state);
    ``first_call_s`` is the first call at this size on this device in this process.
    """

    size: int
    median_s: float
    iqr_s: float
    reps: int
    number_per_run: int = 1
    raw_times: list[float]
    first_call_s: float | None = None
    noisy: bool = False
    peak_host_bytes: float = 0.0
    peak_device_bytes: float | None = None
    input_bytes: float = 0.0
    output_bytes: float = 0.0


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

    model_config = {"populate_by_name": True}

    def save(self, path: str | os.PathLike) -> Path:
        """Write this profile as JSON, atomically."""
        return write_text_atomic(path, self.model_dump_json(by_alias=True, indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """Read a profile file (a saved profile, or the document of ``placer profile -o``);
        raise :class:`~placer.errors.PlacerError` naming the problem."""
        p = Path(path)
        data = read_json(p, f"profile {str(p)!r}", "run `placer profile` again")
        if isinstance(data, dict) and isinstance(data.get("profile"), dict):
            data = data["profile"]  # the document `placer profile -o/--json` writes holds the profile
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PlacerError(f"{str(p)!r} is not a placer profile (expected schema {SCHEMA!r})")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            fields = "; ".join(f"field {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
            raise PlacerError(f"profile {str(p)!r}: {fields}; run `placer profile` again") from None
        except RecursionError:
            raise PlacerError(f"profile {str(p)!r} is nested too deeply; run `placer profile` again") from None
