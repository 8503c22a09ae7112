"""A script's whole run predicted from short measured runs: start-up, epoch boundaries, steady state.

May import: nothing from placer (plain numbers in, seconds out).

A training or inference script times its loop over its epochs: every epoch starts an
iterator of its loader (worker processes start, unless ``persistent_workers`` keeps them
from the epoch before), waits for the first batch, runs the steady state, and, without
persistent workers, stops the workers at the epoch's end. A short measured run gives
each of these costs (:class:`RunCosts`); :func:`run_seconds` adds them up over the
script's epochs × batches, so that the speed-up the advice claims is the one the
script's own clock will see (a steady-state rate alone leaves start-up and epoch
boundaries out, and flatters settings with many workers on short runs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RunCosts:
    """What one loader setting costs over a script's run, in seconds.

    Attributes
    ----------
    start_s : float
        From starting an iterator of the loader (``iter(loader)``) to its first batch:
        starting the workers, and loading the first batch.
    per_batch_s : float
        A batch in the steady state (loader and step together).
    close_s : float
        Stopping the workers at an epoch's end (none for ``persistent_workers``).
    refill_s : float
        The first batch of a later epoch when the workers persist: loading one batch.
    persistent : bool
        Whether the workers persist between epochs.
    """

    start_s: float
    per_batch_s: float
    close_s: float
    refill_s: float
    persistent: bool

    def epoch_s(self, batches: int, first: bool) -> float:
        """One epoch of ``batches`` batches (the first epoch, or a later one)."""
        begin = self.start_s if first or not self.persistent else min(self.refill_s, self.start_s)
        end = 0.0 if self.persistent else self.close_s
        return begin + max(batches - 1, 0) * self.per_batch_s + end

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def run_seconds(costs: RunCosts, *, epochs: int, batches: int) -> float:
    """The script's loop over ``epochs`` epochs of ``batches`` batches each."""
    if epochs < 1 or batches < 1:
        raise ValueError(f"a run needs at least one epoch of one batch (got epochs={epochs}, batches={batches})")
    return costs.epoch_s(batches, True) + (epochs - 1) * costs.epoch_s(batches, False)


def costs(*, first_batch_s: float, samples_per_s: float, samples_per_batch: float, close_s: float,
          refill_s: float | None, workers: int, persistent: bool) -> RunCosts:
    """A setting's costs from one (merged) measured run.

    ``refill_s``: one batch loaded with the workers running (e.g. the first batch without
    workers); when unknown, a worker's time for one batch in the steady state
    (``workers`` × the steady time per batch).
    """
    per_batch = samples_per_batch / max(samples_per_s, 1e-12)
    refill = refill_s if refill_s is not None else max(workers, 1) * per_batch
    return RunCosts(start_s=first_batch_s, per_batch_s=per_batch, close_s=close_s if workers else 0.0,
                    refill_s=refill if workers else first_batch_s, persistent=bool(workers and persistent))


def cached_run_seconds(costs: RunCosts, *, epochs: int, batches: int, fill: float, hit: float) -> float:
    """The script's loop with a cache inside its dataset: the first epoch fills it, the later ones read it.

    ``fill`` and ``hit``: an epoch's seconds while filling the cache and while reading it,
    each over an uncached epoch's (both measured on the same batches). The first epoch
    costs ``fill`` times its uncached time, every later one ``hit`` times its own.
    """
    if fill <= 0 or hit <= 0:
        raise ValueError(f"a cache's epoch takes some time: fill={fill}, hit={hit} must be above 0")
    first = costs.epoch_s(batches, True)
    run_seconds(costs, epochs=epochs, batches=batches)  # checks epochs and batches
    return fill * first + (epochs - 1) * hit * costs.epoch_s(batches, False)
