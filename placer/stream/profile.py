"""Profiling a stream: each stage per batch on each device, copies, thread scaling, the consumer's rate.

May import: numpy, networkx, placer.pipeline, placer.devices, placer.errors, placer.log,
placer.data.stream, placer.executor (to compute one-shot inputs) and
placer.executor.transfer, placer.timing (every timing: per-batch repeats, torch's threads),
placer.profile.transfers (pinned and pageable copies, through the device's kind),
placer.stream.*, placer.executor.stream.* (``dask_workers`` inside a function, with a cluster). No torch of its
own (a Dataset source's collate is the one torch has loaded).

:func:`profile_stream` measures one stream at its real batch size:

1. **one-shot inputs**: the stages that feed the stream once (a table, a
   vocabulary) run once, on the CPU where they can;
2. **a sweep per device**: the stream runs sequentially
   (``StreamConfig(workers=0)``) for the first ``k`` batches with every stage that
   can run on the device placed there, each node timed per batch (wall and host
   CPU seconds); each per-batch value is copied to (or back from) every
   accelerator as the stream's copy nodes do (on a real GPU also from pinned and
   from pageable memory);
3. **thread scaling**: every CPU batch stage runs on the batches it saw, on
   1, 2, 4, ... threads at once; below :data:`~placer.data.stream.GIL_SPEEDUP`
   times one thread's rate at two threads it is marked GIL-bound;
4. **the differential test** (DS-Analyzer, FastFlow): the step's seconds per batch
   in a sweep are its seconds on already-prepared batches of the right shapes, so
   ``consumer_samples_per_s`` is the most the consumer could take;
5. **process scaling**: a GIL-bound stage is also run by 1 .. cores worker processes
   (the stream's own :class:`~placer.executor.stream.workers.ProcessPool`), giving
   ``ScalingRow(kind="process")`` rows (moving batches to the children included);
6. **the step, again** on its last batches: with one torch intra-op thread, interleaved
   with torch's default (``torch_seconds``); at each of those counts beside a thread
   that keeps one core busy (``busy_seconds``: the cores the stream's workers take
   from it); and with a probe thread counting beside it (:func:`gil_held`): the
   share of its time it holds the GIL;
7. **a loader's worker**: a Dataset or DataLoader source read through one DataLoader worker
   process, the consumer idle: the seconds to its first batch beyond a batch's, a batch's
   seconds there (collating into shared memory and sending included) and the seconds to
   stop it (``StreamStageProfile.worker_start_s``, ``worker_seconds``, ``worker_end_s``);
8. **on a cluster** (only with ``cluster``, a dask client): every CPU batch stage shipped
   to a worker as a run ships it, timed inside one task on a few of the batches it saw,
   and here on the same batches: its ``remote_ratio`` (the medians' ratio), what the
   stream model prices its batches on that cluster at (a worker may run the same code
   slower than here: dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``,
   which makes numpy code with batch-sized temporaries several times slower).

Everything is bounded by ``budget_s``: sweeps get 60 % of it, thread scaling half of
what is left, process scaling most of the rest (at least :data:`PROCESS_MIN_S` when
the budget is 4 s or more); each takes at least two batches or one round per worker
count, and the step's re-runs take a few calls.
"""

from __future__ import annotations

import sys
from typing import Any


from placer.data.stream import CopyProfile, StreamStageProfile, StreamProfile
from placer.devices import Inventory, discover
from placer.errors import PlacerError
from placer.log import get_logger
from placer.timing import Clock, Deadline, Measurement, Timings, settle, torch_threads
from placer.pipeline import BATCH_INFO, Pipeline
from placer.executor.stream.nodes import Bundle, Node, takes
from placer.executor.stream.runner import StreamRun
from placer.executor.stream.source import workers_key
from placer.stream.probes import (OWN_THREADS, PROCESS_MIN_S, in_a_worker, in_threads, scale_processes,
                                  scale_threads, source_beside_busy, source_gil, time_on_cluster)
from placer.stream.scaling import busy_ratios, gil_held
from placer.stream.source_facts import cached_read, called_again, source_facts
from placer.stream.sweep import (HOST_DEVICE, Profiler, Sweep, can_run, in_turn_mean, one_shot_inputs, placements,
                                 steady)

log = get_logger(__name__)

__all__ = ["DEFAULT_BATCHES", "OWN_THREADS", "can_run", "gil_held", "in_turn_mean", "one_shot_inputs", "profile_stream"]


#: batches measured per device sweep (the first pays for warm-up and is not used)
DEFAULT_BATCHES = 16


