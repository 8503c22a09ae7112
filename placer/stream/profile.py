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

import math
import os
import statistics
import sys
import threading
import time
from typing import Any

import networkx as nx

from placer.data.stream import GIL_SPEEDUP, CopyProfile, LoaderSettings, ScalingRow, StreamStageProfile, StreamProfile
from placer.devices import Device, Inventory, discover, same_device
from placer.errors import PlacerError
from placer.log import get_logger
from placer.profile.transfers import value_copies
from placer.timing import Clock, Deadline, Measurement, Timings, settle, torch_threads
from placer.executor.transfer import nbytes, to_location
from placer.pipeline import BATCH_INFO, Pipeline, Stage
from placer.executor.stream.config import StreamConfig
from placer.executor.stream.nodes import Bundle, Node, batch_len, takes
from placer.executor.stream.runner import StreamRun
from placer.executor.stream.source import call_source, describe_source, loader_for, workers_key

log = get_logger(__name__)

#: batches measured per device sweep (the first pays for warm-up and is not used)
DEFAULT_BATCHES = 16
#: a sweep whose members' in-turn seconds scatter reads on, up to this many times its batches (within its
#: budget), until the standard error of their summed mean is within IN_TURN_ERROR of it
MORE_BATCHES = 3
IN_TURN_ERROR = 0.04
#: thread counts tried for CPU stages (up to the cores' double, at least four)
THREADS = (1, 2, 4, 8)
#: further rounds of one and two workers in turn, after the counts' sweep (see :func:`_scaling`)
PAIR_ROUNDS = 2
#: the step's last batches kept for re-running it (GIL probe, torch threads)
STEP_KEPT = 3
#: seconds each CPU batch stage is timed for on a cluster's worker, and again here (after a warm-up call)
CLUSTER_TIMING_S = 0.5
#: batches of the CPU sweep a stage is timed on, on a cluster's worker
CLUSTER_BATCHES = 4
#: seconds the timing task of one stage may take on the cluster before it is cancelled
CLUSTER_TIMEOUT_S = 60.0
#: a leading batch this many times the median in a sweep is warm-up (left out of the mean in turn)
WARM_UP = 1.5
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
HOST_DEVICE = Device(name="cpu", kind="cpu", label="host")


def one_shot_inputs(pipeline: Pipeline, source: str, inventory: Inventory) -> dict[str, Any]:
    """The outputs (on the host) of the one-shot stages a stream reads, computed once."""
    from placer.executor import execute

    members = set(pipeline.streams()[source])
    need: set[str] = set()
    for m in members:
        need |= {a for a in nx.ancestors(pipeline.graph, m) if a not in members}
    if not need:
        return {}
    sub = Pipeline(pipeline.name, size=pipeline.size, size_unit=pipeline.size_unit)
    for n in pipeline.order():
        if n in need:
            sub.add(pipeline.stages[n])
    accel = [d.name for d in inventory.devices if d.is_accelerator]
    placement = {n: _runnable(pipeline, n, ["cpu", *accel]) for n in need}
    run = execute(sub, placement, inventory=inventory)
    return {n: to_location(run.outputs[n], HOST_DEVICE)[0] for n in need}


def _runnable(pipeline: Pipeline, name: str, prefer: list[str]) -> str:
    """The first device of ``prefer`` the stage may run on (its pin wins)."""
    st = pipeline.stages[name]
    if st.pin is not None:
        return st.pin
    for d in prefer:
        if st.impl_for("cpu" if d == "cpu" else "gpu") is not None:
            return d
    return prefer[0]


def can_run(pipeline: Pipeline, name: str, device: str) -> bool:
    """Whether a member may be placed on ``device``: an implementation for it, and no pin elsewhere."""
    st = pipeline.stages[name]
    if st.role == "source":
        return device == "cpu"
    if st.pin is not None and not same_device(st.pin.strip().lower(), device):
        return False
    return st.impl_for("cpu" if device == "cpu" else "gpu") is not None


