"""The facts a report shows, as plain data: one pydantic model that is also the JSON format.

May import: pydantic. Nothing else: every renderer (HTML, Markdown, JSON) reads a
:class:`ReportFacts`, and a saved ``report.json`` can be rendered again later.

Seconds are wall-clock seconds; ``predicted`` numbers come from the cost model (or
a device description for a device this machine lacks), ``measured`` numbers from
runs on this machine. A device's kind is a device kind's name (``cpu``, ``gpu``,
``sim`` or a registered kind's own; see :mod:`placer.devices`), kept as plain text
so that a saved report renders where that kind is not registered. A device of kind
``sim`` is the simulated test device: it is never called a GPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SCHEMA = "placer.report/1"
#: a device kind's name (:attr:`placer.devices.Device.kind`)
DeviceKind = str


class DeviceInfo(BaseModel):
    """A device named in the report.

    ``present`` is False for a device this machine lacks (a planning target such as
    an H200): every number about it is a prediction.
    """

    name: str
    kind: DeviceKind
    label: str = ""
    present: bool = True

    @property
    def title(self) -> str:
        """How the report names the device (the simulated device never as a GPU)."""
        if self.kind == "sim":
            return f"{self.name} (simulated test device)"
        if self.kind == "cpu":
            return self.name
        return f"{self.name} ({self.label})" if self.label else self.name


class Meta(BaseModel):
    """Which pipeline, at which size, when, on what, with which versions."""

    pipeline: str
    size: int | float | None = None
    size_unit: str = "rows"
    made_at: str = ""
    run_started_at: str = ""
    versions: dict[str, str | None] = Field(default_factory=dict)
    machine: dict[str, str | int | float | None] = Field(default_factory=dict)
    devices: list[DeviceInfo] = Field(default_factory=list)
    planning_s: float | None = None
    objective: str = "makespan"
    executor: str = ""
    outputs_digest: str | None = None


class Option(BaseModel):
    """One way to place the pipeline, predicted and (when it could be run here) measured."""

    key: Literal["plan", "all_cpu", "all_gpu", "rule_of_thumb"]
    title: str
    placement: dict[str, str] = Field(default_factory=dict)
    predicted_s: float | None = None
    measured_s: float | None = None
    #: the plan's seconds divided by this option's (how much faster the plan is)
    plan_speedup_predicted: float | None = None
    plan_speedup_measured: float | None = None
    outputs_digest: str | None = None
    note: str = ""


class Summary(BaseModel):
    """The chosen plan against the alternatives."""

    options: list[Option]
    headline: str = ""
    digests_agree: bool | None = None


class DagNode(BaseModel):
    name: str
    kind: str = "other"
    device: str
    doc: str = ""


class DagEdge(BaseModel):
    """An edge ``src -> dst``; ``crosses`` when its ends sit in different memories."""

    src: str
    dst: str
    bytes: float | None = None
    crosses: bool = False
    transfer_s: float | None = None
    measured: bool = False


class Dag(BaseModel):
    nodes: list[DagNode]
    edges: list[DagEdge]


class StageRow(BaseModel):
    """One row of the per-stage table."""

    name: str
    kind: str = "other"
    device: str
    doc: str = ""
    params: dict[str, str] = Field(default_factory=dict)
    predicted_s: dict[str, float | None] = Field(default_factory=dict)
    measured_s: dict[str, float | None] = Field(default_factory=dict)
    #: per device: ``measured`` (at a measured size), ``predicted`` (fit), ``roofline``
    labels: dict[str, str] = Field(default_factory=dict)
    in_bytes: float = 0.0
    in_s: float | None = None
    out_bytes: float = 0.0
    out_s: float | None = None
    #: CPU seconds divided by the seconds on the chosen device (1.0 on the CPU)
    speedup: float | None = None
    speedup_measured: bool = False
    reason: str = ""
    crossover_size: float | None = None
    loop_carried: bool = False


class Bar(BaseModel):
    """One bar of a timeline: a stage on a lane, or a copy on a link lane."""

    lane: str
    label: str
    kind: Literal["stage", "transfer"]
    device: str
    start_s: float
    end_s: float
    bytes: float | None = None
    pinned: bool | None = None
    #: for a copy: the locations it went from and to (``host`` or a device)
    src: str | None = None
    dst: str | None = None


class Timeline(BaseModel):
    measured: list[Bar] = Field(default_factory=list)
    predicted: list[Bar] = Field(default_factory=list)
    measured_makespan_s: float | None = None
    predicted_makespan_s: float | None = None


class ErrorRow(BaseModel):
    """A stage's predicted against measured seconds on one device."""

    stage: str
    device: str
    predicted_s: float | None = None
    measured_s: float | None = None
    #: (predicted - measured) / measured
    rel_error: float | None = None
    label: str = "predicted"
    #: the device is absent: the number is a prediction with nothing to compare to
    prediction_only: bool = False


class PathStep(BaseModel):
    kind: Literal["stage", "transfer", "wait"]
    name: str
    device: str
    seconds: float


class Bottleneck(BaseModel):
    """The largest step of the critical path (measured when there is a run)."""

    kind: Literal["stage", "transfer"]
    name: str
    device: str
    seconds: float
    share: float
    source: Literal["measured", "predicted"]
    path: list[PathStep] = Field(default_factory=list)
    sentence: str = ""


class Advice(BaseModel):
    """One concrete suggestion, with the facts it rests on."""

    topic: Literal["move", "pin", "loop", "batch", "bottleneck", "target", "accuracy", "keep"]
    subject: str
    text: str


class TargetPlan(BaseModel):
    """A plan for a device this machine lacks (predictions only)."""

    device: str
    label: str
    placement: dict[str, str]
    predicted_s: float
    all_cpu_predicted_s: float | None = None
    speedup: float | None = None
    #: per stage: the size nearest this one where the target's plan moves it
    crossover_size: dict[str, float | None] = Field(default_factory=dict)


class ReportFacts(BaseModel):
    """Everything a report says. Its JSON is the report's ``json`` format."""

    schema_: str = Field(SCHEMA, alias="schema")
    meta: Meta
    summary: Summary
    dag: Dag
    stages: list[StageRow]
    timeline: Timeline
    errors: list[ErrorRow] = Field(default_factory=list)
    bottleneck: Bottleneck | None = None
    advice: list[Advice] = Field(default_factory=list)
    target: TargetPlan | None = None

    model_config = {"populate_by_name": True}

    def device(self, name: str) -> DeviceInfo | None:
        """The device called ``name``, if the report names it."""
        return next((d for d in self.meta.devices if d.name == name), None)

    def to_json(self) -> str:
        """The JSON document (schema ``placer.report/1``)."""
        return self.model_dump_json(indent=2, by_alias=True)
