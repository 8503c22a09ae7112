"""Predicting a stream's throughput from its profile: operational analysis, as in Plumber.

May import: placer.data.stream, placer.devices (the host location's name), placer.stream.remote. Pure arithmetic on a
:class:`~placer.data.stream.StreamProfile`: no device, no measuring.

A stream runs as a chain of nodes (source, copies where data changes location,
per-batch stages, step), every node working on a different batch at once. In steady
state each batch needs some seconds of each *resource*, and the stream goes no faster
than its busiest resource allows:

- **a CPU stage** with ``w`` thread workers: ``speedup(w) / t`` batches per second,
  ``t`` its seconds per batch on one worker and ``speedup`` its measured scaling
  (interpolated between measured worker counts, held at the last one beyond them);
  the source and a step on the CPU run in one thread: ``1 / t``; a DataLoader
  source with ``w`` worker processes: ``s(w) / t``, ``s`` their speed-up measured by
  reading the source through the cores' count of workers at once (interpolated from one,
  held beyond), else ``min(w, cores)``; each batch's CPU then ``t * min(w, cores) / s``;
- **an accelerator**: the stages on it share its time: ``1 / sum(t)`` over them;
- **a link**: the copies into and out of one accelerator share it: ``1 / sum(copy s)``
  (both directions on one link: a simple, cautious model);
- **the cores**: every node that runs on the host (CPU stages, the source, copies into
  a simulated device and stages on it, which run on the host too) uses the host CPU
  seconds it was measured to use per batch; the cores supply ``os.cpu_count()``
  seconds per second: ``cores / sum(cpu s)``. The threads that wait (the main thread,
  a step driving a real GPU) are not charged;
- **the GIL**: every thread of the process holds it for a share ``g`` of its time: a
  batch stage's share is estimated from two thread workers' speed-up ``s2`` by Amdahl's
  law (``g = 2 / s2 - 1``); the step's and the source's were measured with a probe
  thread (an iterable source not measured counts as holding it throughout: it is
  Python code; a DataLoader source with worker processes does not hold it); process
  workers hold it in this process only to move batches (their one-process round trip
  beyond the stage's in-process seconds). All of them share one GIL:
  ``1 / sum(g * t)``;
- **remote workers** (``worker_kind="dask"``, with the profile's ``cluster``): the
  stage's rate as tasks on the cluster (:mod:`placer.stream.remote`: tasks in flight,
  the cluster's cores, the network); here it takes the client's CPU per batch (and
  holds the GIL for it), and on a cluster that runs on this machine the workers'
  compute joins the cores;
- **torch intra-op threads**: with ``StreamSettings.torch_threads`` set, a step on the
  CPU takes the seconds measured at that count (where measured);
- **the cores the step shares**: a step on the CPU was also timed beside a thread
  keeping one core busy (``busy_seconds``; a parallel region waits for its slowest
  thread, so on every core it can slow by 2× where one thread slows by 10 %). While
  the other host nodes keep ``u`` cores busy (their CPU seconds per batch times the
  rate; at most 1), the step takes ``alone + u · (beside − alone)``; the rate and
  ``u`` are solved together (a damped fixed point);
- **the cores beside the step's threads**: a step on the CPU at ``n > 1`` intra-op threads
  keeps ``n - 1`` cores busy between its batches too (torch's OpenMP threads spin-wait after
  each parallel region, for milliseconds), so the nodes beside it (in worker processes, or in
  threads of their own; not one batch at a time) share what is left:
  ``max(1, cores - (n - 1)) / sum(their cpu s)``. Measured in a plain script on 2 cores: a
  tokenizer on 2 DataLoader worker processes fed a step at 2 torch threads at 5,400-7,800
  samples/s, the rate of 1 worker (6,200), and at 1 torch thread 9,400-11,600; one loader thread
  (audio, its decode cached) at 657 against 1,374.

Throughput is the smallest rate; the resource that sets it is the bottleneck. With
``workers=0`` nothing overlaps: one batch takes the sum of every node's seconds, each as
the profile's sweep (which ran one batch at a time) measured it in turn, slow batches
included (``StreamStageProfile.in_turn_seconds``), where the chain is the sweep's: every member
on one device, the step at the threads it was swept at, no cache.
A Dataset or DataLoader source read by worker processes costs, per batch, what it took
through one worker process as the profile measured it (``StreamStageProfile.worker_seconds``:
collating into shared memory and sending the batch included; a tokenizer took 4.6 ms a
batch in the main process and 7 ms through a worker), wall and CPU.
A stream with queues is never predicted slower than its members taking turns
(:func:`alternating`): where overlapping them costs more than it saves, one waits while
the other runs alone.
A cache point after a deterministic stage removes it and every node before it from
epochs after the first: the total over ``E`` epochs of ``B`` batches is
``B / r_first + (E - 1) * B / r_later``, plus, for each epoch that starts the loader's
worker processes (every one, unless a later epoch replays a cache or the workers are kept
between epochs: :func:`kept_workers`), their start-up and their stop at its end
(:func:`worker_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placer.data.stream import StreamProfile, StreamSettings
from placer.devices import HOST
from placer.stream import remote



@dataclass
class ChainNode:
    """A node of the modelled chain: a member of the stream, or a copy before one."""

    name: str
    kind: str
    device: str
    location: str
    reads: list[str] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)
    #: copies: where the moved values come from (their producers' location)
    src: str = HOST

    @property
    def link(self) -> str:
        """A copy's accelerator end (the link it loads)."""
        return self.device if self.location != HOST else self.src