class _Sweep:
    """One device sweep: the stream run sequentially, every node and copy timed per batch."""

    def __init__(self, prof: _Profiler, device: str, placement: dict[str, str]):
        self.prof, self.device, self.placement = prof, device, placement
        inv = prof.inventory
        self.devices = {m: inv.resolve(d, stage=m) for m, d in placement.items()}
        cfg = StreamConfig(workers=0, max_batches=MORE_BATCHES * prof.batches)
        self.run = StreamRun(prof.pipeline, prof.source, self.devices, prof.consts, cfg)
        #: every member's wall and CPU seconds, batch by batch
        self.timings = Timings()
        self.inputs: dict[str, list[Bundle]] = {}
        self.samples: list[int] = []

    def go(self, budget_s: float | None) -> int:
        run, deadline = self.run, Deadline(budget_s)
        run.step.start()
        it = run.bundles()
        done = 0
        while True:
            with Clock() as c:
                b = next(it, None)
            if b is None:
                break
            self._source_read(run.nodes[0].name, b, c)
            value = b.values[self.prof.source]["host"]
            self.prof.observe(self.prof.source, "host", value, done)
            for node in run.nodes[1:]:
                if node.kind == "step":  # samples as the runner counts them: the step's first per-batch input
                    src = next(iter(node.reads.values()))
                    self.samples.append(batch_len(b.values[src][node.location]))
                self._one(node, b, done)
            done += 1
            if done >= 2 and deadline.passed():
                break
            if done >= self.prof.batches and self.settled():
                break
        return done

    def settled(self) -> bool:
        """Whether the batches so far tell the members' in-turn mean closely enough: the standard error of
        their summed mean (:func:`in_turn_mean`'s batches) within :data:`IN_TURN_ERROR` of it. A step whose
        threads meet spinning ones runs some batches several times slower than the rest (on 2 cores an
        audio step took 12-30 ms, and about 100 ms in 2 to 5 of 15), and how many fell in a short sweep
        moved the prediction of one batch at a time by 30 %; such a sweep reads on, up to
        :data:`MORE_BATCHES` times its batches, within its budget."""
        means, var = 0.0, 0.0
        for m in self.timings.keys():
            if not isinstance(m, str) or m not in self.prof.members:
                continue
            xs = in_turn_batches(self.timings.wall(m).raw_times)
            if len(xs) < 3:
                return False
            means += statistics.fmean(xs)
            var += statistics.variance(xs) / len(xs)
        return means <= 0 or var ** 0.5 <= IN_TURN_ERROR * means

    def _source_read(self, name: str, b: Bundle, c: Clock) -> None:
        """Time one batch's read from the source, as one batch's.

        The runner reads one batch ahead (to know an epoch's last batch): an epoch's first read
        calls the source and reads two batches, its last read only finds the end. Timed as read,
        an epoch of three batches would give one batch in three about nothing, and a lower
        quartile that reading; so the first read counts as two batches of half its time (the
        stream's very first is the warm-up, left out whole), and a last read after others is
        left out (its batch was read with the one before).
        """
        info = b.info
        if b.last_of_epoch and info.index > 0:
            return
        if info.index == 0 and info.seq > 0 and not b.last_of_epoch:
            for _ in range(2):
                self.timings.add_seconds(name, c.wall / 2, c.cpu / 2 if c.cpu is not None else None)
            return
        self.timings.add(name, c)

    def _one(self, node: Node, b: Bundle, index: int) -> None:
        if (node.kind == "batch" and node.device.kind == "cpu") or node.kind == "step":
            kept = self.inputs.setdefault(node.name, [])
            kept.append(Bundle(b.seq, b.info, {k: dict(v) for k, v in b.values.items()}))
            if len(kept) > (STEP_KEPT if node.kind == "step" else self.prof.batches):  # a longer sweep keeps
                kept.pop(0)  # as many as a sweep of its batches
        with Clock() as c:
            self.run.work(node, b)
        if node.kind == "copy":
            return
        self.timings.add(node.name, c)
        if node.kind == "batch":
            self.prof.observe(node.name, node.location, b.values[node.name][node.location], index)


def steady(m: Measurement) -> float:
    """Seconds per batch: the lower quartile after the first batch (warm-up); noise only adds time."""
    log.debug("%s: lower quartile %.4g s, spread (IQR) %.2g s%s", m.label, m.lower_quartile_s, m.iqr_s,
              " (noisy)" if m.noisy else "")
    return m.lower_quartile_s


