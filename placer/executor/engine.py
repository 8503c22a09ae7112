"""The one execution engine: dispatches stages and transfers to lanes, records a timeline.

May import: placer.pipeline, placer.devices, placer.schedule, placer.data.run, placer.executor.*; dask
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

Stopping. With ``timeout_s``, a stage that runs longer fails with
:class:`~placer.executor.stagecall.StageTimeoutError` and its thread is stopped
(:func:`~placer.executor.stagecall.stop_thread`); stages already running finish,
nothing new starts, and the outputs of finished stages are kept. The engine's own
thread never runs a stage that has a time limit (the inline lane then runs its tasks
in a helper thread, :meth:`InlineLanes.bound`), so a stage stuck in one call Python
cannot interrupt is abandoned after
:data:`~placer.executor.stagecall.STOP_WAIT_S` and the run ends all the same. When the thread
running the engine is interrupted (``KeyboardInterrupt``, or the CLI's Ctrl-C
handler after :func:`interrupt`), the stages running on every lane are stopped and
abandoned at once, and the same exception is raised again carrying
``running`` (the stages that were running), ``outputs`` and ``placer_partial`` (what
:class:`~placer.executor.Prepared` turns into the partial run record). Lane threads
are daemon threads, so a stopped stage stuck in a long C call never holds the
process's exit up.

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

import contextlib
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from placer.devices import HOST, Device, host_device
from placer.data.run import StageRecord, TransferRecord
from placer.executor.stagecall import (STOP_WAIT_S, StageTimeoutError, StopStage, abandon_thread, call_stage,
                                      stop_thread, timeout_message)
from placer.executor.transfer import nbytes, to_location
from placer.pipeline import Pipeline
from placer.schedule import ReadyQueues, copy_targets, dispatch_order

#: seconds between checks for an interrupt while the engine waits for an event
_POLL_S = 0.2
#: how long closing the lanes waits for a stopped stage's thread to leave (it is a daemon thread)
STOP_GRACE_S = 2.0


class InlineLanes:
    """Run every task in the calling thread, at once.

    With a stage timeout (:meth:`bound`), every task runs instead in one helper thread,
    in the order submitted, so that the calling thread can stop waiting for a stage
    stuck in a call Python cannot interrupt.
    """

    name = "inline"

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool: _Pool | None = None

    def bound(self) -> None:
        """Stages have a time limit: run tasks in a helper thread (one at a time, in order)."""
        if self._pool is None:
            self._pool = _Pool(1, "placer-inline")

    def submit(self, lane: str, task: Callable[[], None]) -> None:
        if self._pool is None:
            task()
        else:
            self._pool.submit(task)

    def lane_name(self, lane: str) -> str:
        return "cpu/0" if lane == "cpu" else lane

    def abandon(self, stage: str, ident: int) -> None:
        if self._pool is not None:
            self._pool.abandon(ident)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close(wait=True)


class _Pool:
    """``n`` daemon threads running tasks from one queue; a stopped thread is replaced by a fresh one."""

    def __init__(self, n: int, prefix: str):
        self.prefix, self.queue = prefix, queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.abandoned: set[int] = set()
        self._count = 0
        for _ in range(n):
            self._spawn()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._work, name=f"{self.prefix}_{self._count}", daemon=True)
        self._count += 1
        self.threads.append(t)
        t.start()

    def _work(self) -> None:
        me = threading.get_ident()
        while me not in self.abandoned:
            try:
                task = self.queue.get()
                if task is None:
                    return
                task()
            except BaseException:  # noqa: BLE001 - tasks report their own errors; a stop may land here
                continue

    def submit(self, task: Callable[[], None]) -> None:
        self.queue.put(task)

    def abandon(self, ident: int) -> None:
        """The thread ``ident`` is being stopped: it leaves after its task, and a new one takes its place."""
        if ident in {t.ident for t in self.threads} and ident not in self.abandoned:
            self.abandoned.add(ident)
            self._spawn()

    def close(self, wait: bool = True) -> None:
        """End the threads; with ``wait``, join them (a stopped one for at most :data:`STOP_GRACE_S`)."""
        live = [t for t in self.threads if t.ident not in self.abandoned]
        for _ in live:
            self.queue.put(None)
        if wait:
            for t in live:
                t.join()
            deadline = time.monotonic() + STOP_GRACE_S
            for t in self.threads:
                if t.ident in self.abandoned:
                    t.join(max(0.0, deadline - time.monotonic()))


class ThreadLanes:
    """A thread pool per lane: ``workers`` threads for the CPU, one per accelerator."""

    name = "threads"

    def __init__(self, workers: int, accelerators: list[str]):
        self.workers = workers
        self._pools = {"cpu": _Pool(workers, "placer-cpu")}
        for a in accelerators:
            self._pools[a] = _Pool(1, f"placer-{a}")
        self._pools["link"] = _Pool(max(2, 2 * len(accelerators)), "placer-link")

    def submit(self, lane: str, task: Callable[[], None]) -> None:
        self._pools[lane].submit(task)

    def lane_name(self, lane: str) -> str:
        if lane == "cpu":
            name = threading.current_thread().name  # placer-cpu_3
            return "cpu/" + name.rsplit("_", 1)[-1]
        return lane

    def abandon(self, stage: str, ident: int) -> None:
        """Stage ``stage`` in thread ``ident`` is being stopped; its lane gets a fresh thread."""
        for p in self._pools.values():
            p.abandon(ident)

    def close(self) -> None:
        for p in self._pools.values():
            p.close(wait=True)


#: the runs in progress in this process (see :func:`interrupt`)
_ACTIVE: set[_Run] = set()
_ACTIVE_LOCK = threading.Lock()


def interrupt() -> list[str]:
    """Mark every run in progress as interrupted; return the one-shot stages running now.

    Called by a Ctrl-C handler before it raises in the main thread, so that the
    engine treats what it raises as a stop (not as the stage's own error) and the
    handler can say what was running.
    """
    with _ACTIVE_LOCK:
        runs = list(_ACTIVE)
    names: list[str] = []
    for r in runs:
        r.stop_requested = True
        names += r.running_names()
    return names


class Engine:
    """Runs a pipeline under a resolved placement on the given lanes.

    Everything that does not change between runs (the graph's shape, each stage's
    implementation, lanes and transfer targets) is worked out once here, so that
    :meth:`run` does little more than call the stages.
    """

    def __init__(self, pipeline: Pipeline, devices: dict[str, Device], lanes, *, timeout_s: float | None = None,
                 streams: Any = ()):
        self.p = pipeline
        self.timeout_s = timeout_s
        if timeout_s is not None and hasattr(lanes, "bound"):
            lanes.bound()  # the engine's thread must be free to stop waiting for a stuck stage
        #: stages that run a whole stream (stopped by the stream's own interrupt, not timed out)
        self.streams = set(streams)
        self.devices = devices
        self.lanes = lanes
        self.stages = pipeline.stages
        self.order = dispatch_order(list(self.stages), {n: st.inputs.values() for n, st in self.stages.items()})
        self.prio = {n: i for i, n in enumerate(self.order)}
        loc = self.loc = {n: d.location for n, d in devices.items()}
        self.loc_device: dict[str, Device] = {HOST: host_device()}
        for d in devices.values():
            self.loc_device.setdefault(d.location, d)
            if not d.is_accelerator:
                self.loc_device[HOST] = d
        self.sinks = set(pipeline.sinks())
        self.lane_of = {n: (d.name if d.is_accelerator else "cpu") for n, d in devices.items()}
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
        self.lock = threading.RLock()
        self.started: dict[str, float] = {}
        self.timers: dict[str, threading.Timer] = {}
        #: stage -> the thread running it, while it runs
        self.running: dict[str, int] = {}
        #: stages stopped (timed out or interrupted): their late events are dropped
        self.abandoned: set[str] = set()
        self.stop_requested = False
        self.stopped_inline: str | None = None

    def running_names(self) -> list[str]:
        with self.lock:
            return [n for n in self.running if n not in self.e.streams and n not in self.abandoned]

    def loop(self):
        """Dispatch, take every event that has come in, repeat until nothing is in flight."""
        with _ACTIVE_LOCK:
            _ACTIVE.add(self)
        try:
            while True:
                try:
                    if not self.step():
                        break
                except StopStage:
                    continue  # a stop meant for an inline stage that had just finished: its timeout event follows
                except BaseException as exc:
                    self.abort(exc)
                    raise
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)
        makespan = self.perf() - self.t_start
        return self.outputs, self.final, self.stage_recs, self.transfer_recs, self.failure, makespan

    def step(self) -> bool:
        """Dispatch what can start, then handle the events that came in; False when nothing is in flight."""
        e, events, avail = self.e, self.events, self.avail
        if self.failure is None:
            for lane, n in self.queues.pop_startable():
                self.inflight += 1
                e.lanes.submit(lane, self.stage_task(n, {a: avail[k] for a, k in e.arg_keys[n]}))
        if self.inflight == 0:
            return False
        self.handle(self.next_event())
        while not events.empty():  # every event already in is handled before the next dispatch
            self.handle(events.get())
        return True

    def next_event(self) -> tuple:
        """The next event, waiting in short slices so that an interrupt reaches this thread at once."""
        while True:
            try:
                return self.events.get(timeout=_POLL_S)
            except queue.Empty:
                continue

    def abort(self, exc: BaseException) -> None:
        """The run is interrupted: stop every stage running on any lane, record them, keep what finished."""
        now = self.perf() - self.t_start
        with self.lock:
            running = dict(self.running)
            if self.stopped_inline is not None:
                running[self.stopped_inline] = threading.main_thread().ident
            names = [n for n in running if n not in self.abandoned]
            for n in names:
                self.abandon(n, running[n], inject=running[n] != threading.main_thread().ident)
        if any(n in self.e.streams for n in names):
            runner = sys.modules.get("placer.executor.stream.runner")
            if runner is not None:
                runner.interrupt()  # a stream stops its own workers (threads, processes, cluster tasks)
        for n in names:
            self.stage_recs.append(StageRecord(
                name=n, device=self.e.devices[n].name, lane=self.e.lane_of[n], start_s=self.started.get(n, now),
                end_s=now, seconds=max(0.0, now - self.started.get(n, now)), output_bytes=0, status="failed",
                error=f"interrupted ({type(exc).__name__})"))
        shown = [n for n in names if n not in self.e.streams]
        with contextlib.suppress(AttributeError, TypeError):  # an exception type without a __dict__
            exc.running = shown  # type: ignore[attr-defined]
            exc.outputs = dict(self.outputs)  # type: ignore[attr-defined]
            exc.placer_partial = (self.outputs, self.final, self.stage_recs,  # type: ignore[attr-defined]
                                  self.transfer_recs, (names[0], exc) if names else None, now)

    def abandon(self, n: str, ident: int, *, inject: bool) -> None:
        """Give up on stage ``n`` (thread ``ident``): stop its thread, let its lane go on without it."""
        self.abandoned.add(n)
        if n not in self.e.streams and inject:
            stop_thread(ident)
        hook = getattr(self.e.lanes, "abandon", None)
        if hook is not None:
            hook(n, ident)

    def time_out(self, n: str) -> None:
        """Timer thread: stage ``n`` overran the timeout; stop it, wait a moment for it to leave, tell the loop.

        A stage that does not leave (stuck in a call Python cannot interrupt) is
        abandoned: the loop goes on without it (:func:`~placer.executor.stagecall.abandon_thread`).
        """
        with self.lock:
            ident = self.running.get(n)
            if ident is None or n in self.abandoned:
                return
            self.abandon(n, ident, inject=True)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and self.running.get(n) == ident:
            time.sleep(0.01)
        stopped = self.running.get(n) != ident
        if not stopped:
            thread = next((t for t in threading.enumerate() if t.ident == ident), None)
            if thread is not None:
                abandon_thread(n, thread)
        self.events.put(("timeout", n, stopped, self.started.get(n, 0.0), self.perf() - self.t_start, None, None))

    # -- tasks ------------------------------------------------------------------------------
    def stage_task(self, n: str, args: dict[str, Any]):
        """The task that runs stage ``n`` on its lane and reports to the event queue."""
        e, events, perf, t_start = self.e, self.events, self.perf, self.t_start
        dev, st, lane, lanes = e.devices[n], e.stages[n], e.lane_of[n], e.lanes
        workers = lanes.workers
        run_stage = self.run_stage
        if run_stage is not None:
            return _remote_stage_task(self, run_stage, events, n, st, dev, args, workers, perf, t_start, self.wall0)

        def task():
            t0 = perf() - t_start
            self.begin(n, t0)
            try:
                out = call_stage(st, dev, args, workers=workers)
                event = ("stage", n, out, t0, perf() - t_start, lanes.lane_name(lane), None)
            except BaseException as exc:  # noqa: BLE001 - reported, then re-raised by execute
                if self.is_stop(exc):
                    self.stopped_inline = n
                    raise  # an interrupt in the thread running the engine (the inline lane): the loop stops the run
                event = ("stage", n, None, t0, perf() - t_start, lanes.lane_name(lane), exc)
            finally:
                self.end(n)
            events.put(event)

        return task

    def begin(self, n: str, t0: float) -> None:
        """Stage ``n`` starts in this thread (with its timer, when there is a timeout)."""
        with self.lock:
            self.running[n] = threading.get_ident()
            self.started[n] = t0
        if self.e.timeout_s is not None and n not in self.e.streams:
            timer = threading.Timer(self.e.timeout_s, self.time_out, (n,))
            timer.daemon = True
            self.timers[n] = timer
            timer.start()

    def end(self, n: str) -> None:
        with self.lock:
            self.running.pop(n, None)
            timer = self.timers.pop(n, None)
        if timer is not None:
            timer.cancel()

    def is_stop(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised in this thread by a stage, stops the whole run (an interrupt)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        return isinstance(exc, KeyboardInterrupt) or (self.stop_requested and not isinstance(exc, Exception))

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
        if kind == "stage" and key in self.abandoned:
            return  # a stopped stage's late report: it was counted when it was stopped
        self.inflight -= 1
        if kind == "timeout":
            self.timed_out(key, t0, t1, stopped=value)
        elif kind == "stage":
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

    def timed_out(self, n: str, t0: float, t1: float, *, stopped: bool = True) -> None:
        e = self.e
        self.queues.release(e.lane_of[n])
        err = StageTimeoutError(timeout_message(n, e.timeout_s, stopped=stopped), stage=n, seconds=e.timeout_s)
        self.stage_recs.append(StageRecord(
            name=n, device=e.devices[n].name, lane=e.lane_of[n], start_s=t0, end_s=t1, seconds=t1 - t0,
            output_bytes=0, status="failed", error=_describe(err)))
        if self.failure is None:
            self.failure = (n, err)

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


def _remote_stage_task(run, run_stage, events, n, st, dev, args, workers, perf, t_start, wall0):
    """A stage task for lanes with ``run_stage`` (see the module's docstring)."""

    def task():
        t0 = perf() - t_start
        run.begin(n, t0)
        try:
            out, info = run_stage(st, dev, args, workers=workers)
            a, b = _span(t0, perf() - t_start, info, wall0)
            event = ("stage", n, out, a, b, info, None)
        except BaseException as exc:  # noqa: BLE001 - reported, then re-raised by execute
            info = dict(getattr(exc, "placer_info", None) or {})
            info.setdefault("lane", dev.name if dev.is_accelerator else "cpu")
            event = ("stage", n, None, t0, perf() - t_start, info, exc)
        finally:
            run.end(n)
        events.put(event)

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
