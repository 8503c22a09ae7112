"""Running streams of minibatches: one more way the engine runs a part of the graph.

May import: placer.executor.stream.*.

The engine runs each stream of a pipeline as one task (:mod:`.task`); inside it
:class:`~placer.executor.stream.runner.StreamRun` lays the stream out as a chain of
nodes (:mod:`.chain`, :mod:`.nodes`), reads the source (:mod:`.source`) and runs
each node in its workers: threads, child processes (:mod:`.workers`) or tasks on
a dask cluster (:mod:`.dask_workers`). :class:`~placer.executor.stream.config.StreamConfig`
says how. Advising how a stream should run (profile, model, planner, the
DataLoader drop-in) lives in :mod:`placer.stream`, which imports this package.
"""

from placer.executor.stream.config import BatchInfo, StreamConfig
from placer.executor.stream.runner import StreamFailed, StreamRun, interrupt

__all__ = ["BatchInfo", "StreamConfig", "StreamFailed", "StreamRun", "interrupt"]
