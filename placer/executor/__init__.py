"""Running a pipeline under a placement.

May import: placer.pipeline, placer.devices, placer.placement, placer.digest, placer.errors,
placer.precision, placer.data.run, placer.timing (settle_allocator) and the modules of this package.
Device libraries (torch, numba.cuda, dask) are touched only inside the functions that need them.

Examples
--------
>>> from placer import Pipeline, execute
>>> p = Pipeline("demo")
>>> @p.stage()
... def numbers(device):
...     import torch
...     return torch.arange(4.0, device=device)
>>> @p.stage()
... def total(numbers, device):
...     return numbers.sum()
>>> run = execute(p, "all=cpu")
>>> float(run.final_outputs["total"])
6.0
>>> [s.device for s in run.stages]
['cpu', 'cpu']
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from placer.devices import Device, Inventory, discover
from placer.digest import outputs_digest
from placer.errors import StageFailedError
from placer.executor.engine import Engine, InlineLanes, ThreadLanes
from placer.data.run import Run, StageRecord, StreamStats, TransferRecord
from placer.executor.stagecall import StageTimeoutError, call_stage, default_stage_timeout, stage_timeout
from placer.executor.stream.config import StreamConfig
from placer.executor.stream.runner import StreamFailed
from placer.executor.stream.task import collapse, member_records
from placer.executor.transfer import to_location
from placer.pipeline import Pipeline, as_pipeline
from placer.placement import resolve
from placer.precision import parse_precision_option
from placer.timing import settle_allocator

__all__ = [
    "Prepared",
    "Run",
    "StageRecord",
    "TransferRecord",
    "call_stage",
    "choose_lanes",
    "execute",
    "prepare",
    "stage_timeout",
    "to_location",
]


def choose_lanes(pipeline: Pipeline, devices: dict[str, Device], executor: str, workers: int):
    """Pick the lanes: ``inline`` when nothing can overlap (a chain), else ``threads``.

    ``executor`` may force ``"inline"`` (everything in the calling thread, lowest
    overhead) or ``"threads"`` (concurrent lanes).
    """
    if executor == "auto":
        g = pipeline.graph
        chain = all(g.out_degree(n) <= 1 and g.in_degree(n) <= 1 for n in g) and (
            sum(1 for n in g if g.in_degree(n) == 0) == 1
        )
        executor = "inline" if chain else "threads"
    if executor == "inline":
        return InlineLanes(workers)
    if executor == "threads":
        acc = sorted({d.name for d in devices.values() if d.is_accelerator})
        return ThreadLanes(workers, acc)
    raise ValueError(f"unknown executor {executor!r}; use auto, inline or threads")


class Prepared:
    """A pipeline validated and placed once, ready to run many times.

    For request-by-request serving, prepare once and call :meth:`run` per request:
    validation, device resolution and the engine's bookkeeping are not repeated, so
    the executor adds only microseconds per stage.
    Use as a context manager, or call :meth:`close`, to stop its worker threads.

    The arguments are :func:`execute`'s; ``devices`` is a placement already resolved
    against ``inventory`` (:func:`placer.placement.resolve`), used as it is, so a
    caller that needed the devices first resolves the placement only once.
    """

    def __init__(self, pipeline: Any, placement: Any = None, *, executor: str = "auto",
                 workers: int | None = None, inventory: Inventory | None = None, size: int | None = None,
                 lanes: Any = None, stream: StreamConfig | None = None, stage_timeout: float | None = None,
                 devices: dict[str, Device] | None = None, precision: Any = None):
        p = as_pipeline(pipeline)
        p.validate()
        chosen = run_precisions(p, placement, precision)
        if chosen:
            p = p.with_precision(chosen)
        self.pipeline = p
        self.inventory = inv = inventory or discover()
        self.devices = dict(devices) if devices is not None else resolve(p, placement, inv)
        cpu = inv.get("cpu")
        self.workers = int(workers or (cpu.workers if cpu else 1))
        self._streams: list[StreamStats] = []
        timeout = stage_timeout if stage_timeout is not None else default_stage_timeout()
        run_p, run_devices = collapse(p, self.devices, stream or StreamConfig(), cpu, self._streams, timeout)
        self.lanes = lanes if lanes is not None else choose_lanes(run_p, run_devices, executor, self.workers)
        self.engine = Engine(run_p, run_devices, self.lanes, timeout_s=timeout,
                             streams=[n for n in run_p.stages if n not in p.stages or p.stages[n].role == "step"])
        self.size = size if size is not None else p.size
        self._placement = {n: d.name for n, d in self.devices.items()}
        self._labels = {d.name: d.label for d in self.devices.values()}
        self._versions = {k: str(v) if v is not None else None for k, v in inv.host.items()
                          if k in ("python", "torch", "numba")}

    def run(self, *, digest: bool = True) -> Run:
        """Run once; see :func:`execute` for what is returned and raised."""
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self._streams.clear()
        try:
            outputs, final, stage_recs, transfer_recs, failure, makespan = self.engine.run()
        except BaseException as exc:  # interrupted: the partial record travels with the exception
            partial = getattr(exc, "placer_partial", None)
            if partial is not None:
                exc.run = self._record(started, *partial[2:4], partial[5], partial[0])
            raise
        if self._streams or failure is not None:
            stage_recs, failure = self._expand_streams(stage_recs, outputs, failure)
        collect = getattr(self.lanes, "collect", None)
        if collect is not None:  # lanes whose outputs live elsewhere bring the final ones here (all, on failure)
            outputs, final = collect(outputs, final, everything=failure is not None)
        run = self._record(started, stage_recs, transfer_recs, makespan, outputs)
        if failure is not None:
            name, exc = failure
            run.error = f"{type(exc).__name__}: {exc}"
            run.failed_stage = name
            own = isinstance(exc, (StreamFailed, StageTimeoutError))
            what = str(exc) if own else f"stage {name!r} failed: {type(exc).__name__}: {exc}"
            raise StageFailedError(
                what.replace(f"stage {name!r} failed", f"stage {name!r} failed on {self.devices[name].name}", 1),
                stage=name,
                outputs=dict(outputs),
                run=run,
            ) from exc
        run._final = final
        if digest:
            run.outputs_digest = outputs_digest(final)
        return run

    def _record(self, started: str, stage_recs: list, transfer_recs: list, makespan: float, outputs: dict) -> Run:
        """The run record (no digest yet) of what the engine reported."""
        stages = self.pipeline.stages
        for rec in stage_recs:
            st = stages.get(rec.name)
            if st is not None:
                rec.precision = st.run_precision
        stage_recs.sort(key=_start)
        transfer_recs.sort(key=_start)
        run = Run.model_construct(
            pipeline=self.pipeline.name, size=self.size, size_unit=self.pipeline.size_unit,
            placement=dict(self._placement),
            executor=self.lanes.name, workers=self.workers, makespan_s=makespan,
            stages=stage_recs, transfers=transfer_recs, outputs_digest=None,
            devices=dict(self._labels), started_at=started, versions=dict(self._versions),
            error=None, failed_stage=None, streams=list(self._streams),
        )
        run._outputs = outputs
        return run

    def _expand_streams(self, recs: list, outputs: dict, failure: Any) -> tuple[list, Any]:
        """Member records in place of each stream's record; a failing member named as the failed stage."""
        by_step = {s.step: s for s in self._streams}
        out = []
        for r in recs:
            out.extend(member_records(r, by_step[r.name]) if r.name in by_step else [r])
        if failure is not None and isinstance(failure[1], StreamFailed):
            exc = failure[1]
            step = next(ms[-1] for ms in self.pipeline.streams().values() if exc.stage in ms)
            if exc.state is not None:
                outputs[step] = exc.state
            failure = (exc.stage, exc)
        return out, failure

    def close(self) -> None:
        self.lanes.close()

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _start(rec) -> float:
    return rec.start_s