@dataclass
class Rate:
    """One resource's limit: batches per second, and the seconds per batch it needs."""

    name: str
    kind: str
    batches_per_s: float
    seconds_per_batch: float
    members: list[str] = field(default_factory=list)


@dataclass
class StreamPrediction:
    """A stream's predicted throughput under one placement and configuration.

    ``rates`` are the resources of the first epoch, slowest first; ``later_rates``
    those of epochs after the first when a cache point removes nodes (else equal).
    """

    samples_per_s: float
    batches_per_s: float
    bottleneck: str
    rates: list[Rate]
    later_batches_per_s: float
    later_bottleneck: str
    total_s: float | None = None
    epochs: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def mean_samples_per_s(self) -> float:
        """Samples per second over all epochs (the steady rate without epochs or batch counts)."""
        return self.samples_per_s if self.total_s is None else self._samples / self.total_s

    _samples: float = 0.0

    def rate_of(self, member: str) -> Rate | None:
        """The resource a member belongs to (its stage rate, or its accelerator)."""
        return next((r for r in self.rates if member in r.members and r.kind in ("stage", "device")), None)


def location(profile: StreamProfile, device: str) -> str:
    """Where a device's data lives: the host for the CPU, else the device itself."""
    return HOST if device == "cpu" else device


def chain(profile: StreamProfile, placement: dict[str, str]) -> list[ChainNode]:
    """The nodes of the stream under ``placement``, with copy nodes as the runner lays them out."""
    src = profile.members[0]
    nodes = [ChainNode(src, "source", "cpu", HOST)]
    avail: dict[str, set[str]] = {src: {HOST}}
    made: dict[str, str] = {src: HOST}
    for m in profile.members[1:]:
        st = profile.stage(m)
        dev = placement.get(m, "cpu")
        loc = location(profile, dev)
        need = sorted({s for s in st.reads if loc not in avail[s]})
        if need:
            nodes.append(ChainNode(f"{m}:copy", "copy", dev, loc, moves=need, src=made[need[0]]))
            for s in need:
                avail[s].add(loc)
        nodes.append(ChainNode(m, "step" if st.role == "step" else "batch", dev, loc, reads=list(st.reads)))
        avail[m] = {loc}
        made[m] = loc
    return nodes


