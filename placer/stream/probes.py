"""The source and the CPU stages probed beyond the sweeps: thread and process scaling, the source in a
worker process, in threads, beside a busy core and against the GIL, and each stage on a cluster's worker.

May import: placer.data.stream, placer.devices, placer.errors, placer.log, placer.pipeline, placer.timing,
placer.executor.stream.*, placer.stream.{scaling,sweep}.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any


from placer.data.stream import GIL_SPEEDUP, ScalingRow, StreamStageProfile
from placer.log import get_logger
from placer.timing import Clock, Deadline, Measurement
from placer.pipeline import Stage
from placer.executor.stream.config import StreamConfig
from placer.executor.stream.nodes import takes
from placer.executor.stream.source import call_source, describe_source, loader_for
from placer.stream.scaling import Busy, gil_held, process_scaling, thread_scaling
from placer.stream.sweep import Profiler, Sweep

log = get_logger(__name__)


#: seconds each CPU batch stage is timed for on a cluster's worker, and again here (after a warm-up call)
CLUSTER_TIMING_S = 0.5
#: batches of the CPU sweep a stage is timed on, on a cluster's worker
CLUSTER_BATCHES = 4
#: seconds the timing task of one stage may take on the cluster before it is cancelled
CLUSTER_TIMEOUT_S = 60.0
#: batches of a Dataset or DataLoader source read through one worker process (after the first two)
WORKER_BATCHES = 12
#: the most DataLoader worker processes the source is read through at once to measure their speed-up
SCALED_WORKERS = 8
#: seconds of budget that timing a source through a worker process needs besides its batches (start, stop)
WORKER_MIN_S = 0.2
#: a source whose CPU seconds a batch exceed its wall by this factor runs threads of its own (BLAS, FFT):
#: it is also read beside one busy core (``StreamStageProfile.beside_busy_s``)
OWN_THREADS = 1.2
#: reads of such a source timed alone and beside a busy core, in turn (the most)
BESIDE_PAIRS = 3
#: batches of the source read beside the GIL probe
GIL_READS = 4
#: seconds a process-scaling measurement needs at least (children start in about half a second)
PROCESS_MIN_S = 1.0


def scale_threads(prof: Profiler, sweep: Sweep | None, stages: dict[str, StreamStageProfile],
                  budget_s: float | None) -> None:
    """Thread scaling of every CPU batch stage, on the inputs the CPU sweep gave it."""
    if sweep is None:
        return
    todo = [n for n in sweep.run.nodes if n.kind == "batch" and n.device.kind == "cpu" and sweep.inputs.get(n.name)]
    for i, node in enumerate(todo):
        share = None if budget_s is None else budget_s / (len(todo) - i)
        with Clock() as took:
            rows = thread_scaling(node, sweep.inputs[node.name], max_threads=prof.max_threads, budget_s=share)
        if budget_s is not None:
            budget_s = max(0.0, budget_s - took.wall)
        st = stages[node.name]
        st.scaling = rows
        two = next((r for r in rows if r.workers == 2), None)
        st.gil_bound = None if two is None else two.speedup < GIL_SPEEDUP
        if st.gil_bound:
            prof.notes.append(f"{node.name}: 2 threads ran {two.speedup:.2f}x one thread (under {GIL_SPEEDUP}x): "
                              "it holds the GIL (or the cores were busy); process workers would scale it")


def scale_processes(prof: Profiler, sweep: Sweep | None, stages: dict[str, StreamStageProfile],
                    budget_s: float | None) -> None:
    """Process-worker scaling of every GIL-bound CPU batch stage, when the budget allows."""
    if sweep is None:
        return
    todo = [n for n in sweep.run.nodes if n.kind == "batch" and n.device.kind == "cpu"
            and stages[n.name].gil_bound and sweep.inputs.get(n.name)]
    count = max(2, min(prof.cores, prof.max_threads))
    for i, node in enumerate(todo):
        share = None if budget_s is None else budget_s / (len(todo) - i)
        if share is not None and share < PROCESS_MIN_S:
            prof.notes.append(f"{node.name}: process workers not measured (under {PROCESS_MIN_S:g} s of the "
                              "profile's budget left); give the profile more time to weigh them")
            continue
        with Clock() as took:
            try:
                rows = process_scaling(node, sweep.inputs[node.name], count=count, budget_s=share)
            except Exception as exc:  # noqa: BLE001 - a stage a child cannot load runs on threads
                prof.notes.append(f"{node.name}: process workers could not run it ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0][:160]}); threads only")
                rows = []
        if budget_s is not None:
            budget_s = max(0.0, budget_s - took.wall)
        st = stages[node.name]
        st.scaling = [*st.scaling, *rows]
        if rows:
            best = max(rows, key=lambda r: r.batches_per_s)
            thread = st.rate(1, "thread", st.seconds["cpu"])
            prof.notes.append(f"{node.name}: {best.workers} worker processes ran {best.batches_per_s:.4g} "
                              f"batches/s ({best.batches_per_s / thread:.2f}x one thread, moving batches "
                              "included)")


def time_on_cluster(prof: Profiler, sweep: Sweep | None, stages: dict[str, StreamStageProfile], client: Any) -> None:
    """Every CPU batch stage timed on a worker of ``client``'s cluster and here, on the same few batches of
    the CPU sweep: its ``remote_ratio`` for that cluster (a stage that cannot travel is noted, and priced at
    this machine's seconds)."""
    from placer.executor.stream.dask_workers import stage_ratio
    from placer.executor.stream.workers import StageCall

    if sweep is None:
        return
    address = str(client.scheduler.address)
    todo = [n for n in sweep.run.nodes if n.kind == "batch" and n.device.kind == "cpu" and sweep.inputs.get(n.name)]
    for node in todo:
        items = [({a: b.values[src][node.location] for a, src in node.reads.items()}, b.info)
                 for b in sweep.inputs[node.name][-CLUSTER_BATCHES:]]
        call = StageCall(node.stage, node.device, node.consts, node.takes_info)
        try:
            ratio, there, here = stage_ratio(client, call, node.name, items, limit_s=CLUSTER_TIMING_S,
                                             timeout_s=CLUSTER_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a stage that cannot be timed there is priced at its seconds here
            prof.notes.append(f"{node.name}: not timed on the cluster's workers ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); priced there at its "
                              "seconds here")
            continue
        stages[node.name].remote_ratio[address] = ratio
        log.info("%s: %.4g s per batch on a worker of %s, %.4g s here (%.2fx)", node.name, there, address, here,
                 ratio)


def in_a_worker(prof: Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
    """A Dataset or DataLoader source read through one DataLoader worker process, the consumer idle
    (``StreamStageProfile.worker_seconds``, ``worker_start_s``, ``worker_end_s``): its first batch, up to
    :data:`WORKER_BATCHES` more (at least five, within ``budget_s``), and stopping the worker."""
    if "cpu" not in st.seconds or "torch" not in sys.modules:
        return
    if budget_s is not None and budget_s < WORKER_MIN_S + 8 * st.seconds["cpu"]:
        prof.notes.append(f"source {prof.source!r}: not timed in a DataLoader worker process (the profile's "
                          "budget was spent); its worker processes are priced at its seconds here")
        return
    # a source a worker process cannot read is priced as read here
    timed = _time_source(prof, StreamConfig(stage_workers={prof.source: 1}), budget_s, 2,
                         "not timed in a DataLoader worker process", "; its worker processes are priced at its "
                         "seconds here")
    if timed is not None:
        st.worker_start_s, st.worker_seconds, st.worker_end_s = timed
        _in_workers(prof, st, budget_s)


def _in_workers(prof: Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
    """The same source read through ``n`` worker processes at once (the cores, at most
    :data:`SCALED_WORKERS`), the consumer idle: their pace over one worker's is the source's process
    speed-up (``ScalingRow(kind="process", workers=n)`` in ``StreamStageProfile.scaling``), which the stream
    model prices a DataLoader's workers at instead of assuming ``n`` times one worker's rate. Worker
    processes share the machine's cores, their caches and, on a VM's vCPUs, often one physical core's
    execution units: two workers on two vCPUs can read a fifth slower than twice one worker's pace."""
    n = min(prof.cores, SCALED_WORKERS)
    if n < 2 or st.worker_seconds is None or st.worker_seconds <= 0:
        return
    if budget_s is not None and budget_s < WORKER_MIN_S + (WORKER_BATCHES + 2 * n) * st.worker_seconds / n:
        prof.notes.append(f"source {prof.source!r}: not timed in {n} DataLoader worker processes at once (the "
                          "profile's budget was spent); their speed-up is taken as the cores'")
        return
    # where it fails, priced as the cores' speed-up, as before
    timed = _time_source(prof, StreamConfig(stage_workers={prof.source: n}), budget_s, 2 * n,
                         f"not timed in {n} DataLoader worker processes")
    if timed is None or timed[1] <= 0:
        return
    rows = [r for r in st.scaling if r.kind != "process"]
    st.scaling = [*rows, ScalingRow(kind="process", workers=n, batches_per_s=1.0 / timed[1],
                                    speedup=min(float(n), st.worker_seconds / timed[1]))]


def _time_source(prof: Profiler, config: StreamConfig, budget_s: float | None, skip: int, failed: str,
                 then: str = "") -> tuple[float, float, float] | None:
    """:func:`_time_one_worker` of the source's epoch 0 read by the loader ``config`` gives it; None where the
    source returns an iterable of batches, or its epoch is too short, or reading fails (then a note says
    ``failed``, the error, and ``then``)."""
    try:
        read = _source_read(prof)
        if read is None:
            return None
        src, obj = read
        return _time_one_worker(loader_for(src, obj, config), budget_s, skip=skip)
    except Exception as exc:  # noqa: BLE001 - a probe of the user's source must not fail the profile
        prof.notes.append(f"source {prof.source!r}: {failed} "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}){then}")
        return None


def _source_read(prof: Profiler) -> tuple[Stage, Any] | None:
    """The source stage and what it returns for epoch 0, where that is a Dataset or DataLoader (else None)."""
    src = prof.pipeline.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    obj = call_source(src, consts, 0)
    return None if describe_source(obj) == "iterable" else (src, obj)


def in_threads(prof: Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
    """A Dataset or DataLoader source read by a thread-pool loader's ``n`` threads at once (the cores, at
    most :data:`SCALED_WORKERS`; :class:`~placer.executor.stream.threadloader.ThreadLoader`), the consumer
    idle: their pace over a batch read in this process is the source's thread speed-up
    (``ScalingRow(kind="thread", workers=n)``), at which the stream model prices a thread-pool loader and
    from which it takes the source's GIL share (Amdahl's law). Threads share this process's GIL but start no
    processes and copy nothing back: where decoding releases the GIL (PIL, numpy), two loader threads can
    read as fast as two worker processes."""
    n = min(prof.cores, SCALED_WORKERS)
    wall = st.seconds.get("cpu")
    if n < 2 or not wall or "torch" not in sys.modules:
        return
    if budget_s is not None and budget_s < WORKER_MIN_S + (WORKER_BATCHES + 2 * n) * wall / n:
        prof.notes.append(f"source {prof.source!r}: not read by {n} loader threads at once (the profile's budget "
                          "was spent); a thread-pool loader is not offered for it")
        return
    config = StreamConfig(stage_workers={prof.source: n}, worker_kind={prof.source: "thread"})
    timed = _time_source(prof, config, budget_s, 2 * n, f"not read by {n} loader threads",
                         "; a thread-pool loader is not offered for it")
    if timed is None or timed[1] <= 0:
        return
    rows = [r for r in st.scaling if r.kind != "thread"]
    st.scaling = [*rows, ScalingRow(kind="thread", workers=n, batches_per_s=1.0 / timed[1],
                                    speedup=min(float(n), wall / timed[1]))]


def _source_batches(prof: Profiler) -> Any:
    """The source's first epoch read in this process (no workers), its first batch read (that starts the
    iterator: a file, a generator); None when the epoch is empty."""
    src = prof.pipeline.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    obj = call_source(src, consts, 0)
    if describe_source(obj) != "iterable":
        obj = loader_for(src, obj, StreamConfig(workers=0))
    it = iter(obj)
    return None if next(it, None) is None else it


def source_beside_busy(prof: Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
    """A source read in this process that runs threads of its own (``OWN_THREADS``): its batches read beside
    one busy core (``StreamStageProfile.beside_busy_s``), each after one read alone, up to :data:`BESIDE_PAIRS`
    pairs within ``budget_s``. Its threads meet the step's on the cores as the step's meet a worker's."""
    wall, cpu = st.seconds.get("cpu"), st.cpu_seconds.get("cpu")
    if prof.cores < 2 or not wall or not cpu or cpu < OWN_THREADS * wall:
        return
    if budget_s is not None and budget_s < 8 * wall:
        return
    deadline = Deadline(budget_s)
    alone: list[float] = []
    alone_cpu: list[float] = []
    beside: list[float] = []
    try:
        it = _source_batches(prof)
        if it is None:
            return
        with Busy() as busy:
            while len(beside) < BESIDE_PAIRS and not (beside and deadline.passed()):
                with Clock() as a:
                    got = next(it, None)
                busy.work.set()
                time.sleep(0.001)  # the busy thread is running before the read starts
                with Clock(cpu_clock=None) as b:
                    got2 = next(it, None)
                busy.work.clear()
                if got is None or got2 is None:
                    break
                alone.append(a.wall)
                alone_cpu.append(a.cpu if a.cpu is not None else a.wall)
                beside.append(b.wall)
    except Exception as exc:  # noqa: BLE001 - a probe of the user's source must not fail the profile
        prof.notes.append(f"source {prof.source!r}: not read beside a busy core ({type(exc).__name__}: {exc})")
        return
    if not beside or statistics.median(alone) <= 0:
        return
    st.own_threads = max(1.0, statistics.median(alone_cpu) / statistics.median(alone))
    if st.own_threads >= OWN_THREADS:  # the sweep's CPU can hold the step's threads spinning: this cannot
        st.beside_busy_s = wall * max(1.0, statistics.median(beside) / statistics.median(alone))


def source_gil(prof: Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
    """The share of its time a source read in this process holds the GIL (``StreamStageProfile.gil``): up to
    :data:`GIL_READS` batches read beside the probe thread (:func:`gil_held`), within ``budget_s``.

    Unmeasured, a source on a thread of this process is priced as holding the GIL throughout, which a
    source waiting on files or sockets does not; per-sample Python reads near 1 (PIL decoding small
    images and numpy augmenting them read 1.0). A source that runs threads of its own meets the probe on the
    cores too, which reads as GIL held: its share then errs high, as the unmeasured 1.0 does."""
    wall = st.seconds.get("cpu")
    if not wall or (budget_s is not None and budget_s < 2 * GIL_READS * wall + 0.05):
        return
    try:
        it = _source_batches(prof)
        if it is None:
            return
        ends = []

        def read(_: Any) -> None:
            if next(it, None) is None:
                ends.append(1)

        held = gil_held(read, [None] * GIL_READS)
    except Exception as exc:  # noqa: BLE001 - a probe of the user's source must not fail the profile
        prof.notes.append(f"source {prof.source!r}: its GIL share not measured ({type(exc).__name__}: {exc})")
        return
    if held is not None and not ends:
        st.gil = min(1.0, held / wall)


def _time_one_worker(loader: Any, budget_s: float | None, skip: int = 2) -> tuple[float, float, float] | None:
    """Start-up beyond a batch, seconds per batch (the median after the first ``skip``, which the worker
    made while the first was on its way; with several workers, the batches they read ahead while it was)
    and seconds to stop, of ``loader`` (one worker process, or its workers); None when its epoch has
    under ``skip + 2`` batches."""
    deadline = Deadline(budget_s)
    with Clock(cpu_clock=None) as first:
        it = iter(loader)
        got = next(it, None)
    per: list[float] = []
    while (got is not None and len(per) < WORKER_BATCHES + skip
           and not (len(per) >= skip + 3 and deadline.passed())):
        with Clock(cpu_clock=None) as c:
            got = next(it, None)
        if got is not None:
            per.append(c.wall)
    with Clock(cpu_clock=None) as end:
        del it  # a loader's iterator stops its workers when it goes
    if len(per) < skip + 1:
        return None
    pace = Measurement(raw_times=per[skip:], label="a batch through worker processes").median_s
    return max(0.0, first.wall - pace), pace, end.wall
