"""The one execution engine: dispatches stages and transfers to lanes, records a timeline.

May import: placer.pipeline, placer.devices, placer.schedule, placer.executor.*; dask
inside functions.

It follows the schedule model of ``docs/schedule.md``, which the optimizer
simulates, and takes the dispatch rule from :mod:`placer.schedule` as the simulator
does:

* a stage is ready when each of its inputs is at its device's location (``host``
  for the CPU, else the device);
* whenever a lane has a free slot, the ready stage with the lowest priority (its
  index in :func:`~placer.schedule.dispatch_order`, the same as
  :meth:`Pipeline.order`) starts there; the CPU lane has ``workers`` slots, every
  accelerator one;
* every event already in (completions and arrived copies) is handled before the
  next dispatch;
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
from placer.schedule import ReadyQueues, copy_targets, dispatch_order

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
        self.stages = pipeline.stages
        self.order = dispatch_order(list(self.stages), {n: st.inputs.values() for n, st in self.stages.items()})
        self.prio = {n: i for i, n in enumerate(self.order)}
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
        self.targets = {
            n: copy_targets(loc[n], (loc[c] for c in pipeline.consumers(n)), sink=n in self.sinks, home=HOST)
            for n in self.order
        }
        self.arg_keys = {
            n: [(a, (src, loc[n])) for a, src in self.stages[n].inputs.items()] for n in self.order
        }

    def run(self) -> tuple[dict[str, Any], dict[str, Any], list[StageRecord], list[TransferRecord], tuple | None, float]:
        """Run once: ``(outputs, final outputs, stage records, transfer records, failure, makespan)``.

        ``failure`` is ``(stage, exception)`` for the first stage or copy that raised
        (nothing more is dispatched after it), else None.
        """
        return _Run(self).loop()


class _Run:
    """One run of an :class:`Engine`: its queues, values and records."""

    def __init__(self, engine: Engine):
        self.e = engine
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.avail: dict[tuple[str, str], Any] = {}
        self.missing = dict(engine.missing0)
        self.queues = ReadyQueues(engine.slots0)
        for n in engine.sources:
            self.queues.push(n, engine.lane_of[n], engine.prio[n])
        self.stage_recs: list[StageRecord] = []
        self.transfer_recs: list[TransferRecord] = []
        self.outputs: dict[str, Any] = {}
        self.final: dict[str, Any] = {}
        self.inflight = 0
        self.failure: tuple | None = None
        self.perf = time.perf_counter
        self.t_start = self.perf()
        self.wall0 = time.time() - (self.perf() - self.t_start)
        self.run_stage = getattr(engine.lanes, "run_stage", None)
        self.move = getattr(engine.lanes, "transfer", None)

    def loop(self):
        """Dispatch, take every event that has come in, repeat until nothing is in flight."""
        e, events = self.e, self.events
        lanes, arg_keys, avail = e.lanes, e.arg_keys, self.avail
        while True:
            if self.failure is None:
                for lane, n in self.queues.pop_startable():
                    self.inflight += 1
                    lanes.submit(lane, self.stage_task(n, {a: avail[k] for a, k in arg_keys[n]}))
            if self.inflight == 0:
                break
            self.handle(events.get())
            while not events.empty():  # every event already in is handled before the next dispatch
                self.handle(events.get())
        makespan = self.perf() - self.t_start
        return self.outputs, self.final, self.stage_recs, self.transfer_recs, self.failure, makespan

    # -- tasks ------------------------------------------------------------------------------
    def stage_task(self, n: str, args: dict[str, Any]):
        """The task that runs stage ``n`` on its lane and reports to the event queue."""
        e, events, perf, t_start = self.e, self.events, self.perf, self.t_start
        dev, st, lane, lanes = e.devices[n], e.stages[n], e.lane_of[n], e.lanes
        workers = lanes.workers
        run_stage = self.run_stage
        if run_stage is not None:
            return _remote_stage_task(run_stage, events, n, st, dev, args, workers, perf, t_start, self.wall0)

        def task():
            t0 = perf() - t_start
            try:
                out = call_stage(st, dev, args, workers=workers)
                events.put(("stage", n, out, t0, perf() - t_start, lanes.lane_name(lane), None))
            except BaseException as exc:  # noqa: BLE001 - reported, then re-raised by execute
                events.put(("stage", n, None, t0, perf() - t_start, lanes.lane_name(lane), exc))

        return task

    def transfer_task(self, src: str, value: Any, frm: str, to: str):
        """The task that copies ``src``'s output from location ``frm`` to ``to``."""
        events, perf, t_start = self.events, self.perf, self.t_start
        target = self.e.loc_device[to]
        move = self.move
        if move is not None:
            return _remote_transfer_task(move, events, (src, frm, to), value, target, perf, t_start, self.wall0)

        def task():
            t0 = perf() - t_start
            try:
                moved, nb, pinned = to_location(value, target)
                events.put(("transfer", (src, frm, to), moved, t0, perf() - t_start, (nb, pinned), None))
            except BaseException as exc:  # noqa: BLE001
                events.put(("transfer", (src, frm, to), None, t0, perf() - t_start, (0, False), exc))

        return task

    # -- events -------------------------------------------------------------------------------
    def handle(self, event: tuple) -> None:
        """One event: a stage or a copy ended."""
        kind, key, value, t0, t1, extra, exc = event
        self.inflight -= 1
        if kind == "stage":
            self.stage_done(key, value, t0, t1, extra, exc)
        else:
            self.transfer_done(key, value, t0, t1, extra, exc)

    def stage_done(self, n: str, value: Any, t0: float, t1: float, extra: Any, exc: BaseException | None) -> None:
        e = self.e
        self.queues.release(e.lane_of[n])
        worker = None
        if type(extra) is dict:  # from lanes that run work elsewhere
            worker = extra.get("worker")
        if exc is not None:
            self.stage_recs.append(StageRecord(
                name=n, device=e.devices[n].name, lane=_lane(extra), start_s=t0, end_s=t1,
                seconds=t1 - t0, output_bytes=0, worker=worker, status="failed",
                error=_describe(exc)))
            if self.failure is None:
                self.failure = (n, exc)
            return
        self.stage_recs.append(StageRecord(
            name=n, device=e.devices[n].name, lane=_lane(extra), start_s=t0, end_s=t1,
            seconds=t1 - t0, status="ok", error=None, worker=worker,
            output_bytes=extra["output_bytes"] if worker is not None else nbytes(value)))
        self.outputs[n] = value
        here = e.loc[n]
        if n in e.sinks and here == HOST:
            self.final[n] = value
        if self.failure is None:
            for to in e.targets[n]:
                self.inflight += 1
                e.lanes.submit("link", self.transfer_task(n, value, here, to))
        self.arrive((n, here), value)

    def transfer_done(self, key: tuple, value: Any, t0: float, t1: float, extra: Any,
                      exc: BaseException | None) -> None:
        src, frm, to = key
        nb, pinned = extra
        if exc is not None:
            if self.failure is None:
                self.failure = (src, exc)
            return
        self.transfer_recs.append(TransferRecord(
            data=src, src=frm, dst=to, direction=_direction(frm, to), bytes=nb,
            start_s=t0, end_s=t1, seconds=t1 - t0, pinned=pinned))
        if to == HOST and src in self.e.sinks:
            self.final[src] = value
        self.arrive((src, to), value)

    def arrive(self, key: tuple[str, str], value: Any) -> None:
        """``key`` = (stage, location) is there: its consumers there may become ready."""
        e, missing = self.e, self.missing
        self.avail[key] = value
        for c in e.waiting.get(key, ()):
            missing[c] -= 1
            if missing[c] == 0:
                self.queues.push(c, e.lane_of[c], e.prio[c])


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
