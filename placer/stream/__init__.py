"""Streams of minibatches: a source, per-batch stages, and a step that consumes them.

May import: placer.stream.*. Import cost stays low: torch is reached only when a
source returns a Dataset or DataLoader, or a stage runs on a GPU.

A stream is declared in a pipeline with :meth:`placer.Pipeline.source`, per-batch
stages (any stage reading the source or another per-batch stage) and
:meth:`placer.Pipeline.step`. :func:`placer.execute` runs it with bounded queues
between stages (:mod:`placer.stream.runner`), CPU stages with parallel workers, a
GPU stage on its own CUDA stream, batches kept in order; ``run.streams`` records
throughput, each stage's busy, starved and blocked time, and the queues.
"""

from placer.stream.config import BatchInfo, StreamConfig
from placer.stream.runner import StreamFailed, StreamRun
from placer.stream.dropin import LoaderAdvice, LoaderSettings, MeasuredLoader, advise_loader, measure

__all__ = ["BatchInfo", "StreamConfig", "StreamFailed", "StreamRun"]
__all__ += ["LoaderAdvice", "LoaderSettings", "MeasuredLoader", "advise_loader", "measure"]
