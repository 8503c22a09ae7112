"""Calling one stage's implementation on one device, and bounding how long it may take.

May import: numpy, placer.pipeline, placer.devices, placer.errors, placer.executor.transfer;
dask and ctypes inside functions.

Stopping a stage. Python cannot kill a thread, but it can raise an exception in one
(``PyThreadState_SetAsyncExc``): :func:`stop_thread` raises :class:`StopStage` there,
which lands at the thread's next Python instruction, so a stage stops within one
iteration of its Python loop, or as soon as the numpy/torch call it is inside
returns (a long C call, such as one ``time.sleep``, finishes first). ``StopStage``
derives from ``BaseException``, so a stage's own ``except Exception`` does not
swallow it. :func:`time_limit` uses it to end a call that overruns its seconds
with :class:`StageTimeoutError`; the engine uses it to stop the stages running when
a run is interrupted or a stage overruns ``stage_timeout``.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from placer.devices import Device
from placer.errors import PipelineError, PlacerError
from placer.executor.transfer import adapt, normalize_output, synchronize
from placer.pipeline import Stage

#: a data-parallel stage is split only when each partition gets at least this many rows
MIN_ROWS_PER_PARTITION = 4096


class StageTimeoutError(PlacerError):
    """A stage ran longer than it was allowed to, and was stopped."""

    def __init__(self, message: str, *, stage: str, seconds: float):
        super().__init__(message, stage=stage)
        self.seconds = seconds


class StopStage(BaseException):
    """Raised asynchronously in a thread whose stage must stop (see :func:`stop_thread`)."""


def stop_thread(ident: int, exc: type[BaseException] = StopStage) -> bool:
    """Raise ``exc`` (a class; :class:`StopStage` by default) in the thread ``ident`` at its next Python instruction."""
    import ctypes

    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))
    return done == 1


#: why a stage has a time limit, unless told more precisely
LIMIT_WHY = "the stage timeout: --stage-timeout, or while profiling the budget"


def timeout_message(stage: str, seconds: float, why: str = LIMIT_WHY) -> str:
    """The error text for a stage that ran out of time."""
    return (f"stage {stage!r} did not finish within {seconds:g} s ({why}) and was stopped; "
            "raise the limit (--stage-timeout SECONDS, --budget-s) or make the stage faster")


@contextlib.contextmanager
def time_limit(seconds: float | None, stage: str, *, why: str = LIMIT_WHY) -> Iterator[None]:
    """Stop the block with :class:`StageTimeoutError` when it runs longer than ``seconds`` (None: no limit).

    The block runs in the calling thread; a timer thread raises :class:`StopStage`
    in it when time is up, which this turns into the error.
    """
    if seconds is None:
        yield
        return
    ident, lock = threading.get_ident(), threading.Lock()
    state = {"armed": True, "fired": False}

    def fire() -> None:
        with lock:
            if state["armed"]:
                state["fired"] = stop_thread(ident)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        try:
            yield
        finally:
            with lock:
                state["armed"] = False
            timer.cancel()
    except StopStage:
        if not state["fired"]:
            raise
        raise StageTimeoutError(timeout_message(stage, seconds, why), stage=stage, seconds=seconds) from None


_DEFAULT_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar("stage_timeout", default=None)


@contextlib.contextmanager
def stage_timeout(seconds: float | None) -> Iterator[None]:
    """Inside the block, runs and profiling bound every stage to ``seconds`` unless told otherwise."""
    if seconds is not None and not (seconds > 0 and seconds != float("inf")):
        raise ValueError(f"the stage timeout must be a positive number of seconds, got {seconds!r}")
    token = _DEFAULT_TIMEOUT.set(seconds)
    try:
        yield
    finally:
        _DEFAULT_TIMEOUT.reset(token)


def default_stage_timeout() -> float | None:
    """The stage timeout set by :func:`stage_timeout` around this call (None: none)."""
    return _DEFAULT_TIMEOUT.get()


def call_stage(stage: Stage, device: Device, inputs: dict[str, Any], *, workers: int = 1,
               extra: dict[str, Any] | None = None) -> Any:
    """Run ``stage`` on ``device`` with ``inputs`` already at the device's location.

    Inputs are adapted to the implementation's data format, parameters and (when
    the implementation takes it) ``device=`` are passed as keywords, the device is
    synchronised before returning, and the output is put in canonical form for the
    device (see :func:`placer.executor.transfer.normalize_output`). ``extra``
    keywords (a stream's ``batch_info``, a step's ``state``) are passed as they are.

    Parameters
    ----------
    stage : Stage
        The stage to call.
    device : Device
        Where it runs; its kind picks the implementation (``cpu`` or ``gpu``).
    inputs : dict
        Argument name → value, already at ``device``'s location.
    workers : int
        CPU workers a ``data_parallel`` stage may split its rows over.
    extra : dict, optional
        More keywords passed as they are.

    Returns
    -------
    object
        The stage's output, in canonical form for the device.
    """
    impl = stage.impl_for(device.driver.implementation)
    if impl is None:
        raise PipelineError(
            f"stage {stage.name!r} has no implementation for {device.name}", stage=stage.name
        )
    kwargs = {a: adapt(v, impl.api, device) for a, v in inputs.items()}
    if stage.params:
        kwargs.update(stage.params)
    if extra:
        kwargs.update(extra)
    if impl.takes_device:
        kwargs["device"] = device.torch_device()
    if stage.data_parallel and not device.is_accelerator and workers > 1:
        out = _data_parallel(stage, impl.fn, kwargs, workers)
    else:
        out = impl.fn(**kwargs)
    synchronize(device, impl.api)
    return normalize_output(out, device)


def _rows(v: Any) -> int | None:
    if isinstance(v, np.ndarray) and v.ndim >= 1:
        return v.shape[0]
    if hasattr(v, "iloc") and hasattr(v, "__len__"):
        return len(v)
    if hasattr(v, "shape") and hasattr(v, "dim") and v.dim() >= 1:  # torch tensor
        return int(v.shape[0])
    return None


def _split(v: Any, parts: int) -> list[Any]:
    n = _rows(v)
    bounds = [n * i // parts for i in range(parts + 1)]
    if hasattr(v, "iloc"):
        return [v.iloc[a:b] for a, b in zip(bounds, bounds[1:])]
    return [v[a:b] for a, b in zip(bounds, bounds[1:])]


def _concat(parts: list[Any], stage: str) -> Any:
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(_concat([p[i] for p in parts], stage) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts], stage) for k in first}
    if isinstance(first, np.ndarray):
        return np.concatenate(parts, axis=0)
    if hasattr(first, "iloc"):
        import pandas as pd

        return pd.concat(parts)
    if hasattr(first, "dim"):
        import torch

        return torch.cat(parts, 0)
    raise PipelineError(
        f"stage {stage!r} is declared data_parallel but returned {type(first).__name__}; "
        "a data-parallel stage must return arrays (or tuples/dicts of arrays) split along rows",
        stage=stage,
    )


def _data_parallel(stage: Stage, fn, kwargs: dict[str, Any], workers: int) -> Any:
    """Split row-wise inputs into partitions and compute them with dask's threaded scheduler."""
    import dask

    data_args = {k: v for k, v in kwargs.items() if k in stage.inputs and _rows(v) is not None}
    if not data_args:
        return fn(**kwargs)
    lengths = {k: _rows(v) for k, v in data_args.items()}
    if len(set(lengths.values())) != 1:
        raise PipelineError(
            f"stage {stage.name!r} is data_parallel but its inputs have different row counts "
            f"{lengths}; make the inputs row-aligned or drop data_parallel",
            stage=stage.name,
        )
    n = next(iter(lengths.values()))
    parts = min(workers, max(1, n // MIN_ROWS_PER_PARTITION))
    if parts <= 1:
        return fn(**kwargs)
    split = {k: _split(v, parts) for k, v in data_args.items()}
    tasks = [
        dask.delayed(fn, pure=False)(**{**kwargs, **{k: split[k][i] for k in split}})
        for i in range(parts)
    ]
    results = dask.compute(*tasks, scheduler="threads", num_workers=parts)
    return _concat(list(results), stage.name)
