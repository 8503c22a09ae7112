"""The loader's samples timed one by one, as a worker process reads them: what each costs, and the CPU it keeps busy.

May import: placer.timing, placer.stream.dataset_cache, placer.stream.purity; torch inside functions.

The checks after the search read them: the spread of the samples' costs (a heavy tail that holds
batches back, :mod:`~placer.stream.dropin.reorder`) and the CPU seconds a sample takes per second of
its wall time (above one, reading it runs several threads at once, :mod:`~placer.stream.dropin.worker_threads`).
Each ``dataset[key]`` runs in this process at torch's one intra-op thread, as torch's worker loop sets
it in each worker (the BLAS pools as a worker inherits them), with the global random generators put back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer.stream.dataset_cache import key_batches
from placer.stream.purity import global_random_state_kept
from placer.timing import Clock, Deadline, torch_threads

#: samples timed at most, and the share of the budget their timing may take (on top of it, as the cache's)
TIMED_SAMPLES = 256
TIME_SHARE = 0.05


@dataclass(frozen=True)
class Timed:
    """Samples of the loader's first batches, each timed: ``costs[b][i]`` the wall seconds of batch ``b``'s
    ``i``-th sample; ``cpu_s`` and ``wall_s`` over all of them (process CPU seconds, every thread's)."""

    costs: tuple[tuple[float, ...], ...]
    cpu_s: float
    wall_s: float

    @property
    def cores_busy(self) -> float:
        """CPU seconds per wall second while the samples were read: above one, several threads at once."""
        return self.cpu_s / max(self.wall_s, 1e-12)

    @property
    def samples(self) -> int:
        return sum(len(b) for b in self.costs)


def time_samples(loader: Any, batches: int, deadline: Deadline) -> Timed | None:
    """The samples of the loader's first ``batches`` batches timed (at most :data:`TIMED_SAMPLES`, and only
    the first batch past ``deadline``); None where the loader has no keys to read them by (an iterable dataset)."""
    with global_random_state_kept(), torch_threads(1):
        keys = key_batches(loader, batches) or []
        out: list[tuple[float, ...]] = []
        cpu = wall = 0.0
        for batch in keys:
            if sum(map(len, out)) >= TIMED_SAMPLES or (out and deadline.passed()):
                break
            each = []
            for key in batch:
                with Clock(settle=False) as c:
                    loader.dataset[key]
                each.append(c.wall)
                cpu, wall = cpu + c.cpu, wall + c.wall
            out.append(tuple(each))
    return Timed(tuple(out), cpu, wall) if out else None