def _copy_seconds(profile: StreamProfile, node: ChainNode, made: dict[str, str], pin_memory: bool,
                  notes: list[str]) -> tuple[float, float]:
    """Wall and host CPU seconds of a copy node per batch."""
    wall = cpu = 0.0
    for v in node.moves:
        c = profile.copy_of(v, made[v], node.location)
        if c is None:
            notes.append(f"copy of {v!r} from {made[v]} to {node.location} was not measured; counted as free")
            continue
        mode = "pinned" if pin_memory else "pageable"
        wall += c.seconds.get(mode, c.seconds.get("executor", 0.0))
        cpu += c.cpu_seconds
    return wall, cpu


def node_costs(profile: StreamProfile, nodes: list[ChainNode], pin_memory: bool,
               notes: list[str] | None = None, threads: int | None = None) -> list[tuple[float, float]]:
    """``(wall s, host CPU s)`` per batch of every node (``threads``: torch's intra-op threads)."""
    notes = [] if notes is None else notes
    where: dict[str, str] = {}
    out = []
    for n in nodes:
        if n.kind == "copy":
            out.append(_copy_seconds(profile, n, where, pin_memory, notes))
            continue
        st = profile.stage(n.name)
        wall = st.seconds.get(n.device)
        if wall is None:
            raise KeyError(f"stage {n.name!r} was not measured on {n.device}")
        cpu = st.cpu_seconds.get(n.device, wall)
        if threads is not None and n.device == "cpu" and threads in st.torch_seconds:
            wall, cpu = st.torch_seconds[threads], st.torch_cpu_seconds.get(threads, st.torch_seconds[threads])
        out.append((wall, cpu))
        where[n.name] = n.location
    return out


def in_turn(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
            config: StreamSettings) -> list[tuple[float, float]]:
    """The costs of one batch at a time: each member at least as slow as the sweep measured it in turn.

    Only where the chain is the one the sweep ran: every member on one device and the step at
    the intra-op threads it was swept at (other counts and copies keep their costs).
    """
    devices = {n.device for n in nodes if n.kind != "copy"}
    if len(devices) != 1 or config.torch_threads not in (None, profile.torch_threads):
        return costs
    out = []
    for n, (wall, cpu) in zip(nodes, costs):
        turn = profile.stage(n.name).in_turn_seconds.get(n.device) if n.kind != "copy" else None
        out.append((max(wall, turn), cpu) if turn is not None else (wall, cpu))
    return out


def alternating(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
                config: StreamSettings) -> float:
    """Batches per second of the chain's members taking turns, each at its cost one batch at a time
    (:func:`in_turn`): the least a stream with queues runs at. Where running its members side by side
    costs more than it saves (a step whose intra-op threads slow down beside a busy core), the queues
    fill and the members alternate, one waiting while the other runs alone. On 2 cores, a script's
    source read in a thread beside its step at 2 intra-op threads was predicted at 650 samples/s from
    the step's seconds beside a busy core (85 ms a batch against 9 alone), where it ran at 1,420, and
    one batch at a time at 1,160."""
    total = sum(w for w, _ in in_turn(profile, nodes, costs, config))
    return 1.0 / total if total > 0 else 0.0


def _source_in_workers(profile: StreamProfile, nodes: list[ChainNode], config: StreamSettings):
    """The source's profile where it is a Dataset or DataLoader read by worker processes, else None."""
    if not nodes or nodes[0].kind != "source" or not _in_processes(profile, nodes[0], config):
        return None
    return profile.stage(nodes[0].name)


def in_workers(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
               config: StreamSettings) -> list[tuple[float, float]]:
    """A Dataset or DataLoader source read by worker processes: a batch costs what it took through one
    worker (``StreamStageProfile.worker_seconds``), wall and CPU (a worker runs one thread), where measured; its
    CPU with ``n`` workers busy at once is ``n`` over their measured speed-up times that
    (:func:`loader_speedup`): workers that slow each other down spend more CPU on each batch."""
    st = _source_in_workers(profile, nodes, config)
    if st is None or st.worker_seconds is None:
        return costs
    n = max(1, min(_loader_workers(profile, config), profile.cores))
    more = n / max(loader_speedup(profile, st, n), 1e-9)
    return [(st.worker_seconds, st.worker_seconds * own_threads(st) * max(1.0, more)), *costs[1:]]