def profile_stream(pipeline: Pipeline, source: str | None = None, *, budget_s: float | None = 10.0,
                   inventory: Inventory | None = None, batches: int = DEFAULT_BATCHES,
                   max_threads: int | None = None, consts: dict[str, Any] | None = None,
                   devices: list[str] | None = None, cluster: Any = None) -> StreamProfile:
    """Measure one stream of ``pipeline`` on this machine's devices.

    Parameters
    ----------
    pipeline : Pipeline
    source : str, optional
        The stream's source (default: the first stream).
    budget_s : float or None
        Seconds the measurements may take (None: ``batches`` per sweep, every count).
    inventory : Inventory, optional
        The devices (default: discovered).
    batches : int
        Batches per device sweep.
    max_threads : int, optional
        The most thread workers tried per CPU stage (default: twice the cores, 4 to 8).
    consts : dict, optional
        The stream's one-shot inputs on the host, when already computed.
    devices : list of str, optional
        Devices to measure (default: the CPU and every accelerator of the inventory).
    cluster : distributed.Client, optional
        A dask cluster the stream's CPU batch stages may run on: each is also timed on one
        of its workers against here (``StreamStageProfile.remote_ratio``; bounded by
        :data:`CLUSTER_TIMING_S` per side and :data:`CLUSTER_TIMEOUT_S`).

    Returns
    -------
    StreamProfile
    """
    budget = Deadline(budget_s)
    p = pipeline.validate()
    streams = p.streams()
    if not streams:
        raise PlacerError(f"pipeline {p.name!r} has no stream to profile")
    source = source or next(iter(streams))
    inv = inventory or discover()
    consts = one_shot_inputs(p, source, inv) if consts is None else consts
    prof = Profiler(p, source, inv, consts, max(1, batches), max_threads)
    names = devices or ["cpu", *[d.name for d in prof.accel]]
    places = placements(p, prof.members, names)
    sweep_budget = None if budget_s is None else 0.6 * budget_s / len(places)
    sweeps = {}
    for d, place in places.items():
        settle()  # threads still spinning from earlier work would count as the stages' CPU seconds
        sweeps[d] = Sweep(prof, d, place)
        sweeps[d].go(sweep_budget)
    stages = _stages(prof, sweeps)

    def left(share: float = 1.0) -> float | None:
        return None if budget_s is None else share * budget.left()

    cpu = sweeps.get("cpu")
    scale_threads(prof, cpu, stages, left(0.5))
    floor = PROCESS_MIN_S if budget_s is None or budget_s >= 4 * PROCESS_MIN_S else 0.0
    scale_processes(prof, cpu, stages, None if budget_s is None else max(floor, left(0.7)))
    _step_extras(prof, cpu, stages[prof.members[-1]])
    in_a_worker(prof, stages[prof.source], left())
    in_threads(prof, stages[prof.source], left())
    source_beside_busy(prof, stages[prof.source], left())
    source_gil(prof, stages[prof.source], left())
    if cluster is not None:
        time_on_cluster(prof, cpu, stages, cluster)
    return _assemble(prof, sweeps, stages, budget_s, budget.spent())


def _stages(prof: Profiler, sweeps: dict[str, Sweep]) -> dict[str, StreamStageProfile]:
    p, members = prof.pipeline, prof.members
    src = p.stages[prof.source]
    keyed = src.cache_key is not None  # outputs kept by the source's declared key: reshuffling is fine
    varies = takes(src.impl_for("cpu").fn, BATCH_INFO) and not keyed
    out: dict[str, StreamStageProfile] = {}
    random_seen = varies
    for m in members:
        st = p.stages[m]
        random_seen = random_seen or st.random or (keyed and st.role not in ("source", "step") and any(
            takes(i.fn, BATCH_INFO) for i in (st.fn, st.cpu, st.gpu) if i is not None))
        prof_m = StreamStageProfile(name=m, role=st.role if st.role in ("source", "step") else "batch", kind=st.kind,
                              devices=[d for d in sweeps if can_run(p, m, d)],
                              reads=[s for s in st.inputs.values() if s in members], pin=st.pin,
                              out_bytes=prof.out_bytes.get(m, {}), cacheable=not random_seen and st.role != "step"
                              and not (keyed and st.role == "source"))
        for d, sw in sweeps.items():
            if sw.placement[m] == d and m in sw.timings:
                prof_m.seconds[d] = steady(sw.timings.wall(m))
                prof_m.cpu_seconds[d] = steady(sw.timings.cpu(m))
                prof_m.in_turn_seconds[d] = in_turn_mean(sw.timings.wall(m).raw_times)
        out[m] = prof_m
    return out


