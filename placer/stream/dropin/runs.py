"""Where and how long the drop-in's runs happen: in this process or fresh ones, each within its share of the budget.

May import: placer.data.stream, placer.devices, placer.timing, placer.stream.keep, placer.stream.wholerun,
placer.stream.dropin.{guards,measuring,trial,whole}; placer.stream.fresh inside functions.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from placer.data.stream import LoaderSettings
from placer.devices import Device
from placer.stream.dropin import measuring
from placer.stream.dropin.guards import past_the_cores
from placer.stream.dropin.measuring import SampleCount, counter_of
from placer.stream.dropin.trial import Trial, label
from placer.stream.dropin.whole import run_costs
from placer.stream.keep import between_runs
from placer.stream.wholerun import run_seconds
from placer.timing import Clock, Deadline, torch_threads

log = logging.getLogger(__name__)


#: a run shorter than this measures the machine's hiccups and the workers' start more than the loader:
#: where the budget has room, runs read more batches (up to an epoch) to last this long
MIN_RUN_S = 0.5


def fresh_default() -> bool:
    """:func:`advise_loader`'s ``fresh`` when not given: yes, unless ``PLACER_FRESH_RUNS=0`` (the unit tests
    that fake the runs or count the step's calls in their own process set it)."""
    return os.environ.get("PLACER_FRESH_RUNS", "1").strip() != "0"


@contextlib.contextmanager
def runs_where(budget: Budget, loader: Any, step: Any, dev: Device, fresh: bool | None) -> Iterator[dict]:
    """``budget``'s runs in fresh processes (:mod:`placer.stream.fresh`) for the block, where ``fresh`` (default:
    :func:`fresh_default`) and they can be, else in this process and ``budget.where["here"]`` says why; stopped
    after it. Yields ``{"where": ...}``, filled when the block ends: where the runs were made."""
    out = {"where": "this process"}
    if fresh if fresh is not None else fresh_default():
        from placer.stream.fresh import start

        runs, why = start(loader, step, dev.kind)
        budget.where = {"fresh": runs, "here": why}
    try:
        yield out
    finally:
        if budget.where["fresh"] is not None:
            out["where"] = "fresh processes"
            budget.where["fresh"].close()


class Budget:
    """Splits what is left of the budget evenly over the runs still to come.

    A run's deadline can stop its counted batches only: starting its workers, its
    warm-up batches and stopping the workers take what they take. The largest such
    fixed cost seen so far is kept, and an optional run starts only when that much is
    left (the budget was overrun by these costs when every run started regardless).
    """

    def __init__(self, budget_s: float, runs: int):
        self.total = Deadline(budget_s)
        self.runs = runs
        self.fixed_s = 0.0
        self.walls: list[float] = []
        #: the script's run (epochs, batches an epoch), when known: each run predicts its whole run
        self.shape: tuple[int, int] | None = None
        #: the user's settings, and their whole run's seconds once measured: another setting's run still
        #: in its warm-up after that long stops there (:func:`run_loader`'s ``give_up_s``)
        self.user: LoaderSettings | None = None
        self.user_run_s: float | None = None
        #: where the runs are made, shared with the budgets made from this one: ``fresh``, the runs' fresh
        #: processes (:mod:`placer.stream.fresh`), or None and ``here``, why they are in this process
        self.where: dict[str, Any] = {"fresh": None, "here": None}

    def deadline(self) -> Deadline:
        share = self.total.left() / max(self.runs, 1)
        self.runs -= 1
        return Deadline(share)

    def allows(self) -> bool:
        """Whether an optional run fits in what is left (it is counted as run either way)."""
        if self.total.left() > self.fixed_s:
            return True
        self.runs -= 1
        return False

    def ran(self, wall_s: float, counted_s: float, *, cut: bool = False) -> None:
        """A run's wall time and its counted batches' seconds; a ``cut`` run's start-up is not a fixed cost
        of the runs to come (its setting is not run again)."""
        if not cut:
            self.fixed_s = max(self.fixed_s, wall_s - counted_s)
        self.walls.append(wall_s)

    def give_up_s(self, settings: LoaderSettings) -> float | None:
        """How long a run of ``settings`` may stay in its warm-up: the user's whole run (none for theirs)."""
        return None if settings == self.user else self.user_run_s

    def leaves(self, runs: int) -> bool:
        """Whether one more optional run still leaves room for ``runs`` runs as long as the mean so far."""
        mean = sum(self.walls) / len(self.walls) if self.walls else 0.0
        if self.total.left() > self.fixed_s + (runs + 1) * mean:
            return True
        self.runs -= 1
        return False