def run_precisions(pipeline: Pipeline, placement: Any, precision: Any) -> dict[str, str]:
    """Stage → precision to run in: a plan's (``placement.precision``), then ``precision``
    (a mapping, or ``--precision``'s text ``"train=bf16"``) over it; fp32 entries dropped.

    A precision named here is the user's choice, so it need not be among the stage's
    allowed ones. Raises :class:`~placer.errors.PlacementError` naming an unknown stage
    or precision.
    """
    out: dict[str, str] = {}
    planned = getattr(placement, "precision", None)
    if isinstance(planned, dict):
        out.update(planned)
    if isinstance(precision, str):
        _, fixed = parse_precision_option(precision, pipeline.stages)
        out.update(fixed)
    elif precision:
        for n, v in dict(precision).items():
            _, fixed = parse_precision_option(f"{n}={v}", pipeline.stages)
            out.update(fixed)
    return {n: v for n, v in out.items() if v != "fp32"}


def prepare(pipeline: Any, placement: Any = None, **kwargs: Any) -> Prepared:
    """Validate and place ``pipeline`` once; see :class:`Prepared` and :func:`execute`."""
    return Prepared(pipeline, placement, **kwargs)


def execute(
    pipeline: Any,
    placement: Any = None,
    *,
    executor: str = "auto",
    workers: int | None = None,
    inventory: Inventory | None = None,
    size: int | None = None,
    scheduler: Any = None,
    stream: StreamConfig | None = None,
    stage_timeout: float | None = None,
    precision: Any = None,
) -> Run:
    """Run ``pipeline`` with every stage on the device the placement gives it.

    Parameters
    ----------
    pipeline : Pipeline or networkx.DiGraph
    placement : str, mapping, Plan or None
        ``"all=cpu"``, ``"all=cpu,train=gpu"``, ``{"train": "gpu"}`` (missing stages
        go to the CPU), or any object with a ``placement`` mapping (a Plan).
        ``None`` places everything on the CPU.
    executor : {"auto", "inline", "threads"}
        How lanes run work (see :func:`choose_lanes`).
    workers : int, optional
        CPU stages that may run at once; default: the CPU device's workers.
    inventory : Inventory, optional
        The devices to run on (default: discovered on this machine).
    size : int, optional
        The size the pipeline was built at, recorded in the run (default: the
        pipeline's own ``size``).
    scheduler : str or distributed.Client, optional
        Run on this dask.distributed cluster instead (an address such as
        ``tcp://10.0.0.5:8786``, or a Client); see
        :mod:`placer.executor.distributed`. ``run.outputs`` then holds only the
        final outputs: the others stay on the workers and are released. A
        pipeline with streams runs here, with its streams' CPU per-batch stages as
        tasks on the cluster (:mod:`placer.executor.stream.dask_workers`).
    stream : StreamConfig, optional
        How the pipeline's streams run: workers per stage, prefetch depth, pinned
        copies, a cache point (default: :class:`~placer.executor.stream.config.StreamConfig`'s).
        ``run.streams`` then holds each stream's throughput and accounting.
    stage_timeout : float, optional
        Seconds a one-shot stage may run before it is stopped and the run fails
        with :class:`~placer.executor.stagecall.StageTimeoutError` (named in the
        :class:`StageFailedError`); finished stages' outputs are kept. Default:
        the one set by :func:`stage_timeout` around the call, else none.
    precision : mapping or str, optional
        Stage → the precision it runs in (``{"train": "bf16"}`` or ``"train=bf16"``;
        see :mod:`placer.precision`), over a plan's own. Default: a plan's, else
        fp32 everywhere (nothing changes numerics). Each stage's record says its precision.

    Returns
    -------
    Run
        Timeline, transfers, digest; ``run.outputs`` holds every stage's output and
        ``run.final_outputs`` the sinks' outputs on the host.

    Raises
    ------
    StageFailedError
        When a stage raises or overruns ``stage_timeout``; ``.outputs`` keeps what
        finished before, ``.run`` the partial timeline.
    KeyboardInterrupt
        On Ctrl-C: the stages running on every lane are stopped; the exception
        carries ``.running`` (their names), ``.outputs`` (what finished) and ``.run``.
    """
    settle_allocator()  # the allocator state the profile measured in (placer.timing)
    if scheduler is not None:
        from placer.executor.distributed import run_on_cluster

        p = as_pipeline(pipeline).validate()
        chosen = run_precisions(p, placement, precision)
        if chosen:
            pipeline = p.with_precision(chosen)
        if p.streams():
            from placer.executor.stream.dask_workers import run_stream_on_cluster

            return run_stream_on_cluster(pipeline, placement, scheduler, stream=stream, executor=executor,
                                         workers=workers, size=size, stage_timeout=stage_timeout)
        return run_on_cluster(pipeline, placement, scheduler, workers=workers, size=size,
                              stage_timeout=stage_timeout)
    with Prepared(pipeline, placement, executor=executor, workers=workers,
                  inventory=inventory, size=size, stream=stream, stage_timeout=stage_timeout,
                  precision=precision) as prepared:
        return prepared.run()
