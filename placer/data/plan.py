"""A plan: a placement, its predicted schedule, and the reason for every choice.

May import: pydantic, placer.errors, placer.files, placer.data.views. Plain data: :mod:`placer.optimize` makes these,
the executor runs ``Plan.placement``, the report explains them.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from placer.errors import InputFileError
from placer.files import read_json, write_text_atomic

from placer.data.views import Views


class StageEvent(BaseModel):
    """A stage's run in the simulated schedule."""

    name: str
    device: str
    start_s: float
    end_s: float


class TransferEvent(BaseModel):
    """One copy of a stage's output (or of its external input, ``external=True``)."""

    data: str
    src: str
    dst: str
    bytes: float
    start_s: float
    end_s: float
    seconds: float
    external: bool = False


class Schedule(BaseModel):
    """The simulated schedule of one placement."""

    makespan_s: float
    stages: list[StageEvent]
    transfers: list[TransferEvent]



class StageChoice(BaseModel):
    """One stage's device and the reason for it."""

    name: str
    kind: str
    device: str
    #: predicted seconds on every device that has a time for the stage
    predicted_s: dict[str, float]
    #: copy seconds this choice adds (negative: saves) against the best other device
    transfer_s: float
    #: copy seconds of this stage's inputs in and output out, under the plan
    copy_s: float
    reason: str
    #: the size nearest the requested one where the plan moves this stage (None: none within 1,000x)
    crossover_size: float | None = None
    pinned: bool = False
    #: the precision it is planned in (``fp32``: nothing changed; see placer.precision)
    precision: str = "fp32"
    #: device → precision → predicted seconds, for every precision it may run in (the what-if)
    precision_s: dict[str, dict[str, float]] = Field(default_factory=dict)


class Tie(BaseModel):
    """A placement whose predicted objective is within the noise of the plan's."""

    placement: dict[str, str]
    #: the stages it places differently from the plan, and where
    differs: dict[str, str] = Field(default_factory=dict)
    objective_value: float
    predicted_makespan_s: float
    #: copies its schedule makes, and stages it runs on the CPU (the tie-break's keys)
    copies: int = 0
    on_cpu: int = 0
    #: tied only within the uncertainty of stage times the fit forms disagree on (beyond the noise)
    fits_disagree: bool = False


#: how a plan is chosen among placements within the noise of each other
TIE_RULE = "fewer copies, then more stages on the CPU"


class Plan(Views, BaseModel):
    """A placement (stage -> device), its predicted schedule, and the reason for every choice.

    Anyone may build one by hand; only ``placement`` is needed to run it.
    """

    placement: dict[str, str]
    #: the pipeline planned, when known (set it on a plan to have ``placer report`` check it
    #: against the runs; the planner, which sees only a cost table, leaves it unset)
    pipeline: str | None = None
    #: the objective's name (see :mod:`placer.optimize.objectives`)
    objective: str = "makespan"
    method: Literal["exact", "heuristic", "given"] = "given"
    algorithm: str = ""
    predicted_makespan_s: float
    #: the objective's value: seconds (makespan), seconds per batch (throughput), money (cost)
    objective_value: float
    predicted_period_s: float | None = None
    predicted_cost: float | None = None
    deadline_s: float | None = None
    schedule: Schedule
    stages: list[StageChoice] = Field(default_factory=list)
    baselines: dict[str, float | None] = Field(default_factory=dict)
    planning_s: float = 0.0
    size: float | None = None
    size_unit: str = "rows"
    #: device name -> kind (``cpu``, ``gpu`` or ``sim``)
    devices: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    #: other placements predicted within ``noise`` (relative) of the plan; it was chosen
    #: among them by ``tie_rule``
    ties: list[Tie] = Field(default_factory=list)
    noise: float | None = None
    tie_rule: str = TIE_RULE
    #: stage → the lower precision it runs in (absent: fp32); the executor runs a plan in them
    precision: dict[str, str] = Field(default_factory=dict)
    #: lower precisions not allowed that would be much faster, in words
    precision_notes: list[str] = Field(default_factory=list)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text; ``Plan.model_validate_json`` reads it back."""
        return self.model_dump_json(indent=indent)

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON, atomically."""
        write_text_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        """Read a saved plan; :class:`~placer.errors.InputFileError` names the file and the bad fields."""
        data = read_json(path, f"plan {str(path)!r}", "save the plan again with `placer plan -o`")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            fields = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
            raise InputFileError(f"plan {str(path)!r}: {fields}; save the plan again with `placer plan -o`") from None
        except RecursionError:
            raise InputFileError(f"plan {str(path)!r} is nested too deeply; save the plan again") from None