def loader_speedup(profile: StreamProfile, st, workers: int) -> float:
    """A DataLoader's ``workers`` worker processes over one: as measured (the source read through the
    cores' count at once, ``ScalingRow(kind="process")``; interpolated, held beyond), else linear up to
    the cores."""
    n = max(1, min(workers, profile.cores))
    return st.speedup(n, "process") if any(r.kind == "process" for r in st.scaling) else float(n)


def own_threads(st) -> float:
    """CPU seconds over wall seconds of a source read alone (``StreamStageProfile.own_threads``; 1 where not
    measured): the threads of its own (BLAS, FFT) that run it in a worker process too."""
    return max(1.0, st.own_threads or 1.0)


def kept_workers(profile: StreamProfile, config: StreamSettings) -> bool:
    """Whether the source's loader keeps its worker processes between epochs under ``config``: asked for
    (``persistent_workers``) and possible (the source returns the same object each epoch)."""
    return bool(config.persistent_workers and profile.same_source and _loader_workers(profile, config) > 0)


def worker_bounds(profile: StreamProfile, nodes: list[ChainNode], config: StreamSettings) -> float:
    """Seconds an epoch adds for starting a loader's worker processes and stopping them at its end:
    one worker's, as measured, times the workers per core where there are more workers than cores
    (the loader starts them one after the other; measured for a tokenizer on 2 cores, to the first
    batch: 33-40 ms with 1 or 2 workers, 38-55 with 3, 55-63 with 4)."""
    st = _source_in_workers(profile, nodes, config)
    if st is None or st.worker_start_s is None:
        return 0.0
    w = _loader_workers(profile, config)
    return (st.worker_start_s + (st.worker_end_s or 0.0)) * max(1.0, w / max(1, profile.cores))


def gil_share(profile: StreamProfile, member: str) -> float:
    """The share of its time a stage holds the GIL: from its two-worker speed-up (Amdahl), else as
    measured by the probe, else 0 (not known)."""
    st = profile.stage(member)
    if not any(r.kind == "thread" and r.workers >= 2 for r in st.scaling):
        return st.gil or 0.0
    s2 = max(st.speedup(2), 1e-9)
    return min(1.0, max(0.0, 2.0 / s2 - 1.0))


def _moving_share(st) -> float:
    """Process workers: the share of the stage's own seconds this process spends moving each batch to
    a child and back (pickling holds the GIL): the one-process round trip beyond the in-process time."""
    one = next((r.batches_per_s for r in st.scaling if r.kind == "process" and r.workers == 1), None)
    t = st.seconds.get("cpu", 0.0)
    if not one or t <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 / one - t) / t)


def _node_gil(profile: StreamProfile, n: ChainNode, config: StreamSettings) -> float:
    """The share of its time node ``n``'s thread(s) hold this process's GIL."""
    st = profile.stage(n.name)
    if n.kind == "batch" and _remote(profile, n, config):
        t = remote.terms(profile, n.name, profile.cluster, remote.group_of(profile, n.name, config))
        return min(1.0, t.client_cpu_s / t.seconds_per_batch) if t.seconds_per_batch > 0 else 0.0
    if n.kind == "batch":
        return _moving_share(st) if config.kind_of(n.name) == "process" else gil_share(profile, n.name)
    if n.kind == "source":
        if profile.source_kind != "iterable" and _loader_workers(profile, config) > 0:
            return 0.0
        if profile.source_kind != "iterable" and _loader_threads(profile, config) > 0 and any(
                r.kind == "thread" and r.workers >= 2 for r in st.scaling):
            return gil_share(profile, n.name)  # a loader's threads: as their measured speed-up says
        return 1.0 if st.gil is None else st.gil
    return st.gil or 0.0


