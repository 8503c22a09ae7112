"""Calling one stage's implementation on one device, and bounding how long it may take.

May import: numpy, placer.pipeline, placer.devices, placer.errors, placer.precision,
placer.executor.transfer; dask and ctypes inside functions.

Stopping a stage. Python cannot kill a thread, but it can raise an exception in one
(``PyThreadState_SetAsyncExc``): :func:`stop_thread` raises :class:`StopStage` there,
which lands at the thread's next Python instruction, so a stage stops within one
iteration of its Python loop, or as soon as the numpy/torch call it is inside
returns. ``StopStage`` derives from ``BaseException``, so a stage's own
``except Exception`` does not swallow it.

A stage blocked inside one long call that Python cannot interrupt (``time.sleep(1e6)``,
a read that never returns, a deadlocked library) never reaches its next instruction.
So a time limit is kept by the thread that *waits* for the stage, never by the thread
running it: :func:`call_with_limit` runs the call in a thread of its own and waits at
most its seconds; when they are up it tells the stage to stop, gives it
:data:`STOP_WAIT_S` to leave, and then raises :class:`StageTimeoutError` either way.
A stage that did not leave is *abandoned*: its thread (a daemon thread) goes on until
its call returns or the process ends, and :func:`abandoned_stages` names it, so that
the command line can end the process at once rather than wait for threads the stage
started (a ``concurrent.futures`` pool, dask's local threads, joined at exit).

Which lanes stop the stage itself and which only stop waiting for it (see
``docs/timeouts.md``): a stage in a **worker process** (a stream's process workers) is
killed; a stage in a **thread** (the inline lane with a timeout, thread lanes, a
stream's thread workers and its step, profiling) is stopped when it runs Python code
and otherwise abandoned; a stage on a **dask cluster** worker is cancelled there and
stopped the same way in the worker's thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from placer.devices import Device
from placer.errors import PipelineError, PlacerError
from placer.executor.transfer import adapt, normalize_output, synchronize
from placer.pipeline import Stage
from placer.precision import running_in

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
#: how long a stage told to stop gets to leave before placer stops waiting for it
STOP_WAIT_S = 1.0
#: seconds between checks while a caller waits for a stage (so that Ctrl-C reaches the waiting thread)
_WAIT_SLICE_S = 0.1

#: stages given up on whose threads may still run: (stage, thread)
_ABANDONED: list[tuple[str, threading.Thread]] = []
_ABANDONED_LOCK = threading.Lock()


def timeout_message(stage: str, seconds: float, why: str = LIMIT_WHY, *, stopped: bool = True) -> str:
    """The error text for a stage that ran out of time (``stopped``: whether its call ended, or was abandoned)."""
    what = "was stopped" if stopped else (
        "could not be stopped (it is blocked in a call Python cannot interrupt), so placer stopped waiting "
        "for it")
    return (f"stage {stage!r} did not finish within {seconds:g} s ({why}) and {what}; "
            "raise the limit (--stage-timeout SECONDS, --budget-s) or make the stage faster")


def abandon_thread(stage: str, thread: threading.Thread) -> None:
    """Note that ``stage``, running in ``thread``, was given up on (see :func:`abandoned_stages`)."""
    with _ABANDONED_LOCK:
        _ABANDONED.append((stage, thread))


def abandoned_stages() -> list[str]:
    """Stages given up on (timed out or interrupted) whose threads still run in this process."""
    with _ABANDONED_LOCK:
        _ABANDONED[:] = [(n, t) for n, t in _ABANDONED if t.is_alive()]
        return list(dict.fromkeys(n for n, _ in _ABANDONED))


def wait_for(thread: threading.Thread, seconds: float | None) -> bool:
    """Join ``thread`` for at most ``seconds`` (None: until it ends), in short slices; True if it ended."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while thread.is_alive():
        left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
        if left <= 0:
            break
        thread.join(left)
    return not thread.is_alive()


