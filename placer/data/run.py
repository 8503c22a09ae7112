"""What a run records: the timeline of stages and transfers, and the outputs' digest.

May import: pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr


# Plain dataclasses, not models: one is made per stage on the executor's hot path, and
# pydantic validates and serialises them as fields of Run all the same.
@dataclass(slots=True)
class StageRecord:
    """One stage's execution: where, on which lane, when."""

    name: str
    device: str
    lane: str
    start_s: float
    end_s: float
    seconds: float
    output_bytes: int = 0
    worker: str | None = None
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None


@dataclass(slots=True)
class TransferRecord:
    """One copy of a stage's output between locations (``host`` or a device name)."""

    data: str
    src: str
    dst: str
    direction: Literal["h2d", "d2h", "d2d"]
    bytes: int
    start_s: float
    end_s: float
    seconds: float
    pinned: bool = False


class Run(BaseModel):
    """A finished (or failed) run of a pipeline under a placement.

    ``outputs`` (not serialised) holds every finished stage's output as produced;
    ``final_outputs`` the sinks' outputs on the host.
    """

    pipeline: str
    size: int | None = None
    placement: dict[str, str]
    executor: str
    workers: int
    makespan_s: float
    stages: list[StageRecord] = Field(default_factory=list)
    transfers: list[TransferRecord] = Field(default_factory=list)
    outputs_digest: str | None = None
    devices: dict[str, str] = Field(default_factory=dict)
    started_at: str = ""
    versions: dict[str, str | None] = Field(default_factory=dict)
    error: str | None = None
    failed_stage: str | None = None

    # plain defaults (no factories): constructing a Run stays cheap on the hot path
    _outputs: dict[str, Any] | None = PrivateAttr(default=None)
    _final: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def outputs(self) -> dict[str, Any]:
        """Every finished stage's output, where it was produced."""
        if self._outputs is None:
            self._outputs = {}
        return self._outputs

    @property
    def final_outputs(self) -> dict[str, Any]:
        """The sinks' outputs, on the host."""
        if self._final is None:
            self._final = {}
        return self._final

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)

    def summary(self) -> dict[str, Any]:
        """The JSON document of ``placer run --json``."""
        return self.model_dump(mode="json")