def rates(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
          config: StreamSettings) -> list[Rate]:
    """Every resource's rate for the nodes of one steady state, slowest first."""
    out: list[Rate] = []
    pooled: dict[tuple[str, str], list] = {}
    host_cpu = gil = 0.0
    host_members: list[str] = []
    gil_members: list[str] = []
    for n, (wall, cpu) in zip(nodes, costs):
        sim = n.device in profile.simulated or (n.kind == "copy" and n.src in profile.simulated)
        on_host = n.device == "cpu" or sim
        if on_host:
            host_cpu += cpu
            host_members.append(n.name)
        if n.kind == "copy":
            pooled.setdefault(("link", n.link), [0.0, []])
            pooled[("link", n.link)][0] += wall
            pooled[("link", n.link)][1].append(n.name)
        elif n.device != "cpu":
            pooled.setdefault(("device", n.device), [0.0, []])
            pooled[("device", n.device)][0] += wall
            pooled[("device", n.device)][1].append(n.name)
        else:
            out.append(_cpu_rate(profile, n, wall, config))
        if n.kind != "copy" and (n.device == "cpu" or n.kind == "step"):
            g = _node_gil(profile, n, config)
            if g > 0:  # the step's share is of its seconds at torch's default threads
                gil += g * (profile.stage(n.name).seconds.get(n.device, wall) if n.kind == "step" else wall)
                gil_members.append(n.name)
    for (kind, dev), (secs, members) in pooled.items():
        name = dev if kind == "device" else f"link {dev}"
        out.append(Rate(name, kind, _inv(secs), secs, members))
    if host_cpu > 0:
        cores = max(1, profile.cores)
        out.append(Rate("cores", "cores", cores / host_cpu, host_cpu / cores, host_members))
        spin = _spinning(profile, nodes, costs, config)
        if spin is not None:
            out.append(spin)
    if len(gil_members) > 1:
        out.append(Rate("GIL", "gil", _inv(gil), gil, gil_members))
    return sorted(out, key=lambda r: r.batches_per_s)


#: the name of the rate of the host nodes beside a CPU step's extra intra-op threads (:func:`_spinning`)
SPINNING = "cores beside the step's"


def _spinning(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
              config: StreamSettings) -> Rate | None:
    """The rate of the host nodes beside a CPU step (in worker processes, or in threads of their own) on the
    cores its extra intra-op threads leave them (None: a step on one thread, or not on the CPU, or one batch
    at a time, or nothing beside it).

    The spinning shows in a script whose loop runs in its main thread, its loader's workers beside it,
    processes and threads alike: on two cores such a step at torch's 2 threads can run at half the rate it
    runs at one. placer's own runner, the step in a thread of its own, does not lose to it, so its runs are
    no witness (:func:`placer.stream.verify._unspun`)."""
    i = _cpu_step(nodes)
    threads = config.torch_threads if config.torch_threads is not None else profile.torch_threads
    if i is None or not threads or threads < 2 or config.sequential:
        return None
    host = [k for k, n in enumerate(nodes) if k != i and n.device == "cpu" and n.kind != "copy"
            and not _remote(profile, n, config)]
    other = sum(costs[k][1] for k in host)
    members = [nodes[k].name for k in host]
    if other <= 0:
        return None
    left = max(1, profile.cores - (threads - 1))
    return Rate(f"{SPINNING} {threads} threads", "cores", left / other, other / left, members)


def _cpu_step(nodes: list[ChainNode]) -> int | None:
    """The index of the step when it runs on the CPU (else None)."""
    return next((k for k, n in enumerate(nodes) if n.kind == "step" and n.device == "cpu"), None)


def _in_processes(profile: StreamProfile, n: ChainNode, config: StreamSettings) -> bool:
    """Whether node ``n`` runs its batches in worker processes on this machine."""
    if n.kind == "source":
        return profile.source_kind != "iterable" and _loader_workers(profile, config) > 0
    return n.kind == "batch" and config.kind_of(n.name) == "process"