def _step_extras(prof: Profiler, sweep: Sweep | None, step: StreamStageProfile) -> None:
    """On the CPU sweep's last batches: the step with one torch intra-op thread (interleaved with
    torch's default, for the ratio), and the share of its time it holds the GIL (probe thread)."""
    node = sweep.run.nodes[-1] if sweep is not None else None
    kept = sweep.inputs.get(node.name) if node is not None else None
    if not kept or node.device.kind != "cpu" or "cpu" not in step.seconds:
        return
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    call = _step_call(sweep.run, node)
    if threads is not None and threads > 1:
        (ratio, cpu_ratio), (one, one_cpu) = _threads_ratio(torch, call, kept, threads)
        # the sweep's seconds at the default threads times the ratio, or the seconds measured at one
        # thread where fewer: a step slower in the sweep than alone at its default threads (its threads
        # met a loader's on the cores) does not carry that to one thread, which leaves the loader a core
        step.torch_seconds[1] = min(step.seconds["cpu"] * ratio, one)
        step.torch_cpu_seconds[1] = min(step.cpu_seconds.get("cpu", step.seconds["cpu"]) * cpu_ratio, one_cpu)
    if prof.cores > 1:
        alone = {threads or 1: step.seconds["cpu"], **step.torch_seconds}
        for n, r in busy_ratios(torch, call, kept, sorted(alone)).items():
            step.busy_seconds[n] = alone[n] * r
    with torch_threads(1 if torch is not None else None):
        held = gil_held(call, kept)
    if held is not None and step.seconds["cpu"] > 0:
        step.gil = min(1.0, held / step.seconds["cpu"])


def _step_call(run: StreamRun, node: Node):
    def call(b: Bundle) -> None:
        run.work(node, b)
    return call


def _threads_ratio(torch: Any, call, kept: list[Bundle], threads: int,
                   rounds: int = 2) -> tuple[tuple[float, float], tuple[float, float]]:
    """Wall and CPU seconds of the step at one intra-op thread over those at ``threads`` (medians of
    runs interleaved batch by batch, so that a change of load affects both alike), and the wall and
    CPU seconds at one thread (the medians)."""
    t = Timings()
    for _ in range(rounds):
        for b in kept:
            for n in (threads, 1):
                with torch_threads(n if torch is not None else None), Clock() as c:
                    call(b)
                t.add(n, c)
    wall = {n: Measurement(raw_times=xs, label=f"step at {n} threads").median_s for n, xs in t.wall_s.items()}
    cpu = {n: Measurement(raw_times=xs, label=f"step at {n} threads (CPU)").median_s for n, xs in t.cpu_s.items()}
    return ((wall[1] / wall[threads] if wall[threads] > 0 else 1.0,
             cpu[1] / cpu[threads] if cpu[threads] > 0 else 1.0), (wall[1], cpu.get(1, wall[1])))


def _assemble(prof: Profiler, sweeps: dict[str, Sweep], stages: dict[str, StreamStageProfile],
              budget_s: float | None, spent: float) -> StreamProfile:
    p = prof.pipeline
    src = p.stages[prof.source]
    step = stages[prof.members[-1]]
    first = next(iter(sweeps.values()))
    spb = sum(first.samples) / len(first.samples) if first.samples else 1.0
    kind, loader, per_epoch, obj = source_facts(prof, spb)
    key = workers_key(obj) if src.epochs > 1 else None
    same = key is not None and workers_key(called_again(prof)) == key
    stages[prof.source].cached_read_s = cached_read(prof, obj, kind, loader)
    devs = {"cpu": HOST_DEVICE, **{d.name: d for d in prof.accel}}
    copies = [CopyProfile(value=v, src=a, dst=b, bytes=prof.copy_bytes[(v, a, b)],
                          seconds={m: steady(t.wall(m)) for m in t.keys()}, cpu_seconds=steady(t.cpu("executor")))
              for (v, a, b), t in prof.copies.items()]
    return StreamProfile(
        pipeline=p.name, source=prof.source, step=prof.members[-1], members=list(prof.members), epochs=src.epochs,
        batch_size=src.batch_size, samples_per_batch=spb, batches_per_epoch=per_epoch, source_kind=kind,
        loader=loader, same_source=same, cores=prof.cores, devices=list(sweeps),
        device_titles={d: devs[d].driver.title for d in sweeps if d in devs},
        simulated=[d for d in sweeps if d in devs and devs[d].simulated],
        real_gpus=[d for d in sweeps if d in devs and devs[d].is_gpu],
        stages=[stages[m] for m in prof.members], copies=copies,
        consumer_samples_per_s={d: spb / s for d, s in step.seconds.items() if s > 0},
        measured_batches={d: len(sw.samples) for d, sw in sweeps.items()}, budget_s=budget_s, seconds=spent,
        torch_threads=sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None, notes=prof.notes)
