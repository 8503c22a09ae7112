"""What planning a stream measures and decides: its profile and its plan.

May import: pydantic, placer.data.views (tables and the notebook view), placer.data.measures (counted work).

A :class:`StreamProfile` is what :mod:`placer.stream.profile` measured of one
stream at its real batch size: each stage's seconds per batch on each device
(wall time and the host CPU time it used), how each CPU stage scales with thread
workers (one :class:`ScalingRow` per worker count and kind: ``process`` rows are
added the same way once process workers run), the bytes of every per-batch value
and what copying it to or from each accelerator costs, and the step's rate on
already-prepared batches (the differential test: what the consumer could take).

A :class:`StreamPlan` is what :mod:`placer.stream.planner` chose from it: a device
per stage, the :class:`StreamSettings` (how the stream runs), the predicted samples
per second and the bottleneck, a reason per stage, baselines, a what-if table and,
when verified, the measured samples per second of the best few candidates.

Two models hold every setting of a stream, and nothing else repeats their fields:

- :class:`StreamSettings`: how a stream runs (workers per stage and their kind,
  prefetch, pinned copies, a cache point, torch's intra-op threads). The runner
  takes it (``placer.stream.StreamConfig`` is the same class), the planner's
  candidates carry it, a plan holds it (saved flat, beside the plan's other
  fields), and merging or overriding settings are its methods.
- :class:`LoaderSettings`: a torch ``DataLoader``'s worker settings in its own
  terms (what the drop-in tries and a profile records of a source's loader), with
  the one conversion to and from :class:`StreamSettings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from placer.data.measures import Work
from placer.data.views import Views

#: who runs a per-batch stage's workers: threads of this process, worker processes, or tasks on the
#: dask cluster in use (:mod:`placer.stream.dask_workers`)
WorkerKind = Literal["thread", "process", "dask"]


class StreamSettings(BaseModel):
    """How a stream runs: the settings a plan chooses and a person may write.

    Attributes
    ----------
    workers : int
        Parallel workers of every per-batch CPU stage (and of a Dataset source's
        DataLoader) unless ``stage_workers`` says otherwise. ``0`` runs the stream
        sequentially in the calling thread: every batch goes through every stage
        before the next is read (the reference run: same outputs, no overlap).
    stage_workers : dict
        Workers of one stage (overrides ``workers``).
    worker_kind : dict
        ``thread`` (the default: code that releases the GIL, numpy and torch),
        ``process``, or ``dask`` (tasks on the cluster in use, see
        :mod:`placer.stream.dask_workers`) per stage. A Dataset or DataLoader source's
        workers are DataLoader's worker processes unless ``thread`` is set for it: then a
        thread-pool loader's threads (:class:`~placer.executor.stream.threadloader.ThreadLoader`,
        :meth:`loader_threads`).
    prefetch : int
        Batches each queue between two stages holds: the bound on batches in flight
        (backpressure) and how far ahead the source reads.
    pin_memory : bool
        Copy batches to a GPU from pinned host memory (``non_blocking``).
    cache : str or None
        A deterministic stage (or the source) whose output is kept in memory after
        the first epoch; later epochs start after it.
    torch_threads : int or None
        torch's intra-op threads for the run (``torch.set_num_threads``, restored
        after it); None leaves torch's setting as it is. With CPU workers on the same
        cores, fewer threads for a step on the CPU can be faster.
    stage_group : dict
        Batches each cluster task carries, per stage with ``dask`` workers (default 1):
        ``g`` consecutive batches travel as one task and their outputs come back split,
        in order, so the cluster's per-task overhead is paid once per ``g`` batches.
        The stage's workers are then its tasks in flight.
    persistent_workers : bool
        Keep a Dataset or DataLoader source's worker processes between epochs (DataLoader's
        ``persistent_workers``, with the same random draws as without): they start once per
        run instead of once per epoch. Only while the source returns the same dataset,
        unchanged (a new DataLoader or sampler over it each epoch is fine); otherwise that
        epoch starts its own.
    cache_bytes : int
        The most bytes the cache may hold; beyond it caching stops, with a note.
    max_batches : int or None
        Stop after this many batches (for bounded measurement runs).

    ``cache_bytes`` and ``max_batches`` bound one run (:data:`RUN_LIMITS`); the
    others are the decisions a plan records (:meth:`decisions`).

    Examples
    --------
    >>> s = StreamSettings(workers=2, stage_workers={"decode": 4}, worker_kind={"decode": "process"})
    >>> s.workers_of("decode"), s.workers_of("augment"), s.kind_of("decode"), s.kind_of("augment")
    (4, 2, 'process', 'thread')
    >>> s.override(prefetch=4).prefetch, StreamSettings(workers=0).sequential
    (4, True)
    """

    workers: int = Field(1, ge=0)
    stage_workers: dict[str, int] = Field(default_factory=dict)
    worker_kind: dict[str, WorkerKind] = Field(default_factory=dict)
    prefetch: int = Field(2, ge=1)
    pin_memory: bool = True
    cache: str | None = None
    torch_threads: int | None = Field(None, ge=1)
    stage_group: dict[str, int] = Field(default_factory=dict)
    persistent_workers: bool = False
    cache_bytes: int = Field(2 << 30, ge=0)
    max_batches: int | None = Field(None, ge=1)

    #: fields that bound one run rather than say how the stream runs: a plan does not record them
    RUN_LIMITS: ClassVar[frozenset[str]] = frozenset({"cache_bytes", "max_batches"})

    @property
    def sequential(self) -> bool:
        """One batch at a time through every stage, in the calling thread (``workers == 0``)."""
        return self.workers == 0

    def workers_of(self, stage: str) -> int:
        return max(1, self.stage_workers.get(stage, self.workers))

    def loader_threads(self, source: str) -> bool:
        """Whether the Dataset or DataLoader source ``source`` is read by a thread-pool loader's threads
        (``worker_kind[source] == "thread"``, set explicitly, with workers) rather than by DataLoader's worker
        processes (the default for a source)."""
        return (not self.sequential and self.worker_kind.get(source) == "thread"
                and self.stage_workers.get(source, 0) > 0)

    def kind_of(self, stage: str) -> WorkerKind:
        return self.worker_kind.get(stage, "thread")

    def group_of(self, stage: str) -> int:
        """Batches per cluster task of ``stage`` (1 unless its workers are ``dask`` and a group is set)."""
        return max(1, self.stage_group.get(stage, 1)) if self.kind_of(stage) == "dask" else 1

    @classmethod
    def decision_fields(cls) -> list[str]:
        """The fields a plan records, in order (every field but :data:`RUN_LIMITS`)."""
        return [n for n in cls.model_fields if n not in cls.RUN_LIMITS]

    def decisions(self) -> dict[str, Any]:
        """The settings a plan records (every field but :data:`RUN_LIMITS`), as plain data."""
        return self.model_dump(exclude=set(self.RUN_LIMITS))

    def override(self, **changes: Any) -> StreamSettings:
        """These settings with ``changes`` (validated: a bad value names its field)."""
        if not changes:
            return self
        return type(self).model_validate({**self.model_dump(), **changes})

    @classmethod
    def merge(cls, many: Sequence[StreamSettings]) -> StreamSettings:
        """The settings of several streams of one pipeline, run together.

        Stage workers and worker kinds are united (each stage belongs to one stream);
        the deepest prefetch, pinned copies only where every stream pins, the first
        cache point and the first torch thread count set; a source's workers kept
        between epochs where its stream keeps them; one batch at a time only when
        every stream runs so.
        """
        return cls(
            workers=0 if all(s.sequential for s in many) else 1,
            stage_workers={m: w for s in many for m, w in s.stage_workers.items()},
            worker_kind={m: k for s in many for m, k in s.worker_kind.items()},
            prefetch=max([2, *(s.prefetch for s in many)]),
            pin_memory=all(s.pin_memory for s in many),
            cache=next((s.cache for s in many if s.cache), None),
            torch_threads=next((s.torch_threads for s in many if s.torch_threads), None),
            stage_group={m: g for s in many for m, g in s.stage_group.items()},
            persistent_workers=any(s.persistent_workers for s in many))

    def key(self) -> tuple:
        """A hashable value equal for equal settings (mappings compared whatever their order)."""
        return tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in self.__dict__.values())


class ScalingRow(BaseModel):
    """One measurement of a stage run by ``workers`` parallel workers of one kind."""

    kind: WorkerKind = "thread"
    workers: int = Field(ge=1)
    batches_per_s: float = Field(ge=0)
    #: ``batches_per_s`` over the one-worker rate of the same kind
    speedup: float = Field(ge=0)


class StreamStageProfile(BaseModel):
    """One member of a stream as measured.

    Attributes
    ----------
    seconds : dict
        Device → wall seconds per batch (a lower quartile over the measured
        batches after the first, which pays for warm-up).
    cpu_seconds : dict
        Device → host CPU seconds per batch (all threads of the process): what the
        stage takes from the cores. Near zero for a stage that sleeps or waits.
    in_turn_seconds : dict
        Device → wall seconds per batch as the profile's sweep ran it, one batch at a time
        through every member (the mean over the batches after the first, and after the leading
        ones that still warm up: :func:`placer.stream.sweep.in_turn_mean`): what it costs in
        turn with the others, its slow batches included. A step whose intra-op threads meet
        the threads a loader left spinning on the cores can run several times slower in turn
        than alone, in some batches and not others, which a lower quartile leaves out (an audio
        script's train step on 2 cores: 19 ms lower quartile, 63 ms mean, 10 ms alone).
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
        counts measured besides torch's default (which ``seconds`` holds): ``seconds``
        times the ratio measured alone, or the seconds measured alone where fewer.
    torch_cpu_seconds : dict
        The same counts → host CPU seconds per batch.
    busy_seconds : dict
        The step on the CPU: intra-op thread count (torch's default included) → wall
        seconds per batch while another thread keeps one core busy, as the stream's
        workers do. Parallel regions wait for their slowest thread, so a step on every
        core can run slower beside one busy core than on one thread.
    beside_busy_s : float or None
        A source read in this process that runs threads of its own (its CPU seconds a batch
        over :data:`~placer.stream.profile.OWN_THREADS` times its wall: a BLAS or FFT
        decode): wall seconds per batch read while another thread keeps one core busy, as the
        step does beside it. A 42 ms decode on 2 cores took 80 ms so. None when not measured.
    own_threads : float or None
        The same reads alone: CPU seconds over wall seconds (the sweep's CPU seconds for the
        source can hold the step's OpenMP threads spinning after it; these do not). What a
        worker process reading the source spends in CPU per wall second. None when not measured.
    cacheable : bool
        Its output, and everything before it, is the same in every epoch.
    cached_read_s : float or None
        A source that reshuffles (takes ``batch_info``) and returns a Dataset or DataLoader
        whose items read the same twice: seconds to read one batch's samples back from a
        cache kept by sample (:class:`~placer.executor.stream.store.SampleStore`) and collate
        them, which each later epoch pays with a cache at the source (``cache=<source>``);
        None where its samples cannot be kept by index.
    work : Work or None
        The work of one batch of its torch GPU implementation (or of the step), counted on
        the CPU (:func:`placer.costmodel.counts.count_work`): what a described GPU's
        roofline prices when the stream is planned for a target; None when not counted.
    worker_seconds : float or None
        A Dataset or DataLoader source: wall seconds per batch read through one DataLoader worker
        process, the consumer idle (the worker's pace: its items, collating into shared memory and
        sending included), the median after the first batches. Not the seconds read in this
        process: a tokenizer's batch took 4.6 ms here and 7 ms through a worker. What the stream
        model prices a batch from worker processes at (their CPU too). None when not measured.
    worker_start_s : float or None
        The same source: seconds from starting an iterator with one worker process to its first
        batch, beyond a batch's own (forking the worker and starting it), which every epoch pays
        (the stream makes a loader per epoch): 28 ms against a 0.3 s run of 64 batches.
    worker_end_s : float or None
        Seconds to stop that worker at the epoch's end.
    remote_ratio : dict
        A CPU batch stage's per-batch seconds on a dask cluster's worker over its seconds here
        (the same batches, each timed inside the task, median), per scheduler address: measured
        when the stream is profiled with a cluster (:func:`placer.stream.profile.profile_stream`'s
        ``cluster``), and what the stream model prices its batches there at.
    """

    name: str
    role: Literal["source", "batch", "step"]
    kind: str = "other"
    devices: list[str] = Field(default_factory=list)
    seconds: dict[str, float] = Field(default_factory=dict)
    cpu_seconds: dict[str, float] = Field(default_factory=dict)
    in_turn_seconds: dict[str, float] = Field(default_factory=dict)
    reads: list[str] = Field(default_factory=list)
    out_bytes: dict[str, int] = Field(default_factory=dict)
    scaling: list[ScalingRow] = Field(default_factory=list)
    gil_bound: bool | None = None
    gil: float | None = Field(None, ge=0, le=1)
    torch_seconds: dict[int, float] = Field(default_factory=dict)
    torch_cpu_seconds: dict[int, float] = Field(default_factory=dict)
    busy_seconds: dict[int, float] = Field(default_factory=dict)
    beside_busy_s: float | None = Field(None, ge=0)
    own_threads: float | None = Field(None, ge=0)
    cacheable: bool = False
    cached_read_s: float | None = Field(None, ge=0)
    pin: str | None = None
    work: Work | None = None
    remote_ratio: dict[str, float] = Field(default_factory=dict)
    worker_seconds: float | None = Field(None, ge=0)
    worker_start_s: float | None = Field(None, ge=0)
    worker_end_s: float | None = Field(None, ge=0)

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
    """A torch ``DataLoader``'s worker settings in its own terms, and torch's intra-op threads.

    What the drop-in (:mod:`placer.stream.dropin`) tries, and what a stream profile
    records of the DataLoader a source returned (the user's own baseline). In a stream
    a DataLoader source is one stage: :meth:`to_stream` and :meth:`from_stream` are the
    one conversion between these terms and :class:`StreamSettings`.

    Examples
    --------
    >>> lo = LoaderSettings(num_workers=4, prefetch_factor=3, torch_threads=2)
    >>> s = lo.to_stream("images")
    >>> s.stage_workers, s.prefetch, s.torch_threads
    ({'images': 4}, 3, 2)
    >>> LoaderSettings.from_stream(s, "images") == lo
    True
    >>> t = LoaderSettings(num_workers=2, prefetch_factor=2, worker_threads=True).to_stream("images")
    >>> t.worker_kind, t.loader_threads("images"), LoaderSettings.from_stream(t, "images").worker_kind
    ({'images': 'thread'}, True, 'threads')
    """

    model_config = ConfigDict(frozen=True)

    num_workers: int = Field(0, ge=0)
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    #: torch's intra-op threads beside the loader (None: as they are)
    torch_threads: int | None = None
    #: the loader's own batch size, where recorded (the drop-in keeps the user's)
    batch_size: int | None = None
    #: the workers are threads of the main process (:class:`placer.executor.stream.threadloader.ThreadLoader`)
    worker_threads: bool = False
    #: batches are handed over in the order they were asked for (DataLoader's ``in_order``); False: as
    #: worker processes finish them, so a slow batch does not hold the ones behind it back. True keeps
    #: what the loader was built with (a loader rebuilt keeps its ``in_order``: ``kwargs`` names only False)
    in_order: bool = True
    #: intra-op threads each worker process runs torch and BLAS work with, set by a ``worker_init_fn``
    #: composed with the user's own (:class:`placer.executor.stream.worker_init.WorkerThreads`); None: as
    #: the worker starts with them
    threads_per_worker: int | None = Field(None, ge=1)

    @classmethod
    def of(cls, loader: Any) -> LoaderSettings:
        """The worker settings a DataLoader was built with."""
        w = int(loader.num_workers)
        return cls(num_workers=w, prefetch_factor=(loader.prefetch_factor or 2) if w else None,
                   pin_memory=bool(loader.pin_memory), persistent_workers=bool(w and loader.persistent_workers),
                   worker_threads=bool(w and getattr(loader, "worker_threads", False)))

    @property
    def worker_kind(self) -> str:
        """``processes`` (DataLoader's workers), ``threads`` (a thread-pool loader's) or ``main process``.

        DataLoader's words, for the edge where a user reads them (the drop-in's advice, its JSON): inside
        placer a stage's workers are ``thread``, ``process`` or ``dask`` (:attr:`StreamSettings.worker_kind`)
        and a loader's are ``worker_threads`` or not."""
        if not self.num_workers:
            return "main process"
        return "threads" if self.worker_threads else "processes"

    def as_dict(self) -> dict[str, Any]:
        """The settings as the drop-in's advice shows them: fields and ``worker_kind``, without the batch size;
        ``in_order`` and ``threads_per_worker`` only where they change what DataLoader does by default."""
        out = self.model_dump(exclude={"batch_size", "in_order", "threads_per_worker"})
        if not self.in_order:
            out["in_order"] = False
        if self.threads_per_worker is not None:
            out["threads_per_worker"] = self.threads_per_worker
        return {**out, "worker_kind": self.worker_kind}

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``DataLoader`` these settings are."""
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            kw["prefetch_factor"] = self.prefetch_factor
            if not self.worker_threads:  # a thread pool has no worker processes to keep
                kw["persistent_workers"] = self.persistent_workers
            if not self.in_order and not self.worker_threads:  # (a torch without it has no such setting to try)
                kw["in_order"] = False
        return kw

    def to_stream(self, source: str) -> StreamSettings:
        """The stream settings of a stream whose source ``source`` is this DataLoader: its workers the
        source's, ``prefetch_factor`` the queue depth, the same pinning and torch threads."""
        threads = bool(self.num_workers and self.worker_threads)
        return StreamSettings(stage_workers={source: self.num_workers}, prefetch=self.prefetch_factor or 2,
                              worker_kind={source: "thread"} if threads else {},
                              pin_memory=self.pin_memory, torch_threads=self.torch_threads,
                              persistent_workers=bool(self.num_workers and self.persistent_workers and not threads))

    @classmethod
    def from_stream(cls, settings: StreamSettings, source: str) -> LoaderSettings:
        """The DataLoader settings the source ``source`` runs with under ``settings``: its stage
        workers as worker processes, or as a thread-pool loader's threads where its kind is ``thread``
        (:meth:`StreamSettings.loader_threads`; none one batch at a time), the queue depth as
        ``prefetch_factor``, worker processes kept between epochs where ``persistent_workers`` says so."""
        w = 0 if settings.sequential else settings.stage_workers.get(source, 0)
        threads = settings.loader_threads(source)
        return cls(num_workers=w, prefetch_factor=settings.prefetch if w else None, pin_memory=settings.pin_memory,
                   torch_threads=settings.torch_threads, worker_threads=threads,
                   persistent_workers=bool(w and settings.persistent_workers and not threads))


class ClusterLink(BaseModel):
    """What running a stage's batches as tasks on a dask cluster costs: measured once per cluster
    (:func:`placer.stream.offload.probe_cluster`) or taken from a description of one that is not running.

    Attributes
    ----------
    name : str
        The scheduler's address, or the description's name.
    source : {"measured", "described"}
    workers : int
        Worker processes (nodes, for a description).
    threads_per_worker : int
        Threads of each worker (cores per node).
    task_s : float
        Seconds one empty task takes from submit to its result, seen by one client thread:
        the per-task overhead (scheduler, network latency, both ends' event loops).
    bandwidth_bytes_per_s : float
        Bytes per second a batch travels at, to a worker and back (pickling included).
    client_cpu_task_s, client_cpu_per_byte_s : float
        This process's CPU seconds per task and per byte moved (the client's work, holding the GIL).
    remote_cpu_task_s : float
        CPU seconds per task of the scheduler and the worker (charged to this machine's cores when
        the cluster runs on it).
    cpu_scale : float
        A batch's seconds on a worker's core over its seconds on one core here (1: the same CPU),
        for a stage without a ratio of its own.
    stage_ratio : dict
        Per stage, a batch's seconds on a worker over here, given (a description's
        ``stage_ratio``) and taken as given. Otherwise a running cluster's stages are priced at
        their own measured ratio (``StreamStageProfile.remote_ratio`` for this address, measured when
        the stream is profiled with the cluster), and a stage without one at ``cpu_scale``.
    array_ratio : float or None
        A diagnostic: a synthetic numpy workload with batch-sized temporaries on a worker over here
        (on a 127.0.0.1 cluster of the same CPU it measured 6-19x: dask's nanny starts workers with
        ``MALLOC_TRIM_THRESHOLD_=65536``, which turns off glibc's dynamic mmap threshold). The
        model prices each stage at its own measured ratio instead.
    shares_host : bool
        The workers run on this machine: their work takes its cores.
    """

    name: str = "cluster"
    source: Literal["measured", "described"] = "measured"
    workers: int = Field(1, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    task_s: float = Field(0.002, ge=0)
    bandwidth_bytes_per_s: float = Field(1e9, gt=0)
    client_cpu_task_s: float = Field(0.0, ge=0)
    client_cpu_per_byte_s: float = Field(0.0, ge=0)
    remote_cpu_task_s: float = Field(0.0, ge=0)
    cpu_scale: float = Field(1.0, gt=0)
    stage_ratio: dict[str, float] = Field(default_factory=dict)
    array_ratio: float | None = None
    shares_host: bool = False
    notes: list[str] = Field(default_factory=list)

    @property
    def threads(self) -> int:
        """Every worker thread of the cluster."""
        return self.workers * self.threads_per_worker


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
    #: the source's objects for two epochs can be served by the same worker processes (the same dataset,
    #: unchanged: :func:`placer.executor.stream.source.workers_key`): its loader's workers can be kept
    #: between epochs (``StreamSettings.persistent_workers``)
    same_source: bool = False
    cores: int = 1
    devices: list[str] = Field(default_factory=lambda: ["cpu"])
    device_titles: dict[str, str] = Field(default_factory=dict)
    simulated: list[str] = Field(default_factory=list)
    real_gpus: list[str] = Field(default_factory=list)
    stages: list[StreamStageProfile] = Field(default_factory=list)
    copies: list[CopyProfile] = Field(default_factory=list)
    consumer_samples_per_s: dict[str, float] = Field(default_factory=dict)
    measured_batches: dict[str, int] = Field(default_factory=dict)
    budget_s: float | None = None
    seconds: float = 0.0
    #: torch's intra-op threads while the profile ran (None: torch was not loaded)
    torch_threads: int | None = None
    notes: list[str] = Field(default_factory=list)
    #: the described machine these numbers are predicted for (None: measured on this machine)
    target: str | None = None
    #: the dask cluster whose workers the stream's CPU stages may run on (None: this machine's only)
    cluster: ClusterLink | None = None

    def stage(self, name: str) -> StreamStageProfile:
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


class OffloadStage(BaseModel):
    """One CPU stage's batches as tasks on a cluster: its tasks in flight, batches per task, what it moves."""

    name: str
    remote_workers: int
    group: int = 1
    bytes_per_batch: int = 0
    predicted_batches_per_s: float = 0.0
    #: what bounds the stage on the cluster: ``per-task overhead``, ``compute``, ``network``
    bound: str = ""


class Offload(BaseModel):
    """The cluster option of a stream: remote workers per stage, tasks grouping, predicted and measured
    rates, the network load."""

    cluster: str
    source: Literal["measured", "described"] = "measured"
    threads: int = 1
    stages: list[OffloadStage] = Field(default_factory=list)
    predicted_samples_per_s: float = 0.0
    measured_samples_per_s: float | None = None
    #: the plan with this machine's workers only, for comparison
    local_predicted_samples_per_s: float = 0.0
    local_measured_samples_per_s: float | None = None
    network_bytes_per_s: float = 0.0
    #: ``network_bytes_per_s`` over the link's bandwidth
    network_share: float = 0.0
    bandwidth_bytes_per_s: float = 0.0
    chosen: bool = False
    reason: str = ""


class StreamPlan(Views, BaseModel):
    """How one stream should run, and why.

    ``settings`` is the :class:`StreamSettings` the plan chose (the runner takes it as
    it is, :func:`placer.stream.planner.stream_config` merges several plans'); the rest
    is the plan's prediction, reasons, baselines and what-ifs. Saved, the settings'
    decisions sit flat beside those (``workers``, ``stage_workers``, ``worker_kind``,
    ``prefetch``, ``pin_memory``, ``cache``, ``torch_threads``: the schema
    ``stream-plan``), and flat data reads back the same way. ``objective`` is
    ``throughput`` (steady-state samples per second) or ``total_time`` (seconds over
    ``epochs`` epochs, where a cache point pays off).
    """

    pipeline: str
    source: str
    step: str
    objective: Literal["throughput", "total_time"] = "throughput"
    epochs: int = 1
    placement: dict[str, str] = Field(default_factory=dict)
    settings: StreamSettings = Field(default_factory=StreamSettings)
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
    #: the described machine the plan is for (None: this machine); every number is then a prediction for it
    target: str | None = None
    #: for a target: what it would be bound by, in one sentence (the step's rate, the stage that binds, the wait)
    target_sentence: str | None = None
    #: for a target: ``1 - the stream's rate / the step's own rate``: the share of the step's time lost
    #: waiting for data (or, with other stages on its GPU, to them)
    predicted_wait_fraction: float | None = None
    #: the cluster option (remote workers per stage, grouping, predicted and measured, network), when
    #: planned for a cluster
    offload: Offload | None = None

    #: the step's lower precision, when one is planned (step → ``tf32``, ``bf16``, ``fp16``; absent: fp32)
    precision: dict[str, str] = Field(default_factory=dict)
    #: device → precision → the step's predicted seconds per batch (when the step allows a lower precision)
    precision_s: dict[str, dict[str, float]] = Field(default_factory=dict)
    #: the step's accuracy checks (:class:`~placer.data.measures.PrecisionCheck` as dicts)
    precision_checks: list[dict] = Field(default_factory=list)

    #: fields only a plan for a described machine (or a cluster) has (left out of the saved form when unset)
    TARGET_FIELDS: ClassVar[tuple[str, ...]] = ("target", "target_sentence", "predicted_wait_fraction", "offload")
    #: fields only a plan whose step allows a lower precision has (left out of the saved form when empty)
    PRECISION_FIELDS: ClassVar[tuple[str, ...]] = ("precision", "precision_s", "precision_checks")

    @model_validator(mode="before")
    @classmethod
    def _nest_settings(cls, data: Any) -> Any:
        """Flat settings (as saved) go into ``settings``."""
        if not isinstance(data, dict) or "settings" in data:
            return data
        names = set(StreamSettings.decision_fields())
        return {**{k: v for k, v in data.items() if k not in names},
                "settings": {k: v for k, v in data.items() if k in names}}

    @model_serializer(mode="wrap")
    def _flat_settings(self, handler: Any) -> dict[str, Any]:
        """Saved with the settings' decisions flat, where ``settings`` stands."""
        out: dict[str, Any] = {}
        for k, v in handler(self).items():
            if (k in self.TARGET_FIELDS and v is None) or (k in self.PRECISION_FIELDS and not v):
                continue  # a plan for this machine (in fp32) is saved as it always was
            if k == "settings":  # batches per task only where a stage runs on a cluster, kept workers only
                # where kept: other plans as before
                out |= {n: x for n, x in v.items() if n not in StreamSettings.RUN_LIMITS
                        and not (n in ("stage_group", "persistent_workers") and not x)}
            else:
                out[k] = v
        return out

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """The schema of the saved (flat) form: the settings' decisions in place of ``settings``."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        flat = StreamSettings.model_json_schema()["properties"]
        props: dict[str, Any] = {}
        for k, v in target["properties"].items():
            if k == "settings":
                props |= {n: flat[n] for n in StreamSettings.decision_fields()}
            else:
                props[k] = v
        target["properties"] = props
        return schema

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)