def call_with_limit(fn: Callable[[], Any], seconds: float | None, stage: str, *, why: str = LIMIT_WHY) -> Any:
    """``fn()``, ended with :class:`StageTimeoutError` when it runs longer than ``seconds`` (None: no limit).

    With a limit, ``fn`` runs in a daemon thread of its own (in a copy of the caller's
    context) and the caller waits: at the limit the stage is told to stop
    (:func:`stop_thread`) and gets :data:`STOP_WAIT_S` to leave; the error follows
    whether it left or not (one that did not is abandoned, see
    :func:`abandoned_stages`). What ``fn`` raises is raised here; so is an interrupt
    of the waiting thread (Ctrl-C), after the stage was told to stop.
    """
    if seconds is None:
        return fn()
    box: dict[str, Any] = {}
    ctx = contextvars.copy_context()

    def target() -> None:
        try:
            box["value"] = ctx.run(fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    t = threading.Thread(target=target, name=f"placer-stage-{stage}", daemon=True)
    t.start()
    try:
        finished = wait_for(t, seconds)
    except BaseException:  # the waiting thread was interrupted: the stage stops too
        _stop_or_abandon(stage, t)
        raise
    if not finished:
        stopped = _stop_or_abandon(stage, t)
        raise StageTimeoutError(timeout_message(stage, seconds, why, stopped=stopped), stage=stage, seconds=seconds)
    if "error" in box:
        exc = box.pop("error")
        try:
            raise exc
        finally:
            del exc
    return box.get("value")


def _stop_or_abandon(stage: str, t: threading.Thread) -> bool:
    """Tell ``t`` to stop and wait :data:`STOP_WAIT_S` for it; True if it ended, else it is abandoned."""
    if t.ident is not None and t.is_alive():
        stop_thread(t.ident)
    if wait_for(t, STOP_WAIT_S):
        return True
    abandon_thread(stage, t)
    return False


class CallWatch:
    """Calls made in several threads, each bounded by ``seconds``, kept by the thread that waits for them.

    A stream's workers call its stages batch after batch; each call goes through
    :meth:`call`, and the thread waiting for the workers checks them with :meth:`wait`.
    A call over its time is told to stop (a thread's call; a call whose work runs
    elsewhere, ``stoppable=False``, is stopped by the ``stop`` event its waiting code
    polls: a worker process is killed) and the workers get :data:`STOP_WAIT_S` to leave;
    the ones that do not are abandoned. With ``seconds`` None, :meth:`call` is a plain call.
    """

    def __init__(self, seconds: float | None, *, why: str = LIMIT_WHY):
        self.seconds, self.why = seconds, why
        #: thread ident -> (stage, when the call began, the caller's key, stoppable), while a call runs
        self._calls: dict[int, tuple[str, float, Any, bool]] = {}
        #: the first call found over its time: (stage, key, thread ident)
        self.overdue: tuple[str, Any, int] | None = None

    def call(self, stage: str, fn: Callable[..., Any], *args: Any, key: Any = None, stoppable: bool = True) -> Any:
        """``fn(*args)``, watched as a call of ``stage`` (``key``: what the caller needs to report it)."""
        if self.seconds is None:
            return fn(*args)
        me = threading.get_ident()
        self._calls[me] = (stage, time.monotonic(), key, stoppable)
        try:
            return fn(*args)
        except StopStage:
            raise StageTimeoutError(timeout_message(stage, self.seconds, self.why), stage=stage,
                                    seconds=self.seconds) from None
        finally:
            self._calls.pop(me, None)

    def check(self) -> bool:
        """Whether a call ran over its time (the first found is told to stop and kept in :attr:`overdue`)."""
        if self.seconds is None or self.overdue is not None:
            return self.overdue is not None
        t = time.monotonic()
        for ident, (stage, t0, key, stoppable) in list(self._calls.items()):
            if t - t0 > self.seconds:
                self.overdue = (stage, key, ident)
                if stoppable:
                    stop_thread(ident)
                return True
        return False

    def wait(self, threads: list[threading.Thread], stop: threading.Event) -> StageTimeoutError | None:
        """Join ``threads``; when a call runs over its time, set ``stop``, give them :data:`STOP_WAIT_S`
        to leave (abandoning the rest) and return the error naming the stage (None: all ended in time)."""
        for t in threads:
            while t.is_alive():
                t.join(_WAIT_SLICE_S)
                if self.check():
                    return self._give_up(threads, stop)
        return None

    def _give_up(self, threads: list[threading.Thread], stop: threading.Event) -> StageTimeoutError:
        stop.set()
        stage, _, ident = self.overdue
        deadline = time.monotonic() + STOP_WAIT_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in threads if t.is_alive()]
        for t in stuck:
            abandon_thread(stage, t)
        stopped = all(t.ident != ident for t in stuck)
        return StageTimeoutError(timeout_message(stage, self.seconds, self.why, stopped=stopped), stage=stage,
                                 seconds=self.seconds)


def without_stop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for a thread's target: a :class:`StopStage` that lands after its stage's call ended ends the
    thread quietly (not as an unhandled exception on stderr)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StopStage:
            return None

    return run


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
    The call runs in the stage's ``run_precision`` (:func:`placer.precision.running_in`;
    torch's settings are restored after it, also when it raises).

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
    with running_in(stage.run_precision, device):
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