class _Profiler:
    """The state of one stream's profile: devices, sweeps, copies measured."""

    def __init__(self, pipeline: Pipeline, source: str, inventory: Inventory, consts: dict[str, Any],
                 batches: int, max_threads: int | None):
        self.pipeline, self.source, self.inventory, self.consts = pipeline, source, inventory, consts
        self.batches = batches
        self.members = pipeline.streams()[source]
        self.cores = os.cpu_count() or 1
        self.max_threads = max_threads or max(4, min(8, 2 * self.cores))
        self.accel = [d for d in inventory.devices if d.is_accelerator]
        #: (value, from, to) → way of copying → seconds, copy by copy (CPU seconds for the executor's copy)
        self.copies: dict[tuple[str, str, str], Timings] = {}
        self.copy_bytes: dict[tuple[str, str, str], int] = {}
        self.out_bytes: dict[str, dict[str, int]] = {}
        self.notes: list[str] = []

    def observe(self, value_of: str, loc: str, value: Any, index: int) -> None:
        """Record a per-batch value's bytes, and time copying it to every other location."""
        self.out_bytes.setdefault(value_of, {})[loc] = nbytes(value)
        if not self._read_later(value_of) or index >= max(3, self.batches // 2):
            return
        targets = self.accel if loc == "host" else [HOST_DEVICE]
        for dev in targets:
            if dev.location == loc:
                continue
            key = (value_of, loc, dev.location)
            timings = self.copies.setdefault(key, Timings())
            with Clock() as c:
                to_location(value, dev)
                dev.synchronize()
            timings.add("executor", c)
            self.copy_bytes[key] = nbytes(value)
            if loc == "host" and dev.is_gpu:
                for mode, m in value_copies(value, dev).items():
                    timings.add_seconds(mode, m.median_s)

    def _read_later(self, name: str) -> bool:
        return any(name in self.pipeline.stages[m].inputs.values() for m in self.members)


def thread_scaling(node: Node, inputs: list[Bundle], *, max_threads: int, budget_s: float | None,
                   kind: str = "thread") -> list[ScalingRow]:
    """Batches per second of ``node`` on 1, 2, 4, ... threads at once, over the batches it saw.

    Each count runs for a slice of the budget (at least six batches' time of one
    worker); counts stop rising once doubling the threads adds under 10 %. One worker
    runs first and again after the others, and one and two in turn (:func:`_scaling`); the
    fastest reading of one worker is the base of the speed-ups.
    """
    counts = [n for n in THREADS if n <= max_threads]
    return _scaling([node.process] * counts[-1], inputs, counts, budget_s, kind)


def _scaling(calls: list, inputs: list[Bundle], counts: list[int], budget_s: float | None,
             kind: str) -> list[ScalingRow]:
    """Rows of batches per second with the first ``n`` of ``calls`` running at once, ``n`` in ``counts``.

    Each count's rate is the fastest of its readings (noise only slows). One worker runs again after
    the others, and one and two workers :data:`PAIR_ROUNDS` more times in turn: the two decide whether
    a stage holds the GIL (:data:`~placer.data.stream.GIL_SPEEDUP`), and a reading of one worker slowed
    by load that came and went would read a pure-Python stage 1.32x faster at two.
    """
    one = _rate(calls[:1], inputs, 0.05)
    per = max(6.0 / one if one else 0.05, 0.05)
    if budget_s is not None:
        per = min(per, max(0.05, budget_s / (len(counts) + 1 + 2 * PAIR_ROUNDS)))
    best: dict[int, float] = {}
    for prev, n in zip([None, *counts], counts):
        best[n] = _rate(calls[:n], inputs, per)
        if prev is not None and best[n] < 1.1 * best[prev]:  # doubling the workers added under 10 %
            break
    again = [1, *[n for r in range(PAIR_ROUNDS) for n in ((2, 1) if r % 2 == 0 else (1, 2))]] if 2 in best else [1]
    for n in again:
        best[n] = max(best[n], _rate(calls[:n], inputs, per))
    base = best[1]
    return [ScalingRow(kind=kind, workers=n, batches_per_s=rate, speedup=rate / base if base else 0.0)
            for n, rate in best.items()]


def process_scaling(node: Node, inputs: list[Bundle], *, count: int, budget_s: float | None) -> list[ScalingRow]:
    """Batches per second of ``node`` run by 1 .. ``count`` worker processes (the stream's own
    :class:`~placer.executor.stream.workers.ProcessPool`), each called from a thread of its own as the runner
    does: the rates include moving every batch to a child and back."""
    from placer.executor.stream.workers import ProcessPool, StageCall

    stop = threading.Event()
    pool = ProcessPool(node.name, StageCall(node.stage, node.device, node.consts, node.takes_info), count, stop)
    budget = Deadline(budget_s)
    pool.start()
    try:
        left = None if budget_s is None else max(0.1, budget.left())

        def caller(child):
            def call(b: Bundle):
                return child.call({a: b.values[src][node.location] for a, src in node.reads.items()}, b.info,
                                  stop)[0]
            return call

        counts = sorted({1, *[n for n in THREADS if n < count], count})
        return _scaling([caller(c) for c in pool.children], inputs, counts, left, "process")
    finally:
        pool.close()


def _rate(calls: list, inputs: list[Bundle], seconds: float) -> float:
    """Batches per second of one thread per callable of ``calls``, each calling it on ``inputs`` for
    about ``seconds``."""
    threads = len(calls)
    done = [0] * threads
    start = threading.Barrier(threads + 1)
    deadline: list[Deadline] = []

    def loop(i: int) -> None:
        start.wait()
        k = i
        while not deadline[0].passed() or done[i] == 0:
            calls[i](inputs[k % len(inputs)])
            done[i] += 1
            k += threads

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    deadline.append(Deadline(seconds))
    start.wait()
    for w in workers:
        w.join()
    elapsed = deadline[0].spent()
    return sum(done) / elapsed if elapsed > 0 else 0.0


class _SideThread:
    """A daemon thread running :meth:`_loop` (until ``running`` is cleared) for a ``with`` block."""

    def __init__(self, name: str):
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True, name=name)

    def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.running = False
        self.thread.join()