def _remote(profile: StreamProfile, n: ChainNode, config: StreamSettings) -> bool:
    """Whether node ``n`` runs its batches as tasks on the profile's cluster."""
    return (n.kind == "batch" and profile.cluster is not None and not config.sequential
            and config.kind_of(n.name) == "dask")


def remote_costs(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
                 config: StreamSettings) -> list[tuple[float, float]]:
    """``costs`` with each cluster stage's: a batch's share of a task's seconds, and the host CPU it takes
    (the client's; and the workers' own on a cluster that runs on this machine)."""
    out = list(costs)
    for i, n in enumerate(nodes):
        if _remote(profile, n, config):
            t = remote.terms(profile, n.name, profile.cluster, remote.group_of(profile, n.name, config))
            out[i] = (t.seconds_per_batch, t.client_cpu_s + (t.remote_cpu_s if profile.cluster.shares_host else 0.0))
    return out


def _cpu_rate(profile: StreamProfile, n: ChainNode, wall: float, config: StreamSettings) -> Rate:
    st = profile.stage(n.name)
    if _remote(profile, n, config):
        r = remote.rate(profile, n.name, profile.cluster, config.workers_of(n.name),
                        remote.group_of(profile, n.name, config))
        return Rate(n.name, "stage", r, 1.0 / r if r else float("inf"), [n.name])
    if n.kind == "batch":
        w = config.workers_of(n.name)
        r = st.rate(w, config.kind_of(n.name), wall)
        return Rate(n.name, "stage", r, 1.0 / r if r else float("inf"), [n.name])
    if n.kind == "source" and profile.source_kind != "iterable":
        w, t = _loader_workers(profile, config), _loader_threads(profile, config)
        s = loader_speedup(profile, st, w) if w > 0 else loader_thread_speedup(st, t) if t > 0 else 1.0
    else:
        s = 1.0
    return Rate(n.name, "stage", s * _inv(wall), wall / s if s else float("inf"), [n.name])


def in_worker_processes(profile: StreamProfile, config: StreamSettings) -> bool:
    """Whether ``config`` runs any of the stream's stages in worker processes on this machine: a Dataset or
    DataLoader source's workers (DataLoader worker processes), or a stage's process workers."""
    if config.sequential:
        return False
    loader = profile.source_kind != "iterable" and _loader_workers(profile, config) > 0
    return loader or any(config.kind_of(m) == "process" for m in config.stage_workers if m != profile.source)


def _loader_workers(profile: StreamProfile, config: StreamSettings) -> int:
    """Worker processes of a Dataset or DataLoader source under ``config`` (none where a thread-pool loader's
    threads read it, :func:`_loader_threads`)."""
    if config.sequential or config.loader_threads(profile.source):
        return 0
    if profile.source in config.stage_workers:
        return config.stage_workers[profile.source]
    if profile.source_kind == "loader" and profile.loader is not None:
        return profile.loader.num_workers
    return 0


def loader_thread_speedup(st, threads: int) -> float:
    """A thread-pool loader's ``threads`` over one thread reading the source: as measured
    (``ScalingRow(kind="thread")``, interpolated, held beyond), else as far as its GIL share lets
    them (``1 / gil``; unmeasured, it holds the GIL throughout)."""
    if any(r.kind == "thread" for r in st.scaling):
        return st.speedup(threads, "thread")
    gil = 1.0 if st.gil is None else st.gil
    return min(float(threads), 1.0 / max(gil, 1e-9))


def _loader_threads(profile: StreamProfile, config: StreamSettings) -> int:
    """Threads of a thread-pool loader reading a Dataset or DataLoader source under ``config``
    (:meth:`~placer.data.stream.StreamSettings.loader_threads`): they run the source at
    :func:`loader_thread_speedup`, holding the GIL for the share that speed-up shows."""
    if profile.source_kind == "iterable" or not config.loader_threads(profile.source):
        return 0
    return config.stage_workers[profile.source]