def run_trial(loader: Any, settings: LoaderSettings, step: Any, batches: int, dev: Device, budget: Budget,
              keep: list | None = None, count: SampleCount | None = None) -> Trial | None:
    measured = settings.model_copy(update={"persistent_workers": False})
    started = time.perf_counter()
    queue = settings.num_workers * (settings.prefetch_factor or 2)
    kw = dict(batches=min(max(batches, 2 * queue + 2), 4 * batches), warmup=max(1, settings.num_workers),
              device=dev, deadline=budget.deadline(), keep=keep, count=count or counter_of(loader), drain=queue,
              give_up_s=budget.give_up_s(settings))
    with Clock() as wall:
        trial = _fresh_run(budget, measured, step, settings.torch_threads, kw)
        here = trial is _HERE
        if here:
            with torch_threads(settings.torch_threads), past_the_cores():
                trial = measuring.run_loader(measuring.rebuild(loader, measured), step, **kw)
    if here and step is not None:
        between_runs()  # the step trained the user's model here: the next run starts from it as it was
    budget.ran(wall.wall, trial.seconds if trial is not None else 0.0, cut=trial is not None and trial.cut)
    if trial is None:
        return None
    trial = replace(trial, settings=settings, started=(started,))
    return replace(trial, run_rates=(run_rate(trial, *budget.shape),)) if budget.shape else trial


#: what :func:`_fresh_run` gives where the run is to be made in this process
_HERE = object()


def _fresh_run(budget: Budget, settings: LoaderSettings, step: Any, threads: int | None,
               kw: dict[str, Any]) -> Any:
    """The run in a fresh process (:mod:`placer.stream.fresh`), or ``_HERE``: where the budget has none, or
    the fresh process failed (its runs then go on in this process, and the budget says why)."""
    where = budget.where
    if where["fresh"] is None:
        return _HERE
    from placer.stream.fresh import FreshUnavailable, RunStuck

    try:
        return where["fresh"].run(settings, step is not None, threads, kw)
    except (RunStuck, FreshUnavailable) as e:
        if isinstance(e, RunStuck) and budget.user is not None:  # that run's process was ended alone; the
            where.setdefault("stuck", []).append(f"{label(settings)}: {e}")  # others go on in fresh ones
            return None
        where["fresh"].close()
        where["fresh"], where["here"] = None, str(e)
        log.warning("placer: the loader's runs go on in this process: %s", e)
        return _HERE


def run_rate(t: Trial, epochs: int, batches: int) -> float:
    """Samples/s of the script's whole run (``epochs`` x ``batches``) as one measured run predicts it.

    Start-up, the workers' shut-down at each epoch's end (none with persistent workers) and
    the steady state, as :func:`whole_run` adds them up: a setting whose workers take long
    to start, or whose queue holds a short epoch whole (its steady window then measures the
    queue, not the workers), is ranked by what the script's own clock would see.
    """
    seconds = run_seconds(run_costs(t, None, batches), epochs=epochs, batches=batches)
    return epochs * batches * (t.samples / max(t.batches, 1)) / max(seconds, 1e-12)


def must(trial: Trial | None) -> Trial:
    if trial is None:
        raise ValueError("the loader yielded too few batches to measure: it needs at least two "
                         "(more with workers: one per worker, then one counted)")
    return trial


def loader_length(loader: Any) -> int | None:
    """Batches per epoch, where the loader knows them."""
    try:
        return int(len(loader))
    except TypeError:
        return None


def run_length(first: Trial, batches: int, per_epoch: int | None, budget: Budget) -> int:
    """Batches per run: ``batches``, or more where a run of them lasts under ``MIN_RUN_S`` (at the
    rate of the user's ``first`` run), up to an epoch and to half of a run's share of the budget."""
    per_batch = first.seconds / max(first.batches, 1)
    if per_batch <= 0 or per_batch * batches >= MIN_RUN_S:
        return batches
    share = budget.total.left() / max(budget.runs, 1)
    n = min(math.ceil(MIN_RUN_S / per_batch), int(0.5 * share / per_batch))
    if per_epoch:
        n = min(n, per_epoch)
    return max(batches, n)
