"""The facts a report shows, as plain data: one pydantic model that is also the JSON format.

May import: pydantic, placer.data.views (tables and the notebook view). Nothing else: every renderer (HTML, Markdown, JSON) reads a
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

from pydantic import BaseModel, Field, model_serializer

from placer.data.views import Views

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
    #: where the measured options' outputs first differ beyond the digest's tolerance ("" when they agree)
    outputs_differ: str = ""


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
    #: the precision it ran in (the run's record), else the plan's (``fp32``: nothing changed)
    precision: str = "fp32"


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

    topic: Literal["move", "pin", "loop", "batch", "bottleneck", "target", "accuracy", "keep",
                   "workers", "prefetch", "stream"]
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
    #: the target machine, its CPU (model and cores) and where the CPU's times come from
    #: (``described``: scaled to the target's CPU; ``this machine``: not scaled)
    machine: str = ""
    cpu: str = ""
    cpu_cores: int | None = None
    cpu_source: str = ""
    #: placements whose predictions are within the noise of the plan's (see Plan.ties)
    ties: list[dict] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    #: stage → the lower precision the target's plan runs it in (absent: fp32)
    precision: dict[str, str] = Field(default_factory=dict)
    #: stage → device → precision → predicted seconds (stages with a lower precision allowed or fixed)
    precision_s: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    #: stage → each checked precision's measured difference from fp32 here (``PrecisionCheck`` fields)
    precision_checks: dict[str, list[dict]] = Field(default_factory=dict)
    #: stage → why it runs in its precision (both numbers), where a lower one was allowed or fixed
    precision_reasons: dict[str, str] = Field(default_factory=dict)
    #: lower precisions not allowed that would be much faster, in words
    precision_notes: list[str] = Field(default_factory=list)


class StreamOption(BaseModel):
    """A way to run a stream, as planned (predicted) and, where it was run, as measured."""

    name: str
    change: str = ""
    predicted_samples_per_s: float | None = None
    measured_samples_per_s: float | None = None
    #: the plan's samples/s over this option's (above 1: the plan is faster); measured over several
    #: interleaved rounds, the median of each round's ratio
    plan_speedup_predicted: float | None = None
    plan_speedup_measured: float | None = None
    #: every run's measured samples/s where the option ran more than once (``measured_samples_per_s``: the
    #: median run's)
    measured_runs: list[float] = Field(default_factory=list)
    #: a what-if row: the change's predicted speed-up over its starting point (``change`` names it)
    speedup: float | None = None
    bottleneck: str = ""


class StreamStageFacts(BaseModel):
    """One node of a stream (its source, a per-batch stage, a copy into a device, its step).

    The three shares split the node's worker time (its wall time times its workers):
    computing (``busy``), waiting for input (``starved``), waiting for room downstream
    or for its turn (``blocked``).
    """

    name: str
    kind: Literal["source", "batch", "step", "copy"]
    device: str
    workers: int
    worker_kind: str = "thread"
    #: a source read from a DataLoader's worker processes: how many
    loader_workers: int = 0
    #: a source read by a thread-pool loader's threads: how many
    loader_threads: int = 0
    batches: int = 0
    busy_s: float = 0.0
    starved_s: float = 0.0
    blocked_s: float = 0.0
    wall_s: float = 0.0
    busy_share: float = 0.0
    starved_share: float = 0.0
    blocked_share: float = 0.0
    #: samples per second the node's workers could sustain if they never waited
    #: (its samples over its busy seconds, times its workers); None when it did no work
    capacity_samples_per_s: float | None = None


class QueueFacts(BaseModel):
    """The bounded queue from ``src`` to ``dst``, sampled each time the step took a batch."""

    src: str
    dst: str
    capacity: int
    mean: float = 0.0
    #: shares of the samples at which the queue was full, and empty
    full_share: float = 0.0
    empty_share: float = 0.0


class StreamTargetFacts(BaseModel):
    """A stream planned for a described machine (``--target``): every number a prediction for ``machine``.

    Attributes
    ----------
    machine : str
        The target's name (``NVIDIA H200 machine (16-core ...)``).
    predicted_samples_per_s : float
        The plan's samples per second there.
    step_samples_per_s : float or None
        What the step could take there on prepared batches.
    bottleneck : str
        The resource that would bind there (a stage, ``gpu:0``, ``cores``, ``GIL``, a link).
    predicted_wait_fraction : float or None
        ``1 - predicted_samples_per_s / step_samples_per_s``: the share of the step's time lost
        waiting for data (or, with other stages on its GPU, to them).
    sentence : str
        What it would be bound by, in one sentence naming the machine.
    settings : dict
        The placement and settings chosen for the target.
    stages : list of dict
        Per member: device, workers, worker kind, predicted seconds per batch and batches/s.
    what_if : list of StreamOption
        Predicted options there (a stage on the GPU, workers, pinning, ...).
    """

    machine: str
    predicted_samples_per_s: float
    step_samples_per_s: float | None = None
    bottleneck: str = ""
    predicted_wait_fraction: float | None = None
    sentence: str = ""
    settings: dict = Field(default_factory=dict)
    stages: list[dict] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    what_if: list[StreamOption] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class StreamClusterFacts(BaseModel):
    """A stream's CPU stages as tasks on a dask cluster (``placer advise --scheduler``): per stage its remote
    tasks in flight (``remote_workers``), batches per task (``group``), bytes per batch and what bounds it;
    the stream's predicted and measured samples per second with the cluster and with this machine's workers
    only; the network's load and its share of the link."""

    cluster: str
    source: str = "measured"
    threads: int = 1
    stages: list[dict] = Field(default_factory=list)
    predicted_samples_per_s: float = 0.0
    measured_samples_per_s: float | None = None
    local_predicted_samples_per_s: float = 0.0
    local_measured_samples_per_s: float | None = None
    network_bytes_per_s: float = 0.0
    network_share: float = 0.0
    bandwidth_bytes_per_s: float = 0.0
    chosen: bool = False
    reason: str = ""


