"""Running one stream: bounded queues between nodes, workers per node, batches kept in order.

May import: placer.pipeline, placer.devices, placer.errors, placer.data.run, placer.timing,
placer.executor.{transfer,stagecall}, placer.executor.stream.*; torch inside functions.

The source reads ahead at most ``prefetch`` batches into the first queue; every
node takes from its input queue, works, and hands its result on in sequence order
(a node with several workers holds a finished batch until the batches before it
have gone), into a queue of ``prefetch`` places: a full queue blocks the node
before it (backpressure), so at most ``prefetch + workers`` batches wait or work
at each node. The step runs alone, in order, so its state evolves exactly as in a
sequential run. Each worker's time is split into busy (working), starved (waiting
for input) and blocked (waiting for room downstream, or for its turn).

With ``StreamConfig(workers=0)`` the same nodes run in the calling thread, one
batch at a time through all of them: the reference the parallel run must equal.

A stage with process workers gets a :class:`~placer.executor.stream.workers.ProcessPool`,
started before the stream's clock and closed when the run ends, however it ends;
its workers' time is accounted as a thread's (busy is the round trip to the
child), and the notes say how long the children took to start and how much of
the busy time they computed. :func:`interrupt` stops every running stream (the
command line calls it on Ctrl-C): workers leave within a poll interval, child
processes are killed, and the run raises KeyboardInterrupt.

A stage whose dask tasks carry several batches (``StreamConfig.stage_group``) has
each worker take that many consecutive batches (one worker takes at a time), run
them as one task, and hand each output on in sequence order: its batches in flight
are its workers times the group.
"""

from __future__ import annotations

import queue
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from placer.data.run import StreamStageStats, StreamStats
from placer.devices import HOST, Device, host_device
from placer.errors import PlacerError
from placer.executor.stream.chain import build_nodes
from placer.executor.stream.config import BatchInfo, StreamConfig
from placer.executor.stream.nodes import Bundle, Node, StepState, batch_len, bundle_bytes, now, takes
from placer.executor.stream.source import (batch_sampler_of, batches, call_source, close_loader, keeps_workers,
                                          kept_loader, loader_threads, loader_workers, workers_key)
from placer.executor.stream.store import SampleStore, cached_items, plain_key
from placer.executor.stream.workers import ProcessPool, StageCall, WorkerStopped
from placer.executor.transfer import to_location
from placer.pipeline import Pipeline
from placer.timing import torch_threads

_END = object()
#: seconds between checks of the stop flag while waiting on a queue
_POLL_S = 0.05
#: seconds each thread gets to leave once the stream stops
_JOIN_S = 2.0
_ACTIVE: weakref.WeakSet = weakref.WeakSet()
_ACTIVE_LOCK = threading.Lock()


def interrupt() -> int:
    """Stop every stream running in this process; each raises KeyboardInterrupt. Return how many."""
    with _ACTIVE_LOCK:
        runs = list(_ACTIVE)
    for r in runs:
        r.interrupted = True
        r.stop.set()
    return len(runs)


class StreamFailed(PlacerError):
    """A stage failed on a batch; ``.state`` is the step's state after the batches done."""

    def __init__(self, message: str, *, stage: str, batches_done: int, state: Any = None):
        super().__init__(message, stage=stage)
        self.batches_done = batches_done
        self.state = state


