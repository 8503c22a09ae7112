"""How a stream runs: workers per stage, prefetch depth, pinned copies, a cache point.

May import: pydantic. Plain data: a plan will choose these, a person may write them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

WorkerKind = Literal["thread", "process", "dask"]


class StreamConfig(BaseModel):
    """Settings of a stream run.

    Attributes
    ----------
    workers : int
        Parallel workers of every per-batch CPU stage (and of a Dataset source's
        DataLoader) unless ``stage_workers`` says otherwise. ``0`` runs the stream
        sequentially in the calling thread: every batch goes through every stage
        before the next is read (the reference run: same outputs, no overlap).
    stage_workers : dict
        Workers of one stage (overrides ``workers``).
    worker_kind : dict
        ``thread`` (the default: code that releases the GIL, numpy and torch),
        ``process``, or ``dask`` (tasks on the cluster in use, see
        :mod:`placer.executor.stream.dask_workers`) per stage.
    prefetch : int
        Batches each queue between two stages holds: the bound on batches in flight
        (backpressure) and how far ahead the source reads.
    pin_memory : bool
        Copy batches to a GPU from pinned host memory (``non_blocking``).
    cache : str or None
        A deterministic stage (or the source) whose output is kept in memory after
        the first epoch; later epochs start after it.
    cache_bytes : int
        The most bytes the cache may hold; beyond it caching stops, with a note.
    max_batches : int or None
        Stop after this many batches (for bounded measurement runs).
    torch_threads : int or None
        torch's intra-op threads for the run (``torch.set_num_threads``, restored
        after it); None leaves torch's setting as it is. With CPU workers on the same
        cores, fewer threads for a step on the CPU can be faster.
    """

    workers: int = Field(1, ge=0)
    stage_workers: dict[str, int] = Field(default_factory=dict)
    worker_kind: dict[str, WorkerKind] = Field(default_factory=dict)
    prefetch: int = Field(2, ge=1)
    pin_memory: bool = True
    cache: str | None = None
    cache_bytes: int = Field(2 << 30, ge=0)
    max_batches: int | None = Field(None, ge=1)
    torch_threads: int | None = Field(None, ge=1)

    @property
    def sequential(self) -> bool:
        return self.workers == 0

    def workers_of(self, stage: str) -> int:
        return max(1, self.stage_workers.get(stage, self.workers))

    def kind_of(self, stage: str) -> WorkerKind:
        return self.worker_kind.get(stage, "thread")


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Where a batch is in the stream: passed to stage functions that take ``batch_info``.

    ``seed`` is derived from the epoch and the batch's index only, so a random
    augmentation seeded with it gives the same batch whatever the workers and
    placement.
    """

    epoch: int
    index: int
    seq: int

    @property
    def seed(self) -> int:
        return (self.epoch * 1_000_003 + self.index) % (2**32)