class _Probe(_SideThread):
    """A thread counting in pure Python: how little it counts while another call runs shows how much
    of that call's time the call held the GIL."""

    def __init__(self):
        self.count = 0
        super().__init__("placer-gil-probe")

    def _loop(self) -> None:
        while self.running:
            self.count += 1


#: least time the probe runs alone after each call: a call of microseconds (a tiny step) would
#: otherwise leave the probe no time slice on a loaded machine, and no rate to compare with
_PROBE_ALONE_S = 0.002


def gil_held(call, inputs: list, *, rounds: int = 1) -> float | None:
    """Seconds per call that ``call`` held the GIL, on each of ``inputs`` ``rounds`` times, as
    :class:`_Probe` saw it: after each call the probe runs alone for as long as the call took, so
    that on a machine whose cores other work shares, the probe's rate alone is measured under the
    same load as beside the calls. None when the probe did not run."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # the probe and the call take turns finely
    during = alone = counted = counted_alone = 0.0
    n = 0
    try:
        with _Probe() as probe:
            for _ in range(rounds):
                for x in inputs:
                    c = probe.count
                    with Clock(cpu_clock=None) as beside:
                        call(x)
                    counted += probe.count - c
                    during += beside.wall
                    c = probe.count
                    with Clock(cpu_clock=None) as rest:  # long enough for a busy scheduler to run the probe
                        time.sleep(max(beside.wall, _PROBE_ALONE_S))
                    counted_alone += probe.count - c
                    alone += rest.wall
                    n += 1
    finally:
        sys.setswitchinterval(interval)
    if counted_alone <= 0 or alone <= 0 or n == 0:
        return None
    rate_alone = counted_alone / alone
    return max(0.0, 1.0 - counted / (rate_alone * during)) * during / n


def _placements(pipeline: Pipeline, members: list[str], devices: list[str]) -> dict[str, dict[str, str]]:
    """A sweep's placement per device: each member on that device when it can run there."""
    out = {}
    for d in devices:
        place = {m: (d if can_run(pipeline, m, d) else _runnable(pipeline, m, ["cpu", *devices]))
                 for m in members}
        if d == "cpu" or any(v == d for v in place.values()):
            out[d] = place
    return out


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
    prof = _Profiler(p, source, inv, consts, max(1, batches), max_threads)
    names = devices or ["cpu", *[d.name for d in prof.accel]]
    places = _placements(p, prof.members, names)
    sweep_budget = None if budget_s is None else 0.6 * budget_s / len(places)
    sweeps = {}
    for d, place in places.items():
        settle()  # threads still spinning from earlier work would count as the stages' CPU seconds
        sweeps[d] = _Sweep(prof, d, place)
        sweeps[d].go(sweep_budget)
    stages = _stages(prof, sweeps)

    def left(share: float = 1.0) -> float | None:
        return None if budget_s is None else share * budget.left()

    cpu = sweeps.get("cpu")
    _scale(prof, cpu, stages, left(0.5))
    floor = PROCESS_MIN_S if budget_s is None or budget_s >= 4 * PROCESS_MIN_S else 0.0
    _scale_processes(prof, cpu, stages, None if budget_s is None else max(floor, left(0.7)))
    _step_extras(prof, cpu, stages[prof.members[-1]])
    _in_a_worker(prof, stages[prof.source], left())
    _in_threads(prof, stages[prof.source], left())
    _source_beside_busy(prof, stages[prof.source], left())
    _source_gil(prof, stages[prof.source], left())
    if cluster is not None:
        _time_on_cluster(prof, cpu, stages, cluster)
    return _assemble(prof, sweeps, stages, budget_s, budget.spent())


