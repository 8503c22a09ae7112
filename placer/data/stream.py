"""What planning a stream measures and decides: its profile and its plan.

May import: pydantic, placer.data.views (tables and the notebook view).

A :class:`StreamProfile` is what :mod:`placer.stream.profile` measured of one
stream at its real batch size: each stage's seconds per batch on each device
(wall time and the host CPU time it used), how each CPU stage scales with thread
workers (one :class:`ScalingRow` per worker count and kind: ``process`` rows are
added the same way once process workers run), the bytes of every per-batch value
and what copying it to or from each accelerator costs, and the step's rate on
already-prepared batches (the differential test: what the consumer could take).

A :class:`StreamPlan` is what :mod:`placer.stream.planner` chose from it: a device
per stage, the stream settings (the fields of
:class:`placer.stream.StreamConfig`), the predicted samples per second and the
bottleneck, a reason per stage, baselines, a what-if table and, when verified, the
measured samples per second of the best few candidates.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from placer.data.views import Views

WorkerKind = Literal["thread", "process"]


class ScalingRow(BaseModel):
    """One measurement of a stage run by ``workers`` parallel workers of one kind."""

    kind: WorkerKind = "thread"
    workers: int = Field(ge=1)
    batches_per_s: float = Field(ge=0)
    #: ``batches_per_s`` over the one-worker rate of the same kind
    speedup: float = Field(ge=0)


class StageProfile(BaseModel):
    """One member of a stream as measured.

    Attributes
    ----------
    seconds : dict
        Device → wall seconds per batch (a lower quartile over the measured
        batches after the first, which pays for warm-up).
    cpu_seconds : dict
        Device → host CPU seconds per batch (all threads of the process): what the
        stage takes from the cores. Near zero for a stage that sleeps or waits.
    reads : list of str
        The per-batch values (stages of the stream) it reads.
    out_bytes : dict
        Location (``host`` or a device name) → bytes of its output per batch.
    scaling : list of ScalingRow
        CPU batch stages: batches per second with 1..N workers.
    gil_bound : bool or None
        Two thread workers gave less than :data:`GIL_SPEEDUP` times one (the stage
        holds the GIL, or the cores were busy); None when not measured.
    gil : float or None
        The share of its time the member holds the GIL, measured with a probe thread
        (the step and the source, which cannot run on several threads at once);
        None when not measured (a batch stage's share comes from its scaling).
    torch_seconds : dict
        The step on the CPU: torch intra-op threads → wall seconds per batch, for the
        counts measured besides torch's default (which ``seconds`` holds).
    torch_cpu_seconds : dict
        The same counts → host CPU seconds per batch.
    busy_seconds : dict
        The step on the CPU: intra-op thread count (torch's default included) → wall
        seconds per batch while another thread keeps one core busy, as the stream's
        workers do. Parallel regions wait for their slowest thread, so a step on every
        core can run slower beside one busy core than on one thread.
    cacheable : bool
        Its output, and everything before it, is the same in every epoch.
    """

    name: str
    role: Literal["source", "batch", "step"]
    kind: str = "other"
    devices: list[str] = Field(default_factory=list)
    seconds: dict[str, float] = Field(default_factory=dict)
    cpu_seconds: dict[str, float] = Field(default_factory=dict)
    reads: list[str] = Field(default_factory=list)
    out_bytes: dict[str, int] = Field(default_factory=dict)
    scaling: list[ScalingRow] = Field(default_factory=list)
    gil_bound: bool | None = None
    gil: float | None = Field(None, ge=0, le=1)
    torch_seconds: dict[int, float] = Field(default_factory=dict)
    torch_cpu_seconds: dict[int, float] = Field(default_factory=dict)
    busy_seconds: dict[int, float] = Field(default_factory=dict)
    cacheable: bool = False
    pin: str | None = None

    def rate(self, workers: int, kind: WorkerKind, seconds: float) -> float:
        """Batches per second with ``workers`` of ``kind``: threads scale ``1 / seconds`` by their
        measured speed-up; processes scale their own measured one-process rate (which pays for
        moving batches to and from the child), else ``1 / seconds``."""
        base = 1.0 / seconds if seconds > 0 else float("inf")
        if kind == "process":
            one = next((r.batches_per_s for r in self.scaling if r.kind == "process" and r.workers == 1), None)
            base = one or base
        return base * self.speedup(workers, kind)

    def speedup(self, workers: int, kind: WorkerKind = "thread") -> float:
        """The measured speed-up with ``workers`` of ``kind``: interpolated between measured counts,
        held at the last measured value beyond them; ``workers`` itself when nothing was measured."""
        rows = sorted((r.workers, r.speedup) for r in self.scaling if r.kind == kind)
        if not rows:
            return float(workers)
        rows = [(1, 1.0), *[r for r in rows if r[0] > 1]]
        if workers >= rows[-1][0]:
            return rows[-1][1]
        for (w0, s0), (w1, s1) in zip(rows, rows[1:]):
            if w0 <= workers <= w1:
                return s0 + (s1 - s0) * (workers - w0) / (w1 - w0)
        return 1.0

    @property
    def max_workers(self) -> int:
        """The most thread workers measured (1 when unmeasured)."""
        return max([1, *[r.workers for r in self.scaling if r.kind == "thread"]])


class CopyProfile(BaseModel):
    """Copying one per-batch value between the host and an accelerator, per batch.

    ``seconds`` maps the way of copying to seconds: ``executor`` (the copy the
    stream's copy node makes), and on a real GPU ``pinned`` (from page-locked
    memory) and ``pageable``.
    """

    value: str
    src: str
    dst: str
    bytes: int = 0
    seconds: dict[str, float] = Field(default_factory=dict)
    #: host CPU seconds per copy (a copy into a simulated device is work of the host)
    cpu_seconds: float = 0.0


class LoaderSettings(BaseModel):
    """The worker settings of a DataLoader a source returned (the user's own baseline)."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    batch_size: int | None = None


class StreamProfile(BaseModel):
    """One stream measured at its real batch size on this machine's devices.

    Attributes
    ----------
    members : list of str
        Source, per-batch stages and step, in dispatch order.
    samples_per_batch : float
        Mean samples in the measured batches.
    batches_per_epoch : int or None
        Counted or derived from the pipeline's size and the batch size.
    cores : int
        The host's cores (``os.cpu_count()``): what CPU workers share.
    device_titles : dict
        Device → what it is in words (``CPU``, ``GPU``, ``simulated test device``).
    simulated : list of str
        Devices that stand in for hardware in tests; their work runs on the host's cores.
    consumer_samples_per_s : dict
        Device → the step's samples per second on already-prepared batches.
    """

    pipeline: str
    source: str
    step: str
    members: list[str]
    epochs: int = 1
    batch_size: int | None = None
    samples_per_batch: float = 1.0
    batches_per_epoch: int | None = None
    source_kind: Literal["iterable", "dataset", "loader"] = "iterable"
    loader: LoaderSettings | None = None
    cores: int = 1
    devices: list[str] = Field(default_factory=lambda: ["cpu"])
    device_titles: dict[str, str] = Field(default_factory=dict)
    simulated: list[str] = Field(default_factory=list)
    real_gpus: list[str] = Field(default_factory=list)
    stages: list[StageProfile] = Field(default_factory=list)
    copies: list[CopyProfile] = Field(default_factory=list)
    consumer_samples_per_s: dict[str, float] = Field(default_factory=dict)
    measured_batches: dict[str, int] = Field(default_factory=dict)
    budget_s: float | None = None
    seconds: float = 0.0
    #: torch's intra-op threads while the profile ran (None: torch was not loaded)
    torch_threads: int | None = None
    notes: list[str] = Field(default_factory=list)

    def stage(self, name: str) -> StageProfile:
        return next(s for s in self.stages if s.name == name)

    def copy_of(self, value: str, src: str, dst: str) -> CopyProfile | None:
        return next((c for c in self.copies if c.value == value and c.src == src and c.dst == dst), None)


#: two thread workers below this speed-up mark a stage as GIL-bound (as FastFlow's 1.3)
GIL_SPEEDUP = 1.3


class StageDecision(BaseModel):
    """What the plan chose for one member of the stream, with its modelled rate and the reason."""

    name: str
    device: str
    workers: int = 1
    worker_kind: WorkerKind = "thread"
    seconds_per_batch: float = 0.0
    batches_per_s: float = 0.0
    reason: str = ""


class Alternative(BaseModel):
    """A baseline or a what-if: a placement and settings, and their predicted (and measured) speed."""

    name: str
    change: str = ""
    placement: dict[str, str] = Field(default_factory=dict)
    config: dict = Field(default_factory=dict)
    predicted_samples_per_s: float = 0.0
    #: the plan's predicted speed over this one's (baselines), or this one's over the start (what-ifs)
    speedup: float | None = None
    predicted_total_s: float | None = None
    bottleneck: str = ""
    measured_samples_per_s: float | None = None


class Verification(BaseModel):
    """A candidate run for a few batches, several times: predicted and measured samples per second
    (``measured_samples_per_s``: the median of ``runs``)."""

    name: str
    placement: dict[str, str] = Field(default_factory=dict)
    config: dict = Field(default_factory=dict)
    predicted_samples_per_s: float
    measured_samples_per_s: float
    batches: int = 0
    runs: list[float] = Field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Measured over predicted."""
        return self.measured_samples_per_s / self.predicted_samples_per_s if self.predicted_samples_per_s else 0.0


class StreamPlan(Views, BaseModel):
    """How one stream should run, and why.

    ``workers``, ``stage_workers``, ``worker_kind``, ``prefetch``, ``pin_memory``,
    ``cache`` and ``torch_threads`` are the fields of :class:`placer.stream.StreamConfig`
    (:func:`placer.stream.planner.stream_config` builds one). ``objective`` is
    ``throughput`` (steady-state samples per second) or ``total_time`` (seconds over
    ``epochs`` epochs, where a cache point pays off).
    """

    pipeline: str
    source: str
    step: str
    objective: Literal["throughput", "total_time"] = "throughput"
    epochs: int = 1
    placement: dict[str, str] = Field(default_factory=dict)
    workers: int = 1
    stage_workers: dict[str, int] = Field(default_factory=dict)
    worker_kind: dict[str, WorkerKind] = Field(default_factory=dict)
    prefetch: int = 2
    pin_memory: bool = True
    cache: str | None = None
    torch_threads: int | None = None
    #: the objective's samples per second: the steady state, or (``total_time``) the mean over the epochs
    predicted_samples_per_s: float = 0.0
    predicted_total_s: float | None = None
    bottleneck: str = ""
    consumer_samples_per_s: float | None = None
    stages: list[StageDecision] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    baselines: list[Alternative] = Field(default_factory=list)
    what_if: list[Alternative] = Field(default_factory=list)
    verified: list[Verification] = Field(default_factory=list)
    candidates: int = 0
    search: str = ""
    notes: list[str] = Field(default_factory=list)
    profile_s: float = 0.0
    planning_s: float = 0.0

    def config_fields(self) -> dict:
        """The :class:`~placer.stream.StreamConfig` fields this plan chose."""
        return {"workers": self.workers, "stage_workers": dict(self.stage_workers),
                "worker_kind": dict(self.worker_kind), "prefetch": self.prefetch,
                "pin_memory": self.pin_memory, "cache": self.cache, "torch_threads": self.torch_threads}

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)
