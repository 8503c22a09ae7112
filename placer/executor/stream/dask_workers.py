"""Dask workers for a per-batch CPU stage: each of the stage's worker threads runs its batches as tasks on a cluster.

May import: placer.errors, placer.devices, placer.pipeline, placer.placement, placer.executor.{distributed,shipping},
placer.executor.stream.{config,workers}; placer.executor (``Prepared``), distributed and
cloudpickle inside functions.

The counterpart of :mod:`placer.executor.stream.workers` (process workers) for the user's
dask cluster, so CPU preprocessing can be offloaded to other machines as with the
tf.data service. With ``StreamConfig(worker_kind={stage: "dask"})`` each of the
stage's worker threads hands its batch to the cluster with ``client.submit`` and
waits for the result: the runner's bounded queues, sequence-number ordering,
backpressure and accounting stay as they are. The batches in flight at the
stage are therefore bounded by its workers (one task per worker thread), and the
outputs come back in order, so the result equals the sequential run's.

With ``StreamConfig(stage_group={stage: g})`` each worker thread takes ``g``
consecutive batches and runs them as one task (:meth:`DaskPool.call_many`), so the
cluster's per-task overhead is paid once per ``g`` batches; the outputs come back
split, in order, and the batches in flight at the stage are its workers times ``g``.

The stage travels once: its modules as source (:mod:`placer.executor.shipping`),
the stage with its one-shot inputs pickled and scattered to the workers, each of
which unpickles it once, before the stream's clock starts, and keeps it for the run. Each batch then travels as the
task's argument, its result as the task's result.

:func:`run_stream_on_cluster` is what ``execute(..., scheduler=...)`` does with a
pipeline that has streams: the stream's CPU per-batch stages get dask workers (as
many per stage as the cluster has threads, unless set), while the source, the step
and the one-shot stages run here, where the step's device is. A stop (Ctrl-C, a
failing stage) cancels the stage's tasks on the cluster.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from placer.devices import discover
from placer.errors import PlacerError
from placer.executor.distributed import connect, done_event, stop_when_cancelled
from placer.executor.shipping import by_reference, ship_modules, stage_objects, unpicklable_stage
from placer.executor.stream.config import BatchInfo, StreamConfig
from placer.executor.stream.workers import PoolTimes, StageCall, WorkerStopped
from placer.pipeline import as_pipeline
from placer.placement import resolve

#: seconds between checks of the stop flag while a batch is on the cluster
_POLL_S = 0.05
#: stage calls a worker keeps unpickled (one per stage of the runs it serves)
_KEEP = 16

_CLIENTS: list[Any] = []
_CLIENTS_LOCK = threading.Lock()


@contextlib.contextmanager
def using_client(client: Any) -> Iterator[None]:
    """Inside the block, stages with ``worker_kind="dask"`` run their batches on ``client``'s cluster."""
    with _CLIENTS_LOCK:
        _CLIENTS.append(client)
    try:
        yield
    finally:
        with _CLIENTS_LOCK:
            _CLIENTS.remove(client)


def current_client() -> Any:
    with _CLIENTS_LOCK:
        return _CLIENTS[-1] if _CLIENTS else None


# -- on the workers -------------------------------------------------------------------------------
_CALLS: OrderedDict[str, StageCall] = OrderedDict()
_CALLS_LOCK = threading.Lock()


def _stage_call(token: str, payload: bytes) -> StageCall:
    import cloudpickle

    with _CALLS_LOCK:
        call = _CALLS.get(token)
        if call is None:
            call = _CALLS[token] = cloudpickle.loads(payload)
            while len(_CALLS) > _KEEP:
                _CALLS.popitem(last=False)
        return call


def load_stage(token: str, payload: bytes) -> None:
    """Run on a worker before the stream starts: unpickle the stage (importing its modules) and keep it."""
    _stage_call(token, payload)


def run_batch(token: str, payload: bytes, inputs: dict[str, Any], info: BatchInfo) -> tuple[Any, float]:
    """Run on a worker: the stage on one batch; its output and the seconds it computed."""
    from distributed import get_worker

    call = _stage_call(token, payload)
    t = time.perf_counter()
    with stop_when_cancelled(get_worker()):  # a stopped stream leaves no batch running on the worker
        out = call(inputs, info)
    return out, time.perf_counter() - t


def run_batches(token: str, payload: bytes, items: list[tuple[dict[str, Any], BatchInfo]]) -> tuple[list[Any], float]:
    """Run on a worker: the stage on several consecutive batches, in order; their outputs and the seconds
    it computed."""
    from distributed import get_worker

    call = _stage_call(token, payload)
    t = time.perf_counter()
    with stop_when_cancelled(get_worker()):
        outs = [call(inputs, info) for inputs, info in items]
    return outs, time.perf_counter() - t