def _stages(prof: _Profiler, sweeps: dict[str, _Sweep]) -> dict[str, StreamStageProfile]:
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


def in_turn_batches(seconds: list[float]) -> list[float]:
    """A member's seconds per batch in turn without its leading warm-up (:func:`in_turn_mean`)."""
    med = statistics.median(seconds)
    k = 0
    while k < len(seconds) - 1 and seconds[k] > WARM_UP * med:
        k += 1
    return seconds[k:]


def in_turn_mean(seconds: list[float]) -> float:
    """The mean of a member's seconds per batch in turn, its leading warm-up left out: the batches at
    the start slower than :data:`WARM_UP` times the median (the whole run pays them once, while a
    sweep of a few batches spreads them over each: a step's first calls of 1.9 and 1.4 ms against
    0.7 ms after lifted the mean of 7 batches by 40 %). Slow batches later on stay in.

    >>> round(in_turn_mean([1.9, 1.4, 0.8, 0.7, 0.7, 0.7, 0.6]), 2)
    0.7
    >>> in_turn_mean([1.0, 3.0, 1.0, 3.0])
    2.0
    """
    kept = in_turn_batches(seconds)
    return sum(kept) / len(kept)


def _scale(prof: _Profiler, sweep: _Sweep | None, stages: dict[str, StreamStageProfile], budget_s: float | None) -> None:
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


