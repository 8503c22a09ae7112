"""How a stream runs (:class:`StreamConfig`), and where a batch is in it (:class:`BatchInfo`).

May import: placer.data.stream. Plain data: a plan chooses these settings, a person may write them.

:class:`StreamConfig` is :class:`placer.data.stream.StreamSettings` itself, under the
name the runner and its users know.
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.data.stream import StreamSettings, WorkerKind

__all__ = ["BatchInfo", "StreamConfig", "StreamSettings", "WorkerKind"]

#: how a stream runs: the data layer's model (one class, two names: the runner has always called it so)
StreamConfig = StreamSettings


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
