"""The one execution engine: dispatches stages and transfers to lanes, records a timeline.

May import: placer.pipeline, placer.devices, placer.executor.*; dask inside functions.

It behaves exactly like the schedule model of ``docs/schedule.md``, which the
optimizer simulates:

* a stage is ready when each of its inputs is at its device's location (``host``
  for the CPU, else the device);
* whenever a lane has a free slot, the ready stage with the lowest priority (its
  index in :meth:`Pipeline.order`) starts there; the CPU lane has ``workers`` slots,
  every accelerator one;
* when a stage finishes, its output is copied at once to every other location
  among its consumers' devices (and to the host if it is a sink on an accelerator),
  once per location, on a link lane; the copy does not occupy any device's slot;
* the run ends when every sink's output is on the host.

Variants differ only in how they submit work to lanes: :class:`InlineLanes` calls
everything in the calling thread (the low-overhead path, exact for chains);
:class:`ThreadLanes` gives the CPU a pool of ``workers`` threads, each accelerator a
thread of its own, and links their own threads, so a CPU stage and a GPU stage run
at the same time.

Lanes whose work runs elsewhere (:class:`~placer.executor.distributed.DaskLanes` runs
it on dask workers) also say how a stage is called and how a value is moved:
``run_stage(stage, device, args, *, workers) -> (output, info)`` and
``transfer(value, target) -> (moved, nbytes, pinned, info)``, where ``info`` gives
the record's ``lane``, ``worker`` and (for stages) ``output_bytes``, and
``wall_start``/``wall_end`` (``time.time()`` where the work ran), which narrow the
recorded span. Other lanes call :func:`~placer.executor.stagecall.call_stage` and
:func:`~placer.executor.transfer.to_location` in the lane's own thread.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from placer.devices import Device
from placer.data.run import StageRecord, TransferRecord
from placer.executor.stagecall import call_stage
from placer.executor.transfer import nbytes, to_location
from placer.pipeline import Pipeline

HOST = "host"


class InlineLanes:
    """Run every task in the calling thread, at once."""

    name = "inline"

    def __init__(self, workers: int = 1):
        self.workers = workers

    def submit(self, lane: str, task: Callable[[], None]) -> None:
        task()

    def lane_name(self, lane: str) -> str:
        return "cpu/0" if lane == "cpu" else lane

    def close(self) -> None:
        pass


class ThreadLanes:
    """A thread pool per lane: ``workers`` threads for the CPU, one per accelerator."""

    name = "threads"

    def __init__(self, workers: int, accelerators: list[str]):
        self.workers = workers
        self._pools = {"cpu": ThreadPoolExecutor(workers, thread_name_prefix="placer-cpu")}
        for a in accelerators:
            self._pools[a] = ThreadPoolExecutor(1, thread_name_prefix=f"placer-{a}")
        self._pools["link"] = ThreadPoolExecutor(max(2, 2 * len(accelerators)), thread_name_prefix="placer-link")

    def submit(self, lane: str, task: Callable[[], None]) -> None:
        self._pools[lane].submit(task)

    def lane_name(self, lane: str) -> str:
        if lane == "cpu":
            name = threading.current_thread().name  # placer-cpu_3
            return "cpu/" + name.rsplit("_", 1)[-1]
        return lane

    def close(self) -> None:
        for p in self._pools.values():
            p.shutdown(wait=True)


class Engine:
    """Runs a pipeline under a resolved placement on the given lanes.

    Everything that does not change between runs (the graph's shape, each stage's
    implementation, lanes and transfer targets) is worked out once here, so that
    :meth:`run` does little more than call the stages.
    """

    def __init__(self, pipeline: Pipeline, devices: dict[str, Device], lanes):
        self.p = pipeline
        self.devices = devices
        self.lanes = lanes
        self.order = pipeline.order()
        self.prio = {n: i for i, n in enumerate(self.order)}
        self.stages = pipeline.stages
        loc = self.loc = {n: d.location for n, d in devices.items()}
        self.loc_device: dict[str, Device] = {HOST: Device(name="cpu", kind="cpu", label="host")}
        for d in devices.values():
            self.loc_device.setdefault(d.location, d)
            if d.kind == "cpu":
                self.loc_device[HOST] = d
        self.sinks = set(pipeline.sinks())
        self.lane_of = {n: ("cpu" if d.kind == "cpu" else d.name) for n, d in devices.items()}
        self.slots0: dict[str, int] = {}
        for lane in self.lane_of.values():
            self.slots0.setdefault(lane, lanes.workers if lane == "cpu" else 1)
        self.missing0: dict[str, int] = {}
        self.waiting: dict[tuple[str, str], list[str]] = {}
        for n in self.order:
            keys = {(src, loc[n]) for src in self.stages[n].inputs.values()}
            self.missing0[n] = len(keys)
            for k in keys:
                self.waiting.setdefault(k, []).append(n)
        self.sources = [n for n in self.order if self.missing0[n] == 0]
        self.targets: dict[str, list[str]] = {}
        for n in self.order:
            t = sorted({loc[c] for c in pipeline.consumers(n)} - {loc[n]})
            if n in self.sinks and loc[n] != HOST and HOST not in t:
                t.append(HOST)
            self.targets[n] = t
        self.arg_keys = {
            n: [(a, (src, loc[n])) for a, src in self.stages[n].inputs.items()] for n in self.order
        }

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> tuple[dict[str, Any], dict[str, Any], list[StageRecord], list[TransferRecord], tuple | None, float]:
        loc, lane_of, prio, waiting = self.loc, self.lane_of, self.prio, self.waiting
        lanes, devices, stages = self.lanes, self.devices, self.stages
        events: queue.SimpleQueue = queue.SimpleQueue()
        avail: dict[tuple[str, str], Any] = {}
        missing = dict(self.missing0)
        slots = dict(self.slots0)
        ready: dict[str, list[tuple[int, str]]] = {lane: [] for lane in slots}
        for n in self.sources:
            heapq.heappush(ready[lane_of[n]], (prio[n], n))
        stage_recs: list[StageRecord] = []
        transfer_recs: list[TransferRecord] = []
        outputs: dict[str, Any] = {}
        final: dict[str, Any] = {}
        inflight = 0
        failure: tuple | None = None
        perf = time.perf_counter
        t_start = perf()
        workers = lanes.workers
        run_stage = getattr(lanes, "run_stage", None)
        move = getattr(lanes, "transfer", None)
        wall0 = time.time() - (perf() - t_start)

        def make_stage_task(n: str, args: dict[str, Any]):
            dev = devices[n]
            st = stages[n]
            lane = lane_of[n]
            if run_stage is not None:
                return _remote_stage_task(run_stage, events, n, st, dev, args, workers, perf, t_start, wall0)

            def task():
                t0 = perf() - t_start
                try:
                    out = call_stage(st, dev, args, workers=workers)
                    events.put(("stage", n, out, t0, perf() - t_start, lanes.lane_name(lane), None))
                except BaseException as exc:  # noqa: BLE001 - reported, then re-raised by execute
                    events.put(("stage", n, None, t0, perf() - t_start, lanes.lane_name(lane), exc))

            return task

        def make_transfer_task(src: str, value: Any, frm: str, to: str):
            target = self.loc_device[to]
            if move is not None:
                return _remote_transfer_task(move, events, (src, frm, to), value, target, perf, t_start, wall0)

            def task():
                t0 = perf() - t_start
                try:
                    moved, nb, pinned = to_location(value, target)
                    events.put(("transfer", (src, frm, to), moved, t0, perf() - t_start, (nb, pinned), None))
                except BaseException as exc:  # noqa: BLE001
                    events.put(("transfer", (src, frm, to), None, t0, perf() - t_start, (0, False), exc))

            return task

        def arrive(key: tuple[str, str], value: Any) -> None:
            avail[key] = value
            for c in waiting.get(key, ()):
                missing[c] -= 1
                if missing[c] == 0:
                    heapq.heappush(ready[lane_of[c]], (prio[c], c))

        while True:
            if failure is None:
                for lane, heap in ready.items():
                    while heap and slots[lane] > 0:
                        _, n = heapq.heappop(heap)
                        slots[lane] -= 1
                        inflight += 1
                        args = {a: avail[k] for a, k in self.arg_keys[n]}
                        lanes.submit(lane, make_stage_task(n, args))
            if inflight == 0:
                break
            kind, key, value, t0, t1, extra, exc = events.get()
            inflight -= 1
            if kind == "stage":
                n = key
                slots[lane_of[n]] += 1
                worker = None
                if type(extra) is dict:  # from lanes that run work elsewhere
                    worker, extra = extra.get("worker"), extra
                if exc is not None:
                    stage_recs.append(StageRecord(
                        name=n, device=devices[n].name, lane=_lane(extra), start_s=t0, end_s=t1,
                        seconds=t1 - t0, output_bytes=0, worker=worker, status="failed",
                        error=_describe(exc)))
                    if failure is None:
                        failure = (n, exc)
                    continue
                stage_recs.append(StageRecord(
                    name=n, device=devices[n].name, lane=_lane(extra), start_s=t0, end_s=t1,
                    seconds=t1 - t0, status="ok", error=None, worker=worker,
                    output_bytes=extra["output_bytes"] if worker is not None else nbytes(value)))
                outputs[n] = value
                here = loc[n]
                if n in self.sinks and here == HOST:
                    final[n] = value
                if failure is None:
                    for to in self.targets[n]:
                        inflight += 1
                        lanes.submit("link", make_transfer_task(n, value, here, to))
                arrive((n, here), value)
            else:
                src, frm, to = key
                nb, pinned = extra
                if exc is not None:
                    if failure is None:
                        failure = (src, exc)
                    continue
                transfer_recs.append(TransferRecord(
                    data=src, src=frm, dst=to, direction=_direction(frm, to), bytes=nb,
                    start_s=t0, end_s=t1, seconds=t1 - t0, pinned=pinned))
                if to == HOST and src in self.sinks:
                    final[src] = value
                arrive((src, to), value)
        makespan = perf() - t_start
        return outputs, final, stage_recs, transfer_recs, failure, makespan


def _lane(extra: Any) -> str:
    return extra.get("lane", "?") if type(extra) is dict else extra


def _span(t0: float, t1: float, info: dict, wall0: float) -> tuple[float, float]:
    """The span the work itself took (``info``'s wall-clock times), kept inside ``[t0, t1]``."""
    if "wall_start" not in info or "wall_end" not in info:
        return t0, t1
    a = min(max(info["wall_start"] - wall0, t0), t1)
    return a, min(max(info["wall_end"] - wall0, a), t1)


def _remote_stage_task(run_stage, events, n, st, dev, args, workers, perf, t_start, wall0):
    """A stage task for lanes with ``run_stage`` (see the module's docstring)."""

    def task():
        t0 = perf() - t_start
        try:
            out, info = run_stage(st, dev, args, workers=workers)
            a, b = _span(t0, perf() - t_start, info, wall0)
            events.put(("stage", n, out, a, b, info, None))
        except BaseException as exc:  # noqa: BLE001 - reported, then re-raised by execute
            info = dict(getattr(exc, "placer_info", None) or {})
            info.setdefault("lane", dev.name if dev.kind != "cpu" else "cpu")
            events.put(("stage", n, None, t0, perf() - t_start, info, exc))

    return task


def _remote_transfer_task(move, events, key, value, target, perf, t_start, wall0):
    """A copy task for lanes with ``transfer`` (see the module's docstring)."""

    def task():
        t0 = perf() - t_start
        try:
            moved, nb, pinned, info = move(value, target)
            a, b = _span(t0, perf() - t_start, info, wall0)
            events.put(("transfer", key, moved, a, b, (nb, pinned), None))
        except BaseException as exc:  # noqa: BLE001
            events.put(("transfer", key, None, t0, perf() - t_start, (0, False), exc))

    return task


def _direction(frm: str, to: str) -> str:
    if frm == HOST:
        return "h2d"
    if to == HOST:
        return "d2h"
    return "d2d"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