def _inv(seconds: float) -> float:
    return 1.0 / seconds if seconds > 0 else float("inf")


def _steady(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
            config: StreamSettings) -> tuple[float, str, list[Rate]]:
    if not nodes:
        return float("inf"), "", []
    if config.sequential:
        total = sum(w for w, _ in costs)
        r = Rate("one batch at a time", "sequential", _inv(total), total, [n.name for n in nodes])
        return r.batches_per_s, r.name, [r]
    rs = rates(profile, nodes, costs, config)
    return rs[0].batches_per_s, rs[0].name, rs


def _busy_wall(profile: StreamProfile, st, threads: int | None) -> float | None:
    """The step's wall seconds per batch beside one busy core, at ``threads`` (None: torch's own)."""
    n = threads if threads is not None else (profile.torch_threads or 1)
    return st.busy_seconds.get(n)


def _contended(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
               config: StreamSettings, decode: bool = True
               ) -> tuple[float, str, list[Rate], list[tuple[float, float]]]:
    """The steady state with a CPU step, and a source that runs threads of its own (``StreamStageProfile.beside_busy_s``,
    read here or in worker processes, each of which runs those threads too; ``decode`` False where it reads a
    cache back instead), slowed by the cores the other host nodes keep busy (for the source, its other worker
    processes too)."""
    bps, neck, rs = _steady(profile, nodes, costs, config)
    if config.sequential or bps in (0.0, float("inf")):
        return bps, neck, rs, costs
    slowed: list[tuple[int, float]] = []  # node index, its wall beside one busy core
    i = _cpu_step(nodes)
    if i is not None:
        beside = _busy_wall(profile, profile.stage(nodes[i].name), config.torch_threads)
        if beside is not None and beside > costs[i][0]:
            slowed.append((i, beside))
    own = 0.0  # CPU seconds a batch of the source's other worker processes, beside the one reading a batch
    if decode and nodes[0].kind == "source":
        st = profile.stage(nodes[0].name)
        alone = st.seconds.get("cpu")
        if st.beside_busy_s is not None and alone and st.beside_busy_s > alone:  # in a worker as here: scaled
            slowed.append((0, costs[0][0] * st.beside_busy_s / alone))
            if _in_processes(profile, nodes[0], config):
                w = max(1, _loader_workers(profile, config))
                own = costs[0][1] * (w - 1) / w
    on_host = [k for k, n in enumerate(nodes) if n.device == "cpu" or n.device in profile.simulated]
    others = {k: sum(costs[j][1] for j in on_host if j != k) + (own if k == 0 else 0.0) for k, _ in slowed}
    slowed = [(k, b) for k, b in slowed if others[k] > 0]
    if not slowed:
        return bps, neck, rs, costs
    r = bps
    out = costs
    for _ in range(30):  # each candidate's prediction: converge to 0.01 %, far inside the measured noise
        out = list(costs)
        for k, beside in slowed:
            u = min(1.0, r * others[k])
            out[k] = (costs[k][0] + u * (beside - costs[k][0]), costs[k][1])
        bps, neck, rs = _steady(profile, nodes, out, config)
        if abs(bps - r) <= 1e-4 * r:
            break
        r = 0.5 * (r + bps)
    return bps, neck, rs, out


def epoch_fill(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]], bps: float,
               config: StreamSettings) -> float:
    """Seconds an epoch of a stream with queues takes beyond its batches at the steady rate: its first batch
    passes every node before the step has one (the latency of the chain, each node's seconds once), where
    the steady state finishes a batch every ``1 / bps``. The source is read one batch ahead (the runner
    learns an epoch's last batch so), so in this process, or through one worker process, its first two
    batches come before the first is passed on. One batch at a time has no fill (every batch is the
    chain's latency). On 2 cores, a script's stream of 8 batches an epoch (a 42 ms decode in a thread, the
    step 18 ms) took its first batch to the step after 100 ms and ran the epoch in 0.59 s, where its
    steady rate alone gave 0.44 s."""
    if config.sequential or not nodes or bps in (0.0, float("inf")):
        return 0.0
    latency = sum(w for w, _ in costs)
    if nodes[0].kind == "source" and _loader_workers(profile, config) <= 1:
        latency += costs[0][0]
    return max(0.0, latency - 1.0 / bps)