def _scale_processes(prof: _Profiler, sweep: _Sweep | None, stages: dict[str, StreamStageProfile],
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


def _time_on_cluster(prof: _Profiler, sweep: _Sweep | None, stages: dict[str, StreamStageProfile], client: Any) -> None:
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


def _step_extras(prof: _Profiler, sweep: _Sweep | None, step: StreamStageProfile) -> None:
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
        for n, r in _busy_ratios(torch, call, kept, sorted(alone)).items():
            step.busy_seconds[n] = alone[n] * r
    with torch_threads(1 if torch is not None else None):
        held = gil_held(call, kept)
    if held is not None and step.seconds["cpu"] > 0:
        step.gil = min(1.0, held / step.seconds["cpu"])


def _in_a_worker(prof: _Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
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


def _in_workers(prof: _Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
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


def _time_source(prof: _Profiler, config: StreamConfig, budget_s: float | None, skip: int, failed: str,
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


def _source_read(prof: _Profiler) -> tuple[Stage, Any] | None:
    """The source stage and what it returns for epoch 0, where that is a Dataset or DataLoader (else None)."""
    src = prof.pipeline.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    obj = call_source(src, consts, 0)
    return None if describe_source(obj) == "iterable" else (src, obj)


def _in_threads(prof: _Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
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


def _source_batches(prof: _Profiler) -> Any:
    """The source's first epoch read in this process (no workers), its first batch read (that starts the
    iterator: a file, a generator); None when the epoch is empty."""
    src = prof.pipeline.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    obj = call_source(src, consts, 0)
    if describe_source(obj) != "iterable":
        obj = loader_for(src, obj, StreamConfig(workers=0))
    it = iter(obj)
    return None if next(it, None) is None else it


def _source_beside_busy(prof: _Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
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
        with _Busy() as busy:
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


def _source_gil(prof: _Profiler, st: StreamStageProfile, budget_s: float | None) -> None:
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


class _Busy(_SideThread):
    """A thread that keeps one core busy (numpy, the GIL released) while ``work`` is set: the share
    of the cores a stream's worker takes from the step."""

    def __init__(self):
        import numpy as np

        self.data = np.random.default_rng(0).random(1 << 17)
        self.work = threading.Event()
        super().__init__("placer-busy-core")

    def _loop(self) -> None:
        import numpy as np

        out = np.empty_like(self.data)
        while self.running:
            if not self.work.wait(0.05):
                continue
            np.multiply(self.data, self.data, out=out)
            np.sqrt(out, out=out)


def _busy_ratios(torch: Any, call, kept: list[Bundle], counts: list[int], batches: int = 4) -> dict[int, float]:
    """Per intra-op thread count: the step's wall seconds beside one busy core over its seconds alone
    (medians over up to ``batches`` batches, each timed alone and beside it in turn)."""
    import statistics

    ratios: dict[int, list[float]] = {n: [] for n in counts}
    with _Busy() as busy:
        for b in kept[-batches:]:
            for n in counts:
                with torch_threads(n if torch is not None else None):
                    with Clock(cpu_clock=None) as alone:
                        call(b)
                    busy.work.set()
                    time.sleep(0.001)  # the busy thread is running before the call starts
                    with Clock(cpu_clock=None) as beside:
                        call(b)
                    busy.work.clear()
                if alone.wall > 0:
                    ratios[n].append(beside.wall / alone.wall)
    return {n: max(1.0, statistics.median(rs)) for n, rs in ratios.items() if rs}


def _assemble(prof: _Profiler, sweeps: dict[str, _Sweep], stages: dict[str, StreamStageProfile],
              budget_s: float | None, spent: float) -> StreamProfile:
    p = prof.pipeline
    src = p.stages[prof.source]
    step = stages[prof.members[-1]]
    first = next(iter(sweeps.values()))
    spb = sum(first.samples) / len(first.samples) if first.samples else 1.0
    kind, loader, per_epoch, obj = _source_facts(prof, spb)
    key = workers_key(obj) if src.epochs > 1 else None
    same = key is not None and workers_key(_called_again(prof)) == key
    stages[prof.source].cached_read_s = _cached_read(prof, obj, kind, loader)
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


def _source_facts(prof: _Profiler, spb: float) -> tuple[str, LoaderSettings | None, int | None, Any]:
    """What the source returns, a DataLoader's own settings, the batches of one epoch, and the
    source's first epoch's object."""
    p = prof.pipeline
    src = p.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    obj = call_source(src, consts, 0)
    kind = describe_source(obj)
    loader = None
    if kind == "loader":
        loader = LoaderSettings.of(obj).model_copy(update={"batch_size": obj.batch_size})
    per_epoch = None
    if kind == "dataset":
        per_epoch = math.ceil(len(obj) / (src.batch_size or 1))
    elif hasattr(obj, "__len__"):
        per_epoch = len(obj)
    else:
        per_epoch = _count(obj)
    if per_epoch is None and p.size and src.batch_size:
        per_epoch = math.ceil(p.size / src.batch_size)
        prof.notes.append(f"batches per epoch taken from the size: {p.size} / {src.batch_size}")
    return kind, loader, per_epoch, obj


def _called_again(prof: _Profiler) -> Any:
    """What the source function returns for the second epoch (None when calling it fails)."""
    src = prof.pipeline.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    try:
        return call_source(src, consts, 1)
    except Exception:  # noqa: BLE001 - the run calls it again and names what fails
        return None


#: reads of one batch's samples from a by-sample cache timed (the least kept)
CACHED_READS = 3


def _cached_read(prof: _Profiler, obj: Any, kind: str, loader: LoaderSettings | None) -> float | None:
    """Seconds to read one batch's samples back from a cache kept by sample, for a source that
    reshuffles (takes ``batch_info``) and returns a Dataset or DataLoader; None where such a cache
    would not serve (with a note where the reason is the dataset's).

    Its items must be kept by the keys its sampler draws: the keys of the second epoch must be
    keys of the first (a sampler that draws ``(index, epoch)`` would never read a kept item back),
    and the item of a key read twice the same (the first and last keys, compared element by element;
    a random draw per read cannot be kept). The first batch's items are then kept in a
    :class:`~placer.executor.stream.store.SampleStore` (as a cache at the source keeps them) and
    read back and collated (the DataLoader's own ``collate_fn``) :data:`CACHED_READS` times: what
    each epoch after the first costs there. A probe that fails leaves the source uncached.
    """
    src = prof.pipeline.stages[prof.source]
    if kind == "iterable" or src.cache_key is not None or not takes(src.impl_for("cpu").fn, BATCH_INFO):
        return None
    try:
        return _time_cached_read(prof, src, obj, kind, loader)
    except Exception as exc:  # noqa: BLE001 - a probe of the user's dataset must not fail the profile
        prof.notes.append(f"source {prof.source!r}: its samples could not be probed for a cache by sample "
                          f"({type(exc).__name__}: {exc}); not cached")
        return None


def _sample_keys(obj: Any, kind: str) -> tuple[Any, list] | None:
    """The dataset a Dataset or DataLoader source reads and the keys it reads in one epoch, in order."""
    if kind == "loader":
        ds = obj.dataset
        if getattr(obj, "batch_sampler", None) is not None:
            return ds, [k for batch in obj.batch_sampler for k in batch]
        return ds, list(obj.sampler)
    return obj, list(range(len(obj)))


def _time_cached_read(prof: _Profiler, src: Any, obj: Any, kind: str, loader: LoaderSettings | None) -> float | None:
    from placer.executor.stream.store import SampleStore
    from placer.stream.dataset_cache import equal

    found = _sample_keys(obj, kind)
    if found is None or not found[1]:
        return None
    ds, keys = found
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    again = _sample_keys(call_source(src, consts, 1), kind)
    seen = {repr(k) for k in keys}
    if again is None or any(repr(k) not in seen for k in again[1]):
        prof.notes.append(f"source {prof.source!r}: its second epoch reads samples its first did not (keys such "
                          f"as {again[1][0]!r} if any): a cache by sample would not be read back; not cached"
                          if again is not None and again[1] else
                          f"source {prof.source!r}: its epochs' samples could not be listed; not cached")
        return None
    for k in (keys[0], keys[-1]):
        if not equal(ds[k], ds[k]):
            prof.notes.append(f"source {prof.source!r}: its item {k!r} read twice differs (random per read): "
                              "its samples cannot be cached by index")
            return None
    collate = getattr(obj, "collate_fn", None) if kind == "loader" else None
    size = (loader.batch_size if loader is not None and loader.batch_size else src.batch_size) or 1
    first = keys[: int(size)]
    store = SampleStore(1 << 40)
    try:
        for k in first:
            store.put(("__getitem__", k), ds[k])
        best = float("inf")
        for _ in range(CACHED_READS):
            with Clock() as c:
                (collate or sys.modules["torch.utils.data"].default_collate)(
                    [store.get(("__getitem__", k))[1] for k in first])
            best = min(best, c.wall)
        return best
    finally:
        store.close()


def _count(obj: Any, limit_s: float = 1.0) -> int | None:
    """Batches of an iterable, counted within ``limit_s`` (None when it takes longer)."""
    deadline = Deadline(limit_s)
    n = 0
    for _ in obj:
        n += 1
        if deadline.passed():
            return None
    return n