class StreamFacts(BaseModel):
    """What one stream of minibatches did: throughput, per-stage time, queues, its bottleneck."""

    source: str
    step: str
    epochs: int
    batches: int
    samples: int
    seconds: float
    #: samples per second in steady state (after the first batch reached the step)
    samples_per_s: float
    time_to_first_batch_s: float
    #: before the stream's clock: building the step's state, starting worker processes
    setup_s: float = 0.0
    #: the step's share of time spent waiting for data
    consumer_idle_fraction: float
    prefetch: int
    peak_inflight_batches: int = 0
    peak_inflight_bytes: int = 0
    cache: str | None = None
    #: the stream ran each batch through every stage in turn (no overlap, no queues)
    sequential: bool = False
    stages: list[StreamStageFacts] = Field(default_factory=list)
    queues: list[QueueFacts] = Field(default_factory=list)
    #: occupancy of each queue (in ``queues`` order) when the step took a batch: [t_s, [sizes]]
    queue_trace: list[tuple[float, list[int]]] = Field(default_factory=list)
    #: samples per second of the step measured alone (fed from memory); None when not measured
    step_only_samples_per_s: float | None = None
    #: ``input``: the step waited for data; ``step``: the step was the slowest;
    #: ``balanced``: neither; ``sequential``: a run without overlap
    bound: Literal["input", "step", "balanced", "sequential"] = "balanced"
    #: the node that limits throughput (the slowest upstream node when input-bound)
    bottleneck: str = ""
    sentence: str = ""
    notes: list[str] = Field(default_factory=list)
    #: from the stream's plan, when one was made: its predicted samples/s and reasons, the
    #: plan against the usual settings, and what single changes would do
    predicted_samples_per_s: float | None = None
    plan_reasons: list[str] = Field(default_factory=list)
    options: list[StreamOption] = Field(default_factory=list)
    #: what the options' samples/s are: ``whole run`` (the mean over the run, worker start-up and epoch
    #: ends included: a plan for the run's total time) or ``steady state``
    options_measure: str = "steady state"
    #: runs of each option (the plan and each baseline), interleaved; the median run's numbers are shown
    options_runs: int = 1
    #: runs of the plan (and of one batch at a time, ``num_workers=0``), where more than ``options_runs``: more
    #: rounds of the two alone where their rounds' ratios, the speed-up the report claims, spread wide
    claim_runs: int = 0
    what_if: list[StreamOption] = Field(default_factory=list)
    #: the stream planned for a described machine (``--target``): predictions for it, never measured
    target: StreamTargetFacts | None = None
    #: the cluster option (``--scheduler``): remote workers per stage, predicted and measured, the network
    cluster: StreamClusterFacts | None = None


class ReportFacts(Views, BaseModel):
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
    #: one entry per stream of minibatches the run had; None for a one-shot pipeline
    #: (and then absent from the JSON, which stays as it was before streams)
    streams: list[StreamFacts] | None = None

    model_config = {"populate_by_name": True}

    @model_serializer(mode="wrap")
    def _drop_absent_streams(self, handler):
        data = handler(self)
        if self.streams is None and isinstance(data, dict):
            data.pop("streams", None)
        return data

    def device(self, name: str) -> DeviceInfo | None:
        """The device called ``name``, if the report names it."""
        return next((d for d in self.meta.devices if d.name == name), None)

    def to_json(self) -> str:
        """The JSON document (schema ``placer.report/1``)."""
        return self.model_dump_json(indent=2, by_alias=True)
