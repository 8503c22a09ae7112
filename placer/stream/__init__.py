"""Streams of minibatches: a source, per-batch stages, and a step that consumes them.

May import: placer.stream.*, placer.data.stream, placer.executor.stream (whose runner names it
re-exports), placer.executor.stream.{threadloader,worker_init}. Import cost stays low: torch is reached only when a
source returns a Dataset or
DataLoader, or a stage runs on a GPU.

A stream is declared in a pipeline with :meth:`placer.Pipeline.source`, per-batch
stages (any stage reading the source or another per-batch stage) and
:meth:`placer.Pipeline.step`. :func:`placer.execute` runs it with bounded queues
between stages (:mod:`placer.executor.stream`, part of the executor), CPU stages with parallel workers, a
GPU stage on its own CUDA stream, batches kept in order; ``run.streams`` records
throughput, each stage's busy, starved and blocked time, and the queues.

:func:`plan_stream` (:mod:`placer.stream.planner`) chooses how a stream runs: it
profiles it (:mod:`placer.stream.profile`), predicts the throughput of every
candidate (:mod:`placer.stream.model`) and returns a
:class:`~placer.data.stream.StreamPlan`.

This package is the advising side: it imports the executor, never the other way
round. The runner's names (``StreamConfig``, ``BatchInfo``, ``StreamRun``,
``StreamFailed``, ``interrupt``) are re-exported from :mod:`placer.executor.stream`;
the planner's and the drop-in's are loaded on first use.
"""

from importlib import import_module
from typing import Any

from placer.data.stream import LoaderSettings, StreamSettings
from placer.executor.stream import BatchInfo, StreamConfig, StreamFailed, StreamRun, interrupt

_LAZY = {
    "plan_stream": "placer.stream.planner",
    "stream_config": "placer.stream.planner",
    "profile_stream": "placer.stream.profile",
    "predict": "placer.stream.model",
    "LoaderAdvice": "placer.stream.dropin",
    "MeasuredLoader": "placer.stream.dropin",
    "advise_loader": "placer.stream.dropin",
    "measure": "placer.stream.dropin",
    "ThreadLoader": "placer.executor.stream.threadloader",
    "WorkerThreads": "placer.executor.stream.worker_init",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'placer.stream' has no attribute {name!r}")
    return getattr(import_module(mod), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["BatchInfo", "LoaderSettings", "StreamConfig", "StreamFailed", "StreamRun", "StreamSettings", "interrupt",
           *_LAZY]