def time_calls(call: Any, items: list[tuple[dict[str, Any], BatchInfo]], limit_s: float,
               most: int = 32) -> list[float]:
    """Seconds of each call of ``call`` on ``items`` (in turn, round again while under ``limit_s`` and ``most``
    calls), after one untimed call on the first (warm-up); at least two timed calls."""
    call(*items[0])
    out: list[float] = []
    start = time.perf_counter()
    k = 0
    while len(out) < 2 or (time.perf_counter() - start < limit_s and len(out) < most):
        inputs, info = items[k % len(items)]
        t = time.perf_counter()
        call(inputs, info)
        out.append(time.perf_counter() - t)
        k += 1
    return out


def time_batches(token: str, payload: bytes, items: list[tuple[dict[str, Any], BatchInfo]],
                 limit_s: float) -> list[float]:
    """Run on a worker: :func:`time_calls` of the stage on ``items``; only the seconds come back."""
    return time_calls(_stage_call(token, payload), items, limit_s)


# -- the pool -----------------------------------------------------------------------------------
class DaskPool:
    """``count`` workers of one stage whose calls run as tasks on the current dask cluster.

    The interface of :class:`~placer.executor.stream.workers.ProcessPool`: :meth:`start`,
    a call per batch (blocking the calling worker thread), :meth:`close`.
    """

    kind = "dask"

    def __init__(self, name: str, call: StageCall, count: int, stop: threading.Event):
        self.name, self.call_obj, self.count, self.stop = name, call, count, stop
        self.client = current_client()
        if self.client is None:
            raise PlacerError(f"stage {name!r} has dask workers, but no cluster is in use; run with "
                              "--scheduler tcp://HOST:PORT (execute(..., scheduler=...))", stage=name)
        self.times = PoolTimes()
        self.token = f"placer-stream-{name}-{uuid.uuid4().hex[:8]}"
        self._payload: Any = None
        self._futures: set[Any] = set()
        self._lock = threading.Lock()

    def start(self) -> float:
        """Send the stage's modules and the stage itself to the workers; return the seconds it took."""
        import cloudpickle

        t = time.perf_counter()
        stage = self.call_obj.stage
        modules = ship_modules(self.client, [*stage_objects([stage]), *self.call_obj.consts.values()])
        with by_reference(modules):
            try:
                payload = cloudpickle.dumps(self.call_obj)
            except Exception as exc:  # noqa: BLE001 - explained, naming the stage and the object
                raise unpicklable_stage(stage, exc) from None
        self._payload = self.client.scatter(payload, broadcast=True, hash=False)
        # every worker unpickles the stage now, before the stream's clock, not on its first batch
        workers = list(self.client.scheduler_info(n_workers=-1)["workers"])
        self.client.gather([self.client.submit(load_stage, self.token, self._payload, workers=[w],
                                               allow_other_workers=False, pure=False,
                                               key=f"{self.token}-load-{i}") for i, w in enumerate(workers)])
        self.times.start_s = time.perf_counter() - t
        return self.times.start_s

    def __call__(self, inputs: dict[str, Any], info: BatchInfo) -> Any:
        """Run the stage on one batch on the cluster; raise what the stage raised there."""
        return self._task(run_batch, (inputs, info), f"{self.token}-{info.seq}")

    def call_many(self, items: list[tuple[dict[str, Any], BatchInfo]]) -> list[Any]:
        """Run the stage on several consecutive batches as one task; their outputs, in order."""
        return self._task(run_batches, (items,), f"{self.token}-{items[0][1].seq}-{len(items)}")

    def _task(self, fn: Any, args: tuple, key: str) -> Any:
        """Submit ``fn(token, payload, *args)`` as one task, wait for it (cancellable), account its times."""
        t = time.perf_counter()
        fut = self.client.submit(fn, self.token, self._payload, *args, pure=False, key=key)
        with self._lock:
            self._futures.add(fut)
        try:
            out, compute = self._wait(fut)
        finally:
            with self._lock:
                self._futures.discard(fut)
        self.times.add(compute, time.perf_counter() - t)
        return out

    def time_on_worker(self, items: list[tuple[dict[str, Any], BatchInfo]], limit_s: float) -> list[float]:
        """Seconds per batch of the stage on one worker of the cluster (:func:`time_calls`, timed inside the
        task: no per-task overhead, no moving batches), after :meth:`start`."""
        worker = next(iter(self.client.scheduler_info(n_workers=-1)["workers"]))
        fut = self.client.submit(time_batches, self.token, self._payload, items, limit_s, workers=[worker],
                                 allow_other_workers=False, pure=False, key=f"{self.token}-timed")
        with self._lock:
            self._futures.add(fut)
        try:
            return self._wait(fut)
        finally:
            with self._lock:
                self._futures.discard(fut)

    def _wait(self, fut: Any) -> tuple[Any, float]:
        done = done_event(fut)
        while not done.wait(_POLL_S):
            if self.stop.is_set():
                fut.cancel()
                raise WorkerStopped(f"stream stopped while stage {self.name!r} worked on the cluster",
                                    stage=self.name)
        return fut.result()

    def note(self, node: Any) -> str:
        """What the stream's notes say about this stage's dask workers."""
        t = self.times
        return (f"{node.name!r}: {self.count} dask worker{'s' if self.count != 1 else ''} on the cluster, the stage "
                f"sent to them in {t.start_s:.2f} s before the stream's clock; of its {node.stats.busy_s:.2f} s "
                f"busy, {t.compute_s:.2f} s computing on the workers, {t.round_trip_s - t.compute_s:.2f} s "
                "moving batches and waiting for the scheduler")

    def close(self) -> None:
        """Cancel the batches still on the cluster and release the stage."""
        with self._lock:
            futs = list(self._futures)
            self._futures.clear()
        with contextlib.suppress(Exception):
            if futs:
                self.client.cancel(futs, force=True)
            if self._payload is not None:
                self._payload.release()
        self._payload = None


