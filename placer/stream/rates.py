"""Each node's rate in a stream and what caps it: workers, the cores, the GIL, a device shared, the link, a
step's spinning threads beside the workers (operational analysis, as in Plumber).

May import: placer.data.stream, placer.stream.{chain,remote}.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placer.data.stream import StreamProfile, StreamSettings
from placer.stream import remote
from placer.stream.chain import (ChainNode, cpu_step, in_processes, loader_processes, loader_thread_speedup,
                                 loader_threads_of, loader_speedup, on_cluster)



@dataclass
class Rate:
    """One resource's limit: batches per second, and the seconds per batch it needs."""

    name: str
    kind: str
    batches_per_s: float
    seconds_per_batch: float
    members: list[str] = field(default_factory=list)


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
    if n.kind == "batch" and on_cluster(profile, n, config):
        t = remote.terms(profile, n.name, profile.cluster, remote.group_of(profile, n.name, config))
        return min(1.0, t.client_cpu_s / t.seconds_per_batch) if t.seconds_per_batch > 0 else 0.0
    if n.kind == "batch":
        return _moving_share(st) if config.kind_of(n.name) == "process" else gil_share(profile, n.name)
    if n.kind == "source":
        if profile.source_kind != "iterable" and loader_processes(profile, config) > 0:
            return 0.0
        if profile.source_kind != "iterable" and loader_threads_of(profile, config) > 0 and any(
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
        spin = spinning(profile, nodes, costs, config)
        if spin is not None:
            out.append(spin)
    if len(gil_members) > 1:
        out.append(Rate("GIL", "gil", _inv(gil), gil, gil_members))
    return sorted(out, key=lambda r: r.batches_per_s)


#: the name of the rate of the host nodes beside a CPU step's extra intra-op threads (:func:`spinning`)
SPINNING = "cores beside the step's"


def spinning(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
             config: StreamSettings) -> Rate | None:
    """The rate of the host nodes beside a CPU step (in worker processes, or in threads of their own) on the
    cores its extra intra-op threads leave them (None: a step on one thread, or not on the CPU, or one batch
    at a time, or nothing beside it).

    The spinning shows in a script whose loop runs in its main thread, its loader's workers beside it,
    processes and threads alike: on two cores such a step at torch's 2 threads can run at half the rate it
    runs at one. placer's own runner, the step in a thread of its own, does not lose to it, so its runs are
    no witness (the verification then prefers the twin at other threads, :mod:`placer.stream.verify`)."""
    i = cpu_step(nodes)
    threads = config.torch_threads if config.torch_threads is not None else profile.torch_threads
    if i is None or not threads or threads < 2 or config.sequential:
        return None
    host = [k for k, n in enumerate(nodes) if k != i and n.device == "cpu" and n.kind != "copy"
            and not on_cluster(profile, n, config)]
    other = sum(costs[k][1] for k in host)
    members = [nodes[k].name for k in host]
    if other <= 0:
        return None
    left = max(1, profile.cores - (threads - 1))
    return Rate(f"{SPINNING} {threads} threads", "cores", left / other, other / left, members)


def _cpu_rate(profile: StreamProfile, n: ChainNode, wall: float, config: StreamSettings) -> Rate:
    st = profile.stage(n.name)
    if on_cluster(profile, n, config):
        r = remote.rate(profile, n.name, profile.cluster, config.workers_of(n.name),
                        remote.group_of(profile, n.name, config))
        return Rate(n.name, "stage", r, 1.0 / r if r else float("inf"), [n.name])
    if n.kind == "batch":
        w = config.workers_of(n.name)
        r = st.rate(w, config.kind_of(n.name), wall)
        return Rate(n.name, "stage", r, 1.0 / r if r else float("inf"), [n.name])
    if n.kind == "source" and profile.source_kind != "iterable":
        w, t = loader_processes(profile, config), loader_threads_of(profile, config)
        s = loader_speedup(profile, st, w) if w > 0 else loader_thread_speedup(st, t) if t > 0 else 1.0
    else:
        s = 1.0
    return Rate(n.name, "stage", s * _inv(wall), wall / s if s else float("inf"), [n.name])


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


def contended(profile: StreamProfile, nodes: list[ChainNode], costs: list[tuple[float, float]],
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
    i = cpu_step(nodes)
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
            if in_processes(profile, nodes[0], config):
                w = max(1, loader_processes(profile, config))
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