def cache_index(nodes: list[ChainNode], cache: str | None) -> int | None:
    return next((i for i, n in enumerate(nodes) if n.name == cache and n.kind != "copy"), None)


def cache_bytes(profile: StreamProfile, nodes: list[ChainNode], at: int) -> int:
    """Bytes of one batch kept by a cache after node ``at``: the values later nodes still read."""
    made = {n.name for n in nodes[: at + 1] if n.kind != "copy"}
    later = {v for n in nodes[at + 1:] for v in [*n.reads, *n.moves]}
    total = 0
    for v in made & later:
        sizes = profile.stage(v).out_bytes
        total += max(sizes.values()) if sizes else 0
    return total


def predict(profile: StreamProfile, placement: dict[str, str], config: StreamSettings,
            epochs: int | None = None) -> StreamPrediction:
    """The predicted throughput (and total time over ``epochs``) of one placement and configuration.

    Parameters
    ----------
    profile : StreamProfile
    placement : dict
        Member → device (members not named run on the CPU).
    config : StreamConfig
        Workers, worker kinds, pinned copies and the cache point (prefetch does not
        enter the steady state: it only has to keep every worker fed).
    epochs : int, optional
        Epochs for the total time (default: the source's).
    """
    notes: list[str] = []
    nodes = chain(profile, placement)
    costs = node_costs(profile, nodes, config.pin_memory, notes, config.torch_threads)
    if profile.cluster is not None:
        costs = remote_costs(profile, nodes, costs, config)
    costs = in_workers(profile, nodes, costs, config)
    first = in_turn(profile, nodes, costs, config) if config.sequential else costs
    bps, neck, rs, used = _contended(profile, nodes, first, config)
    if not config.sequential:
        bps = max(bps, alternating(profile, nodes, costs, config))
    later_bps, later_neck = bps, neck
    fill = later_fill = epoch_fill(profile, nodes, used, bps, config)
    at = cache_index(nodes, config.cache)
    loader_later = True  # later epochs start the source's loader again (not when they replay a cache)
    if at is not None:
        batches = profile.batches_per_epoch or 0
        if cache_bytes(profile, nodes, at) * batches > config.cache_bytes:
            notes.append(f"the cache after {config.cache!r} would exceed {config.cache_bytes:,} bytes; "
                         "later epochs recompute it")
        elif at == 0 and nodes[0].kind == "source":  # by sample: each later epoch reads them back
            read = profile.stage(nodes[0].name).cached_read_s or 0.0
            later_bps, later_neck, _, out = _contended(profile, nodes, [(read, read), *costs[1:]], config,
                                                       decode=False)
            later_fill = epoch_fill(profile, nodes, out, later_bps, config)
        else:
            later_bps, later_neck, _, out = _contended(profile, nodes[at + 1:], costs[at + 1:], config)
            later_fill = epoch_fill(profile, nodes[at + 1:], out, later_bps, config)
            loader_later = False
    e = profile.epochs if epochs is None else epochs
    spb = profile.samples_per_batch
    pred = StreamPrediction(samples_per_s=bps * spb, batches_per_s=bps, bottleneck=neck, rates=rs,
                      later_batches_per_s=later_bps, later_bottleneck=later_neck, epochs=e, notes=notes)
    if profile.batches_per_epoch:
        b = profile.batches_per_epoch
        later = (e - 1) * (b / later_bps + later_fill) if later_bps != float("inf") else 0.0
        starts = e if loader_later and not kept_workers(profile, config) else min(e, 1)
        pred.total_s = b / bps + fill + later + starts * worker_bounds(profile, nodes, config)
        pred._samples = e * b * spb
    return pred