# -- a stream pipeline on a cluster ---------------------------------------------------------------
def dask_config(pipeline: Any, devices: dict[str, Any], config: StreamConfig | None, threads: int) -> StreamConfig:
    """``config`` with dask workers for every per-batch CPU stage of the streams (but those whose kind it names).

    A stage without its own worker count gets ``threads`` (the cluster's), when the
    config leaves workers at the default; a sequential config (``workers=0``) is
    left as it is (the reference run stays here), and so is a config that already
    names stages with ``dask`` workers (a plan that chose which stages go to the
    cluster, :mod:`placer.stream.offload`): its other stages run here.
    """
    cfg = config or StreamConfig()
    if cfg.sequential or "dask" in cfg.worker_kind.values():
        return cfg  # a config that names its cluster stages (a plan's) is taken as it is: the others stay here
    kinds, counts = dict(cfg.worker_kind), dict(cfg.stage_workers)
    default = "workers" not in cfg.model_fields_set
    for members in pipeline.streams().values():
        for m in members[1:-1]:
            if devices[m].is_accelerator or m in kinds:
                continue  # a GPU stage, or one whose kind is named (processes or threads here)
            kinds[m] = "dask"
            if default and m not in counts:
                counts[m] = max(1, threads)
    return cfg.model_copy(update={"worker_kind": kinds, "stage_workers": counts})


def run_stream_on_cluster(pipeline: Any, placement: Any, scheduler: Any, *, stream: StreamConfig | None = None,
                          executor: str = "auto", workers: int | None = None, size: int | None = None,
                          stage_timeout: float | None = None):
    """Run a pipeline with streams here, its streams' CPU per-batch stages on the cluster at ``scheduler``.

    Returns
    -------
    Run
        As :func:`placer.executor.execute`; each offloaded stage's stream record
        says ``worker_kind="dask"``.
    """
    from placer.executor import Prepared  # the package imports this module's siblings first

    p = as_pipeline(pipeline)
    p.validate()
    inventory = discover()
    devices = resolve(p, placement, inventory)  # once: the stream settings and the run both use it
    with connect(scheduler) as client:
        threads = sum(w.get("nthreads", 1) for w in client.scheduler_info(n_workers=-1)["workers"].values())
        cfg = dask_config(p, devices, stream, threads)
        with using_client(client), Prepared(p, executor=executor, workers=workers, inventory=inventory,
                                            devices=devices, size=size, stream=cfg,
                                            stage_timeout=stage_timeout) as prepared:
            return prepared.run()


def stage_ratio(client: Any, call: StageCall, name: str, items: list[tuple[dict[str, Any], BatchInfo]], *,
                limit_s: float = 1.0, timeout_s: float = 60.0) -> tuple[float, float, float]:
    """A stage's per-batch seconds on a worker of ``client``'s cluster over here, on the same batches.

    The stage travels as a run ships it (:class:`DaskPool`: its modules as source, the stage pickled and
    loaded on every worker); one task on one worker times it on ``items`` (:func:`time_calls`: a warm-up
    call, then each call timed, for about ``limit_s``), and this process times it the same way.

    Returns
    -------
    (ratio, seconds there, seconds here)
        The medians' ratio and the medians.

    Raises
    ------
    PlacerError
        The stage cannot travel, failed there, or took over ``timeout_s`` (then cancelled).
    """
    import statistics

    stop = threading.Event()
    timer = threading.Timer(timeout_s, stop.set)
    with using_client(client):
        pool = DaskPool(name, call, 1, stop)
    try:
        timer.start()
        pool.start()
        try:
            there = statistics.median(pool.time_on_worker(items, limit_s))
        except WorkerStopped:
            raise PlacerError(f"stage {name!r} took over {timeout_s:g} s to time on the cluster's worker",
                              stage=name) from None
    finally:
        timer.cancel()
        pool.close()
    here = statistics.median(time_calls(call, items, limit_s))
    return (there / here if here > 0 else 1.0), there, here


__all__ = ["DaskPool", "dask_config", "run_batch", "run_batches", "run_stream_on_cluster", "stage_ratio",
           "time_batches", "using_client"]