class StreamRun:
    """One run of one stream.

    Parameters
    ----------
    pipeline : Pipeline
    source : str
        The stream's source stage.
    devices : dict
        Stage → :class:`~placer.devices.Device` for every stage of the stream.
    consts : dict
        One-shot stage → its output on the host, for every one-shot input of the stream.
    config : StreamConfig
    stage_timeout : float, optional
        The longest one call of a stage (one batch; the source: reading one batch) may take;
        a call over it fails the stream naming the stage (see :class:`~placer.executor.stagecall.CallWatch`).
    """

    def __init__(self, pipeline: Pipeline, source: str, devices: dict[str, Device], consts: dict[str, Any],
                 config: StreamConfig, stage_timeout: float | None = None):
        from placer.executor.stagecall import CallWatch

        self.pipeline, self.source, self.config = pipeline, source, config
        self.watch = CallWatch(stage_timeout)
        self.members = pipeline.streams()[source]
        self.step_name = self.members[-1]
        self.nodes: list[Node] = build_nodes(pipeline, self.members, devices, consts, config)
        self.step = StepState(self.nodes[-1])
        self.stop = threading.Event()
        self.interrupted = False
        self.pools: list[ProcessPool] = []
        self.failure: tuple[str, BatchInfo | None, BaseException] | None = None
        #: the first batch that failed: it and every later batch are dropped
        self.fail_seq = float("inf")
        self.cache = _Cache(self, config)
        self.samples = 0
        self.setup_s = 0.0
        self.done = 0
        self.first_step_s: float | None = None
        self.first_done_s: float | None = None
        self.last_done_s = 0.0
        self.first_samples = 0
        #: (time the step finished it, samples) of every batch, in order
        self.finished: list[tuple[float, int]] = []
        #: batches read but not yet through the step when the first one was (queues filled meanwhile)
        self.filled = 0
        self.inflight = 0
        self.peak_inflight = 0
        self.inflight_bytes = 0
        self.peak_bytes = 0
        self.trace: list[tuple[float, list[int]]] = []
        self.lock = threading.Lock()
        #: (workers key, the source's object, its loader, its batch sampler) while the loader's workers
        #: are kept between epochs
        self.kept: tuple[Any, Any, Any, Any] | None = None
        #: the worker processes of the DataLoader the source was last read with (0: none)
        self.loader_workers = 0
        self.loader_threads = 0

    # -- the source ---------------------------------------------------------------------------
    def bundles(self) -> Iterator[Bundle]:
        """Every batch of every epoch, in order (from the cache once it holds a whole epoch)."""
        src = self.pipeline.stages[self.source]
        consts = self.nodes[0].consts
        seq = 0
        for epoch in range(src.epochs):
            replay = self.cache.replay(epoch)
            if replay is not None:
                for index, b in enumerate(replay):
                    yield Bundle(seq, BatchInfo(epoch, index, seq), dict(b.values), b.start)
                    seq += 1
                    if self._enough(seq):
                        return
                continue
            it = self._epoch(src, self.watch.call(self.source, call_source, src, consts, epoch), epoch)
            nxt = self.watch.call(self.source, next, it, _END)
            index = 0
            while nxt is not _END and not self.stop.is_set():
                cur, error = nxt, None
                try:  # one batch ahead, to know the last of an epoch (for the cache)
                    nxt = self.watch.call(self.source, next, it, _END)
                except Exception as exc:  # noqa: BLE001 - the batch read before it is still good
                    nxt, error = _END, exc
                info = BatchInfo(epoch, index, seq)
                kept = self.cache.lookup(seq, cur)  # a batch whose declared key was seen: after the cache point
                if kept is not None:
                    b = Bundle(seq, info, {k: dict(v) for k, v in kept.values.items()}, kept.start)
                else:
                    b = Bundle(seq, info, {self.source: {HOST: cur}}, last_of_epoch=nxt is _END and error is None)
                    self.cache.offer(self.nodes[0], b)  # a cache point at the source keeps what it read
                yield b
                if error is not None:
                    raise error
                seq += 1
                index += 1
                if self._enough(seq):
                    return

    def _epoch(self, src: Any, obj: Any, epoch: int) -> Iterator[Any]:
        """One epoch's batches of what the source returned: through the loader whose workers were kept
        from the epoch before (``persistent_workers``) when they can serve it (:func:`workers_key`)."""
        wrap = self.cache.wrap(epoch)
        self.loader_workers = loader_workers(src, obj, self.config)
        self.loader_threads = loader_threads(src, obj, self.config)
        if wrap is not None or not keeps_workers(src, obj, self.config):
            self._close_kept()
            return batches(src, obj, self.config, wrap)
        key = workers_key(obj)
        if self.kept is None or self.kept[0] != key:
            self._close_kept()
            loader, sampler = kept_loader(src, obj, self.config)
            self.kept = (key, obj, loader, sampler)
        else:
            self.kept = (key, obj, *self.kept[2:])  # hold this epoch's object: its sampler's owner
            self.kept[3].inner = batch_sampler_of(src, obj)
        return iter(self.kept[2])

    def _close_kept(self) -> None:
        if self.kept is not None:
            close_loader(self.kept[2])
            self.kept = None

    def _enough(self, seq: int) -> bool:
        return self.config.max_batches is not None and seq >= self.config.max_batches

    # -- one batch through one node -----------------------------------------------------------
    def work(self, node: Node, b: Bundle) -> Bundle:
        if b.start > node.index:
            return b
        # a worker process (or a cluster task) stops when the stream does; a thread is told to stop
        return self.watch.call(node.name, self._work, node, b, key=(b.info, b.seq), stoppable=node.pool is None)

    def _work(self, node: Node, b: Bundle) -> Bundle:
        if node.kind == "step":
            self._step(node, b)
            return b
        node.store(b, node.process(b))
        self.cache.offer(node, b)
        return b

    def _step(self, node: Node, b: Bundle) -> None:
        t = now()
        if self.first_step_s is None:
            self.first_step_s = t
        rows = batch_len(next(iter(b.values[src][node.location] for src in node.reads.values())))
        self.step.apply(b)
        done = now()
        with self.lock:
            self.samples += rows
            self.done += 1
            self.inflight -= 1
            if self.first_done_s is None:
                self.first_done_s, self.first_samples = done, rows
                self.filled = self.inflight
            self.last_done_s = done
            self.finished.append((done, rows))

    # -- running ------------------------------------------------------------------------------
    def run(self) -> tuple[Any, StreamStats]:
        """Run the stream to its end; return the step's result (on the host) and the statistics."""
        with _ACTIVE_LOCK:
            _ACTIVE.add(self)
        threads = torch_threads(self.config.torch_threads)  # the workers started here take it
        try:
            threads.__enter__()
            t_setup = now()
            self._start_pools()
            with self.nodes[-1].device.work_stream():
                self.step.start()
            self.t0 = now()
            self.setup_s = self.t0 - t_setup
            inline = self.config.sequential or self.loader_feeds_step()
            if inline and self.watch.seconds is None:
                self._run_inline()
            elif inline:  # in a thread of its own, so that a stuck stage can be left behind
                from placer.executor.stagecall import without_stop

                self._wait([threading.Thread(target=without_stop(_own_threads(self._run_inline)),
                                             name=f"placer-{self.source}", daemon=True)])
            else:
                self._run_threads()
        except BaseException as exc:
            self.stop.set()
            if not (self.interrupted and isinstance(exc, Exception)):
                raise
        finally:
            self._close_kept()
            self._close_pools()
            self.cache.close()
            threads.__exit__(None, None, None)
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)
        if self.interrupted:
            raise KeyboardInterrupt(f"stream {self.source!r} interrupted")
        if self.failure is not None:
            self._raise()
        result, _, _ = to_location(self.step.result(), host_device())
        return result, self.stats()

    def _start_pools(self) -> None:
        """Start the child processes of every stage with process workers."""
        for node in self.nodes:
            if node.worker_kind not in ("process", "dask"):
                continue
            kind = ProcessPool
            if node.worker_kind == "dask":
                from placer.executor.stream.dask_workers import DaskPool as kind
            pool = kind(node.name, StageCall(node.stage, node.device, node.consts, node.takes_info),
                        node.workers, self.stop)
            try:
                pool.start()
            except WorkerStopped:
                raise
            except Exception as exc:  # noqa: BLE001 - the stage could not be loaded in a child
                raise StreamFailed(f"stage {node.name!r} could not start its worker processes: "
                                   f"{type(exc).__name__}: {exc}", stage=node.name, batches_done=0) from exc
            node.pool = pool
            self.pools.append(pool)

    def _close_pools(self) -> None:
        for pool in self.pools:
            pool.close()
        for node in self.nodes:
            node.pool = None

    def loader_feeds_step(self) -> bool:
        """Whether the source's batches come from DataLoader worker processes (or a thread-pool loader's
        threads) straight to a step on the host: the stream then runs as a script's loop does, reading a batch
        and running the step in one thread (the workers read ahead, ``prefetch_factor`` batches each), not
        through a queue between two threads.

        A queue between the two measures other speeds than the script's own loop, even in the opposite
        order (a step's spinning OpenMP threads beside the workers cost the script's loop, which waits in
        the same thread, and not the queue's). The other thread buys no overlap either: the DataLoader's
        workers already read ahead."""
        step = self.nodes[-1]
        return (not self.config.sequential and len(self.nodes) == 2 and step.kind == "step"
                and step.device.kind == "cpu" and self.config.stage_workers.get(self.source, 0) > 0
                and self.config.kind_of(self.source) != "dask")

    def _run_inline(self) -> None:
        node = self.nodes[0]
        waits = self.loader_feeds_step()  # the step waits while the workers' next batch is read
        it = self.bundles()
        while True:
            t = now()
            try:
                b = next(it, None)
            except Exception as exc:  # noqa: BLE001 - named and re-raised by run()
                self.failure = (self.source, None, exc)
                return
            node.stats.busy_s += now() - t
            if waits and b is not None:
                self.nodes[-1].stats.starved_s += now() - t
            if b is None:
                break
            node.stats.batches += 1
            self._admit(b)
            for n in self.nodes[1:]:
                t = now()
                try:
                    self.work(n, b)
                except Exception as exc:  # noqa: BLE001
                    self.failure = (n.name, b.info, exc)
                    return
                n.stats.busy_s += now() - t
                n.stats.batches += b.start <= n.index
        end = now() - self.t0
        for n in self.nodes:
            n.stats.end_s = end

    def _admit(self, b: Bundle) -> None:
        with self.lock:
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
        size = bundle_bytes(b)
        with self.lock:
            self.peak_bytes = max(self.peak_bytes, size * self.inflight)

    def _run_threads(self) -> None:
        from placer.executor.stagecall import without_stop

        cap = self.config.prefetch
        self.queues = [queue.Queue(maxsize=cap) for _ in self.nodes[1:]]
        threads = [threading.Thread(target=without_stop(self._source_loop), name=f"placer-{self.source}",
                                    daemon=True)]
        for i, node in enumerate(self.nodes[1:], start=1):
            out = _Ordered(self.queues[i] if i < len(self.queues) else None, self.stop)
            shared = _Exit(node.workers, out)
            grouped = node.group > 1 and node.pool is not None and hasattr(node.pool, "call_many")
            loop, extra = (self._group_loop, (threading.Lock(),)) if grouped else (self._node_loop, ())
            if node.kind == "step":  # it runs torch ops at the threads the caller's thread has
                loop = _own_threads(loop)
            for w in range(node.workers):
                threads.append(threading.Thread(target=without_stop(loop),
                                                args=(node, self.queues[i - 1], out, shared, *extra),
                                                name=f"placer-{node.name}-{w}", daemon=True))
        self._wait(threads)

    def _wait(self, threads: list[threading.Thread]) -> None:
        """Start ``threads`` and wait for them; a stage call over the stage timeout stops the stream."""
        for t in threads:
            t.start()
        try:
            late = self.watch.wait(threads, self.stop)
        except BaseException:  # Ctrl-C, or the exit the command line turns it into
            self.stop.set()
            for t in threads:
                t.join(_JOIN_S)
            raise
        if late is not None:
            info, seq = self.watch.overdue[1] or (None, None)
            with self.lock:
                self.failure = (late.stage, info, late)
                self.fail_seq = min(self.fail_seq, seq if seq is not None else -1)

    def _source_loop(self) -> None:
        node, q = self.nodes[0], self.queues[0]
        it = self.bundles()
        busy = blocked = 0.0
        mark = self.t0  # every moment from the stream's start to the end of the source is counted once
        try:
            with node.device.work_stream():
                while not self.stop.is_set() and self.failure is None:
                    b = next(it, None)
                    t = now()
                    busy, mark = busy + t - mark, t
                    if b is None:
                        break
                    node.stats.batches += 1
                    self._admit(b)
                    _put(q, b, self.stop)
                    t = now()
                    blocked, mark = blocked + t - mark, t
        except Exception as exc:  # noqa: BLE001 - named and re-raised by run()
            t = now()
            busy, mark = busy + t - mark, t
            self._fail(node.name, None, exc, seq=None)
        finally:
            _put(q, _END, self.stop)
            end = now()
            node.stats.busy_s, node.stats.blocked_s = busy, blocked + end - mark
            node.stats.end_s = end - self.t0

    def _node_loop(self, node: Node, inq: queue.Queue, out: _Ordered, shared: _Exit) -> None:
        acc = [0.0, 0.0, 0.0, 0]  # busy, starved, blocked, batches of this worker
        mark = self.t0  # every moment from the stream's start to this worker's exit is counted once
        with node.device.work_stream():
            while True:
                b = _get(inq, self.stop)
                t1 = now()
                acc[1] += t1 - mark
                mark = t1
                if b is _END or b is None:
                    if b is _END:
                        _put(inq, _END, self.stop)  # for the other workers of this node
                    break
                if b.seq >= self.fail_seq:  # after a failed batch: dropped, never reaches the step
                    continue
                try:
                    self.work(node, b)
                except Exception as exc:  # noqa: BLE001 - named and re-raised by run()
                    self._fail(node.name, b.info, exc, seq=b.seq)
                    mark = now()
                    acc[0] += mark - t1
                    continue
                t2 = now()
                acc[0] += t2 - t1
                acc[3] += b.start <= node.index  # replayed from a cache: passed on, not worked on
                if node.kind == "step":
                    self.trace.append((t2 - self.t0, [q.qsize() for q in self.queues]))
                out.put(b.seq, b, self)
                mark = now()
                acc[2] += mark - t2
        shared.leave(node, self.t0, acc, mark)

    def _group_loop(self, node: Node, inq: queue.Queue, out: _Ordered, shared: _Exit, take: threading.Lock) -> None:
        """A worker of a stage whose cluster tasks carry ``node.group`` batches: it takes that many
        consecutive batches (one worker at a time takes, so a group's batches are consecutive), runs them
        as one task, and hands each output on in sequence order. Its batches in flight are its group."""
        acc = [0.0, 0.0, 0.0, 0]  # busy, starved, blocked, batches of this worker
        mark = self.t0
        ended = False
        with node.device.work_stream():
            while not ended:
                group: list[Bundle] = []
                with take:
                    while len(group) < node.group:
                        b = _get(inq, self.stop)
                        if b is _END or b is None:
                            if b is _END:
                                _put(inq, _END, self.stop)  # for the other workers of this node
                            ended = True
                            break
                        if b.seq < self.fail_seq:  # after a failed batch: dropped, never reaches the step
                            group.append(b)
                t1 = now()
                acc[1] += t1 - mark
                mark = t1
                if not group:
                    continue
                todo = [b for b in group if b.start <= node.index]  # the others were replayed from a cache
                try:
                    if todo:
                        items = [({a: b.values[src][node.location] for a, src in node.reads.items()}, b.info)
                                 for b in todo]
                        outs = self.watch.call(node.name, node.pool.call_many, items,
                                               key=(todo[0].info, todo[0].seq), stoppable=False)
                        for b, o in zip(todo, outs):
                            node.store(b, o)
                            self.cache.offer(node, b)
                except Exception as exc:  # noqa: BLE001 - named and re-raised by run()
                    self._fail(node.name, todo[0].info, exc, seq=todo[0].seq)
                    mark = now()
                    acc[0] += mark - t1
                    continue
                t2 = now()
                acc[0] += t2 - t1
                acc[3] += len(todo)
                for b in group:
                    out.put(b.seq, b, self)
                mark = now()
                acc[2] += mark - t2
        shared.leave(node, self.t0, acc, mark)

    def _fail(self, name: str, info: BatchInfo | None, exc: BaseException, *, seq: int | None) -> None:
        """Record the first failure; batches before it still finish, later ones are dropped."""
        with self.lock:
            if self.failure is None or (seq is not None and seq < self.fail_seq):
                self.failure = (name, info, exc)
            if seq is not None:
                self.fail_seq = min(self.fail_seq, seq)

    def _raise(self) -> None:
        name, info, exc = self.failure
        where = "while reading batches" if info is None else f"on batch {info.index} of epoch {info.epoch}"
        raise StreamFailed(
            f"stage {name!r} failed {where} ({self.done} batch{'es' if self.done != 1 else ''} done): "
            f"{type(exc).__name__}: {exc}", stage=name, batches_done=self.done, state=self.step.result(),
        ) from exc

    # -- statistics ---------------------------------------------------------------------------
    def stats(self) -> StreamStats:
        wall = now() - self.t0
        rate = steady_rate(self.finished, 1 + self.filled)
        if rate is None:
            rate = self.samples / wall if wall > 0 else 0.0
        step = self.nodes[-1].stats
        step_time = step.busy_s + step.starved_s + step.blocked_s
        idle = step.starved_s / step_time if step_time > 0 else 0.0
        nodes = [StreamStageStats(name=n.name, kind=n.kind, device=n.device.name, workers=n.workers,
                                  worker_kind=n.worker_kind, batches=n.stats.batches, busy_s=n.stats.busy_s,
                                  starved_s=n.stats.starved_s, blocked_s=n.stats.blocked_s,
                                  wall_s=n.stats.end_s, loader_workers=self.loader_workers if i == 0 else 0,
                                  loader_threads=self.loader_threads if i == 0 else 0)
                 for i, n in enumerate(self.nodes)]
        src = self.pipeline.stages[self.source]
        return StreamStats(
            source=self.source, step=self.step_name, epochs=src.epochs, batches=self.done, samples=self.samples,
            seconds=wall, setup_s=self.setup_s, samples_per_s=rate,
            time_to_first_batch_s=(self.first_step_s or self.t0) - self.t0, consumer_idle_fraction=idle,
            prefetch=self.config.prefetch, peak_inflight_batches=self.peak_inflight,
            peak_inflight_bytes=self.peak_bytes, cache=self.config.cache, stages=nodes,
            queue_trace=self.trace[:: max(1, len(self.trace) // 500)], sequential=self.config.sequential,
            notes=list(self.cache.notes) + [_pool_note(p, n) for p in self.pools for n in self.nodes
                                            if n.name == p.name],
        )


def _own_threads(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for a thread's target, run at the torch intra-op threads of the thread that made it.

    ``torch.set_num_threads`` sets OpenMP's count for the thread that calls it (and torch's
    own number); a thread started later begins at OpenMP's default (every core), which
    torch's BLAS calls follow: measured on 2 cores, a 1024x1024 matmul took 12.7 ms in the
    main thread at 1 thread and 6.9 ms in a new thread beside it. The step's thread takes
    the caller's count, as a script's loop in its main thread would run it.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return fn
    n = torch.get_num_threads()

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch_threads(n):  # sets it in this thread (torch's number is n already)
            return fn(*args, **kwargs)

    return run


def steady_rate(finished: list[tuple[float, int]], skip: int = 1) -> float | None:
    """Samples per second in steady state, from ``(finish time, samples)`` of each batch in order.

    The window starts once the first ``skip`` batches are through the step (at most
    half of them): the first batch, and the batches that were already read when it
    was done. While the first batch is in the step (which pays for warm-up), the
    stages before it fill every queue, and those batches then reach the step faster
    than the stream makes new ones; counting them would flatter deep queues on short
    runs. None with fewer than three batches.
    """
    if len(finished) < 3:
        return None
    skip = max(1, min(skip, len(finished) // 2))
    start = finished[skip - 1][0]
    span = finished[-1][0] - start
    return sum(n for _, n in finished[skip:]) / span if span > 0 else None


def _pool_note(pool: ProcessPool, node: Node) -> str:
    if hasattr(pool, "note"):
        return pool.note(node)
    t = pool.times
    return (f"{node.name!r}: {pool.count} worker process{'es' if pool.count != 1 else ''} started in "
            f"{t.start_s:.2f} s, before the stream's clock; of its {node.stats.busy_s:.2f} s busy, "
            f"{t.compute_s:.2f} s computing in the workers, {t.round_trip_s - t.compute_s:.2f} s moving "
            "batches to and from them")


class _Ordered:
    """Hands finished batches to the next queue in sequence order."""

    def __init__(self, q: queue.Queue | None, stop: threading.Event):
        self.q, self.stop = q, stop
        self.next = 0
        self.cond = threading.Condition()

    def put(self, seq: int, b: Bundle, run: StreamRun) -> float:
        """Wait for ``seq``'s turn and for room; return the seconds waited.

        Batches after a failed one never come, so a batch past the failure gives up
        its turn (it is dropped); batches before it go on as usual.
        """
        t = now()
        with self.cond:
            while self.next != seq and not self.stop.is_set() and seq < run.fail_seq:
                self.cond.wait(_POLL_S)
            if seq >= run.fail_seq or self.stop.is_set():
                return now() - t
            if self.q is not None:
                _put(self.q, b, self.stop)
            self.next = seq + 1
            self.cond.notify_all()
        return now() - t

    def end(self) -> None:
        if self.q is not None:
            _put(self.q, _END, self.stop)


class _Exit:
    """Counts a node's workers out, adding up their time; the last one passes the end of the stream on.

    A worker that leaves before the last one waited for work that never came: the
    time from its last count to the node's end is starved, so that each node's busy,
    starved and blocked time add up to its wall time times its workers.
    """

    def __init__(self, workers: int, out: _Ordered):
        self.left, self.out = workers, out
        self.lock = threading.Lock()
        self.marks: list[float] = []

    def leave(self, node: Node, t0: float, acc: list, mark: float) -> None:
        with self.lock:
            st = node.stats
            st.busy_s += acc[0]
            st.starved_s += acc[1]
            st.blocked_s += acc[2]
            st.batches += acc[3]
            self.marks.append(mark)
            self.left -= 1
            last = self.left == 0
        if last:
            end = now()
            node.stats.starved_s += sum(end - m for m in self.marks)
            node.stats.end_s = end - t0
            self.out.end()


class _Cache:
    """What a cache point keeps, in one of three ways (:attr:`mode`).

    - ``replay``: the batches after the cache point in the first epoch, replayed in
      later epochs in the same order (a source that yields the same batches every epoch);
    - ``sample``: a reshuffling source (it takes ``batch_info``) that returns a Dataset
      or DataLoader, cached at the source: each sample is kept by its index
      (:func:`~placer.executor.stream.store.cached_items` in a shared store, so the
      DataLoader's worker processes share it; under a ``Subset``, by the index beneath)
      and later epochs read the samples their sampler or permutation draws, in its new
      order;
    - ``keyed``: a source that declares ``cache_key``: the outputs after the cache point
      are kept by the key of the batch they came from, and a batch whose key was seen
      starts after the cache point, whatever its epoch and position.
    """

    def __init__(self, run: StreamRun, config: StreamConfig):
        self.at = next((n.index for n in run.nodes if n.name == config.cache and n.kind != "copy"), None)
        self.limit = config.cache_bytes
        self.items: dict[int, Bundle] = {}
        self.expected: int | None = None
        self.lock = threading.Lock()
        self.bytes = 0
        self.complete = threading.Event()
        self.stop = run.stop
        self.notes: list[str] = []
        self.failed = False
        self.mode: str | None = None
        self.store: SampleStore | None = None
        self.keyed: dict[Any, Bundle] = {}
        self.keys: dict[int, Any] = {}
        self.hits = 0
        self.name = config.cache
        if config.cache is not None and self.at is None:
            raise PlacerError(f"cache point {config.cache!r} is not a stage of stream {run.source!r}",
                              stage=config.cache)
        if self.at is not None:
            self.mode = _check_cacheable(run, self.at)
            self.key_of = run.pipeline.stages[run.source].cache_key
        if self.mode == "sample":
            self.store = SampleStore(self.limit)

    # -- sample: a Dataset source's items, by index -------------------------------------------
    def wrap(self, epoch: int) -> Callable[[Any], Any] | None:
        """How a Dataset source's dataset is read this epoch (None: as it is)."""
        if self.mode != "sample":
            return None
        store, name = self.store, self.name
        # from the second epoch on, the first item read back is checked against the dataset's
        return lambda ds: cached_items(ds, store, verify=1 if epoch else 0, name=f"source {name!r}")

    # -- keyed: outputs by the source's declared key ------------------------------------------
    def lookup(self, seq: int, batch: Any) -> Bundle | None:
        """The kept bundle of a batch whose key was seen (None: work on it), remembering its key."""
        if self.mode != "keyed":
            return None
        key = plain_key(self.key_of(batch))
        with self.lock:
            hit = self.keyed.get(key)
            if hit is None:
                self.keys[seq] = key
            else:
                self.hits += 1
        return hit

    def offer(self, node: Node, b: Bundle) -> None:
        """Keep batch ``b`` as it leaves the cache point (replay: in the first epoch, in any order of arrival)."""
        if node.index != self.at:
            return
        if self.mode == "keyed":
            self._keep(node, b)
            return
        if self.mode != "replay" or b.info.epoch != 0:
            return
        with self.lock:
            if self.failed or self.complete.is_set():
                return
            size = bundle_bytes(b)
            if self.bytes + size > self.limit:
                self.failed = True
                self.items.clear()
                self.notes.append(f"cache after {node.name!r} stopped: more than {self.limit:,} bytes; "
                                  "later epochs recompute it")
                self.complete.set()
                return
            self.bytes += size
            self.items[b.info.index] = Bundle(b.seq, b.info, {k: dict(v) for k, v in b.values.items()}, self.at + 1)
            if b.last_of_epoch:
                self.expected = b.info.index + 1
            if self.expected is not None and len(self.items) == self.expected:
                self.notes.append(f"cached {self.expected} batches ({self.bytes:,} bytes) after {node.name!r}")
                self.complete.set()

    def _keep(self, node: Node, b: Bundle) -> None:
        with self.lock:
            key = self.keys.pop(b.seq, None)
            if key is None or key in self.keyed or self.failed:
                return
            size = bundle_bytes(b)
            if self.bytes + size > self.limit:
                self.failed = True
                self.notes.append(f"cache after {node.name!r} full at {self.limit:,} bytes: batches with other "
                                  "keys are recomputed")
                return
            self.bytes += size
            self.keyed[key] = Bundle(b.seq, b.info, {k: dict(v) for k, v in b.values.items()}, self.at + 1)

    def replay(self, epoch: int) -> list[Bundle] | None:
        """The first epoch's batches in their order, once all are kept (None: recompute this epoch)."""
        if self.mode != "replay" or epoch == 0:
            return None
        while not self.complete.wait(_POLL_S):
            if self.stop.is_set():
                return None
        return None if self.failed else [self.items[i] for i in range(self.expected)]

    def close(self) -> None:
        """Say what the cache held and let go of it."""
        if self.mode == "keyed":
            self.notes.append(f"cached {len(self.keyed)} batches by key ({self.bytes:,} bytes) after {self.name!r}; "
                              f"{self.hits} batches read from it")
        elif self.mode == "sample" and self.store is not None:
            self.notes.append(f"cached {len(self.store)} samples by index ({self.store.bytes:,} bytes) of source "
                              f"{self.name!r}" + (f"; full at {self.limit:,} bytes" if self.store.bytes
                                                  and len(self.store) == 0 else ""))
            self.store.close()


def _check_cacheable(run: StreamRun, at: int) -> str:
    """How the cache point ``at`` keeps outputs (:class:`_Cache`'s modes); refuse one that cannot.

    Refused: a cache point at or after a random stage; for a reshuffling source
    without ``cache_key``, a cache point after the source; with ``cache_key``, a cache
    point at the source, or at or after a stage that takes ``batch_info`` (its output
    may depend on where the batch falls).
    """
    src = run.pipeline.stages[run.source]
    for n in run.nodes[: at + 1]:
        if n.stage is not None and n.stage.random:
            raise PlacerError(f"cannot cache after {run.nodes[at].name!r}: stage {n.name!r} is random (its "
                              "output changes between epochs); cache before it", stage=n.name)
    if src.cache_key is not None:
        if at == 0:
            raise PlacerError(f"cannot cache at source {run.source!r} by key: the source is read every epoch "
                              "to learn its batches' keys; cache after a stage that reads it", stage=run.source)
        for n in run.nodes[1: at + 1]:
            if n.kind != "copy" and n.takes_info:
                raise PlacerError(f"cannot cache after {run.nodes[at].name!r} by key: stage {n.name!r} takes "
                                  "batch_info, so its output may depend on the batch's epoch or position; "
                                  "cache before it", stage=n.name)
        return "keyed"
    if takes(src.impl_for("cpu").fn, "batch_info"):
        if at == 0:
            return "sample"
        raise PlacerError(f"cannot cache after {run.nodes[at].name!r}: source {run.source!r} takes batch_info, "
                          "so its batches may change between epochs (reshuffling); cache at the source (a "
                          "Dataset or DataLoader source keeps its samples by index), or declare "
                          "cache_key= on the source (outputs kept by each batch's key)", stage=run.source)
    return "replay"


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> float:
    t = now()
    while True:
        try:
            q.put(item, timeout=_POLL_S)
            return now() - t
        except queue.Full:
            if stop.is_set():
                return now() - t


def _get(q: queue.Queue, stop: threading.Event) -> Any:
    while True:
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            if stop.is_set():
                return None

