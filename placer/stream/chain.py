"""A stream as the chain of its nodes (source, batch stages, copies, step) and what each costs per batch:
seconds per node, in turn or overlapped, its workers (processes, threads, a cluster's tasks), epoch fills
and cache points. Plain arithmetic on a :class:`~placer.data.stream.StreamProfile`.

May import: placer.data.stream, placer.devices (the host location's name), placer.stream.remote.
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
    if nodes[0].kind == "source" and loader_processes(profile, config) <= 1:
        latency += costs[0][0]
    return max(0.0, latency - 1.0 / bps)


def loader_processes(profile: StreamProfile, config: StreamSettings) -> int:
    """Worker processes of a Dataset or DataLoader source under ``config`` (none where a thread-pool loader's
    threads read it, :func:`loader_threads_of`)."""
    if config.sequential or config.loader_threads(profile.source):
        return 0
    if profile.source in config.stage_workers:
        return config.stage_workers[profile.source]
    if profile.source_kind == "loader" and profile.loader is not None:
        return profile.loader.num_workers
    return 0


def loader_threads_of(profile: StreamProfile, config: StreamSettings) -> int:
    """Threads of a thread-pool loader reading a Dataset or DataLoader source under ``config``
    (:meth:`~placer.data.stream.StreamSettings.loader_threads`): they run the source at
    :func:`loader_thread_speedup`, holding the GIL for the share that speed-up shows."""
    if profile.source_kind == "iterable" or not config.loader_threads(profile.source):
        return 0
    return config.stage_workers[profile.source]


def loader_thread_speedup(st, threads: int) -> float:
    """A thread-pool loader's ``threads`` over one thread reading the source: as measured
    (``ScalingRow(kind="thread")``, interpolated, held beyond), else as far as its GIL share lets
    them (``1 / gil``; unmeasured, it holds the GIL throughout)."""
    if any(r.kind == "thread" for r in st.scaling):
        return st.speedup(threads, "thread")
    gil = 1.0 if st.gil is None else st.gil
    return min(float(threads), 1.0 / max(gil, 1e-9))


def _source_in_workers(profile: StreamProfile, nodes: list[ChainNode], config: StreamSettings):
    """The source's profile where it is a Dataset or DataLoader read by worker processes, else None."""
    if not nodes or nodes[0].kind != "source" or not in_processes(profile, nodes[0], config):
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
    n = max(1, min(loader_processes(profile, config), profile.cores))
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
    return bool(config.persistent_workers and profile.same_source and loader_processes(profile, config) > 0)


def worker_bounds(profile: StreamProfile, nodes: list[ChainNode], config: StreamSettings) -> float:
    """Seconds an epoch adds for starting a loader's worker processes and stopping them at its end:
    one worker's, as measured, times the workers per core where there are more workers than cores
    (the loader starts them one after the other; measured for a tokenizer on 2 cores, to the first
    batch: 33-40 ms with 1 or 2 workers, 38-55 with 3, 55-63 with 4)."""
    st = _source_in_workers(profile, nodes, config)
    if st is None or st.worker_start_s is None:
        return 0.0
    w = loader_processes(profile, config)
    return (st.worker_start_s + (st.worker_end_s or 0.0)) * max(1.0, w / max(1, profile.cores))


def in_processes(profile: StreamProfile, n: ChainNode, config: StreamSettings) -> bool:
    """Whether node ``n`` runs its batches in worker processes on this machine."""
    if n.kind == "source":
        return profile.source_kind != "iterable" and loader_processes(profile, config) > 0
    return n.kind == "batch" and config.kind_of(n.name) == "process"


def in_worker_processes(profile: StreamProfile, config: StreamSettings) -> bool:
    """Whether ``config`` runs any of the stream's stages in worker processes on this machine: a Dataset or
    DataLoader source's workers (DataLoader worker processes), or a stage's process workers."""
    if config.sequential:
        return False
    loader = profile.source_kind != "iterable" and loader_processes(profile, config) > 0
    return loader or any(config.kind_of(m) == "process" for m in config.stage_workers if m != profile.source)


def on_cluster(profile: StreamProfile, n: ChainNode, config: StreamSettings) -> bool:
    """Whether node ``n`` runs its batches as tasks on the profile's cluster."""
    return (n.kind == "batch" and profile.cluster is not None and not config.sequential
            and config.kind_of(n.name) == "dask")


def remote_costs(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
                 config: StreamSettings) -> list[tuple[float, float]]:
    """``costs`` with each cluster stage's: a batch's share of a task's seconds, and the host CPU it takes
    (the client's; and the workers' own on a cluster that runs on this machine)."""
    out = list(costs)
    for i, n in enumerate(nodes):
        if on_cluster(profile, n, config):
            t = remote.terms(profile, n.name, profile.cluster, remote.group_of(profile, n.name, config))
            out[i] = (t.seconds_per_batch, t.client_cpu_s + (t.remote_cpu_s if profile.cluster.shares_host else 0.0))
    return out


def cpu_step(nodes: list[ChainNode]) -> int | None:
    """The index of the step when it runs on the CPU (else None)."""
    return next((k for k, n in enumerate(nodes) if n.kind == "step" and n.device == "cpu"), None)
