"""What a run records: the timeline of stages and transfers, and the outputs' digest.

May import: pydantic, placer.data.views (tables and the notebook view).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from placer.data.views import Views


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
    #: per-batch stages of a stream: seconds computing, waiting for input, waiting for
    #: room downstream (summed over its workers), and its workers (None: a one-shot stage)
    busy_s: float | None = None
    starved_s: float | None = None
    blocked_s: float | None = None
    workers: int | None = None
    worker_kind: str | None = None
    #: the precision it ran in (``fp32``: torch's default, nothing changed; see placer.precision)
    precision: str = "fp32"


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


class StreamStageStats(BaseModel):
    """One node of a stream (a stage, or a copy into a device) over a whole run.

    ``busy_s + starved_s + blocked_s`` is the node's wall time times its workers:
    ``starved_s`` is time its workers waited for input, ``blocked_s`` time they
    waited for room downstream (or for their turn, to keep batches in order).
    """

    name: str
    kind: Literal["source", "batch", "step", "copy"]
    device: str
    workers: int
    worker_kind: str
    batches: int = 0
    busy_s: float = 0.0
    starved_s: float = 0.0
    blocked_s: float = 0.0
    wall_s: float = 0.0
    #: a source read from a DataLoader's worker processes: how many (its batches arrive ready; the node's
    #: busy time is the wait for them in the thread that reads it)
    loader_workers: int = 0
    #: a source read by a thread-pool loader's threads: how many (as ``loader_workers``, threads of this process)
    loader_threads: int = 0

    @property
    def utilisation(self) -> float:
        """Busy share of the node's worker time."""
        total = self.wall_s * max(self.workers, 1)
        return self.busy_s / total if total > 0 else 0.0


class StreamStats(BaseModel):
    """What one stream did in a run: throughput, per-node accounting, queues, the consumer's idle time."""

    source: str
    step: str
    epochs: int
    batches: int
    samples: int
    seconds: float
    #: before the stream's clock started: the step's ``init`` (building the model) and any
    #: worker processes starting
    setup_s: float = 0.0
    #: samples per second in steady state (after the first batch left the step, leaving out the batches
    #: that had filled the queues by then)
    samples_per_s: float
    #: from the stream's start until the step began its first batch
    time_to_first_batch_s: float
    #: the step's share of time spent waiting for data (the GPU's idle share when it trains there)
    consumer_idle_fraction: float
    #: the bound on batches in flight (queue capacity per edge) and the peaks seen
    prefetch: int
    peak_inflight_batches: int = 0
    peak_inflight_bytes: int = 0
    cache: str | None = None
    stages: list[StreamStageStats] = Field(default_factory=list)
    #: occupancy of each queue (in node order) when the step took each batch: [t_s, [sizes]]
    queue_trace: list[tuple[float, list[int]]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    #: whether every batch went through every node in turn, none overlapping (``workers=0``); None: not
    #: recorded (read from the queue trace: a run without queues was one batch at a time)
    sequential: bool | None = None


def _check_seconds(where: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where} is {value!r}; a run's times are finite and >= 0 (regenerate the file)")


class Run(Views, BaseModel):
    """A finished (or failed) run of a pipeline under a placement.

    ``outputs`` (not serialised) holds every finished stage's output as produced;
    ``final_outputs`` the sinks' outputs on the host. ``to_pandas()`` and the notebook
    view come from :class:`~placer.data.views.Views`.

    Attributes
    ----------
    pipeline : str
        The pipeline's name.
    size, size_unit
        The size it was built at, and what that counts.
    placement : dict of str to str
        Stage → device it ran on.
    executor : str
        How stages were dispatched (``inline``, ``threads``, ``distributed``).
    workers : int
        CPU stages that could run at once.
    makespan_s : float
        Wall seconds from the first stage's start to the last one's end.
    stages : list of StageRecord
        Each stage's device, lane, start, end and seconds.
    transfers : list of TransferRecord
        Each copy between locations, with its bytes and seconds.
    outputs_digest : str or None
        A hash of the final outputs (:mod:`placer.digest`): equal on every placement.
    devices : dict of str to str
        Device → its description.
    started_at : str
        ISO time of the start.
    versions : dict
        Library versions (torch, numba, dask).
    error, failed_stage : str or None
        What failed and where (a failed run keeps the finished stages).
    streams : list of StreamStats
        One entry per stream: throughput, per-stage accounting, queues.
    """

    pipeline: str
    size: int | None = None
    #: what ``size`` counts (rows, images, samples, ...)
    size_unit: str = "rows"
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
    #: one entry per stream the pipeline has (empty for a one-shot pipeline)
    streams: list[StreamStats] = Field(default_factory=list)

    @model_validator(mode="after")
    def _plausible(self) -> Run:
        """A saved run read back: durations finite and >= 0, start and end times finite (a tampered
        or corrupt file is refused; start times may be a little negative on a cluster, clocks differ).

        Runs the executor makes are built without validation, so this costs nothing on the hot path.
        """
        _check_seconds("makespan_s", self.makespan_s)
        for kind, recs in (("stages", self.stages), ("transfers", self.transfers)):
            for i, rec in enumerate(recs):
                what = f"{kind}[{i}] ({getattr(rec, 'name', None) or rec.data!r})"
                _check_seconds(f"{what}.seconds", rec.seconds)
                for name in ("start_s", "end_s"):
                    if not math.isfinite(getattr(rec, name)):
                        raise ValueError(f"{what}.{name} is {getattr(rec, name)!r}; give a finite time "
                                         "(regenerate the file)")
        return self

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
        """The JSON document of ``placer run --json``.

        A run with streams also gives ``samples_per_s`` and ``batches`` at the top
        (the first stream's; every stream's are under ``streams``).
        """
        doc = self.model_dump(mode="json")
        for rec in doc["stages"]:
            if rec.get("workers") is None:  # a one-shot stage: no stream accounting
                for k in ("busy_s", "starved_s", "blocked_s", "workers", "worker_kind"):
                    rec.pop(k, None)
        if not self.streams:
            doc.pop("streams", None)
        else:
            doc["samples_per_s"] = self.streams[0].samples_per_s
            doc["batches"] = self.streams[0].batches
        return doc


def objective_rate(s: Any, objective: str) -> float:
    """The samples/s of a stream's run (its :class:`StreamStats`, or a report's stream facts) that a plan for
    ``objective`` is set against: for ``total_time`` the whole run's mean (samples over the stream's seconds:
    worker start-up and epoch ends included, as a script timing its own loop sees them), else the steady
    state."""
    if objective == "total_time" and s.seconds > 0 and s.samples > 0:
        return s.samples / s.seconds
    return s.samples_per_s
