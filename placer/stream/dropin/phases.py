"""The phases of :func:`~placer.stream.dropin.advise_loader`, each a function of one :class:`Advising`.

May import: placer.data.stream, placer.devices, placer.timing, placer.stream.keep, placer.stream.rounds,
placer.stream.dropin.{caching,deciding,epochs,explore,fits,measuring,repeats,runs,space,trial,whole}.

In order: measure the user's settings (:func:`measure_yours`), search the space
(:func:`search`), decide by repeated runs (:func:`decide_by_rounds`), confirm by longer runs
(:func:`confirm_longer`), predict the whole run (:func:`conclude`) and weigh the cache
(:func:`weigh_cache`). Each reads and writes the :class:`Advising` it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from placer.data.stream import LoaderSettings
from placer.devices import Device
from placer.stream.dropin import caching, deciding, explore, fits, measuring, space
from placer.stream.dropin.caching import CACHE_SHARE, without_workers
from placer.stream.dropin.deciding import WAIT_NOISE, choose, contender, decide, persistent, wait_noise
from placer.stream.dropin.epochs import run_epochs
from placer.stream.dropin.measuring import SampleCount
from placer.stream.dropin.repeats import (CONFIRM_LENGTH, CONFIRM_ROUNDS, CONFIRM_SHARE, FINALISTS, confirm, race,
                                          repeat, settle)
from placer.stream.dropin.runs import Budget, loader_length, must, run_length, run_trial
from placer.stream.dropin.trial import Trial, label, span
from placer.stream.dropin.whole import cache_over_the_run, confirmed_gain, over_faster, whole_run
from placer.stream.keep import between_runs
from placer.stream.rounds import MIN_GAIN, REPEATS
from placer.timing import Deadline


@dataclass
class Advising:
    """One advice in the making: the user's loader and step, the budget, and what the phases found.

    ``trials[0]`` is always the user's settings (:attr:`mine`), its runs merged as they repeat.
    """

    loader: Any
    step: Any
    dev: Device
    batches: int
    budget_s: float
    epochs: int
    user: LoaderSettings
    cores: int
    count: SampleCount
    per_epoch: int | None
    took: Deadline = field(default_factory=lambda: Deadline(None))
    budget: Budget | None = None
    #: seconds spent before the runs' budget started (the cache search, the fresh processes' start)
    cache_s: float = 0.0
    #: the first batches, for the step alone and the precision and target checks
    kept: list = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    step_rate: float = 0.0
    alone: Trial | None = None
    waits: bool = True
    threads: dict[str, Any] | None = None
    #: why a faster-measured setting was not recommended
    noise: str | None = None
    longer: tuple[Trial, Trial, int] | None = None
    overturned: Trial | None = None
    run: dict[str, Any] | None = None
    confirmed: dict[str, Any] | None = None
    cache: Any = None
    swapped: str | None = None
    #: the run's epochs were not given: what was assumed, in a sentence (:func:`.epochs.run_epochs`)
    epochs_assumed: str | None = None
    #: what the checks after the search say (:mod:`~placer.stream.dropin.reorder`,
    #: :mod:`~placer.stream.dropin.worker_threads`), for the advice's notes
    notes: list[str] = field(default_factory=list)
    #: a check after the search changed the recommendation (measured in its own rounds, not in longer runs)
    changed_after: bool = False
    #: the memory budget (``{"bytes", "from"}``: :mod:`placer.stream.dropin.fits`), and the settings set aside
    #: because their projected memory passes it
    memory_budget: dict[str, Any] | None = None
    over_memory: list[Trial] = field(default_factory=list)

    @property
    def mine(self) -> Trial:
        """The user's settings as measured so far."""
        return self.trials[0]

    def threads_helped(self) -> None:
        """Say whether the step's threads the recommendation sets differ from the user's."""
        if self.threads is not None:
            self.threads["helped"] = self.best.settings.torch_threads != self.mine.settings.torch_threads


def start(loader: Any, step: Any, *, device: Any, batches: int, budget_s: float, epochs: int | None) -> Advising:
    """The advice's inputs read: the step's device, the user's settings, the cores, the batches per epoch, the
    epochs (one where not given, :func:`.epochs.run_epochs`)."""
    took, per_epoch = Deadline(None), loader_length(loader)
    epochs, assumed = run_epochs(loader, epochs, per_epoch)
    return Advising(loader, step, measuring.step_device(device), batches, budget_s, epochs,
                    user=measuring.settings_of(loader), cores=measuring.cores(), count=measuring.counter_of(loader),
                    per_epoch=per_epoch, took=took, epochs_assumed=assumed)


def look_for_cache(a: Advising, cache_bytes: int | None) -> None:
    """Caching inside the dataset, searched with the user's settings within :data:`CACHE_SHARE` more of the budget."""
    a.cache = caching.find_cache(a.loader, a.step, a.user, a.batches, a.budget_s * CACHE_SHARE, cache_bytes, a.dev)
    between_runs()  # the cache's passes ran the step here
    a.cache_s = a.took.spent()  # the cache search is on top of budget_s


def plan_budget(a: Advising, candidates: list[LoaderSettings]) -> None:
    """The runs' budget (:data:`CONFIRM_SHARE` kept for the longer runs), shared over the runs the search counts."""
    runs = 3 + len(candidates) + space.WIDEN_RUNS + explore.thread_runs(a.user, a.cores, a.dev) \
        + (REPEATS - 1) * (FINALISTS + 3)
    a.budget = Budget(a.budget_s * (1 - CONFIRM_SHARE), runs=runs)
    a.budget.shape = (a.epochs, a.per_epoch) if a.per_epoch else None


def measure_yours(a: Advising) -> None:
    """The user's settings with the step (at the length every run reads), the step alone, the loader alone."""
    budget, loader, step = a.budget, a.loader, a.step
    a.cache_s = a.took.spent()  # the fresh processes' start is on top of budget_s too
    mine = must(run_trial(loader, a.user, step, a.batches, a.dev, budget, keep=a.kept, count=a.count))
    longer_runs = run_length(mine, a.batches, a.per_epoch, budget)
    if longer_runs > a.batches:  # the first run was a probe: yours again, at the length every run reads
        a.batches = longer_runs
        budget.runs += 1
        mine = must(run_trial(loader, a.user, step, a.batches, a.dev, budget, count=a.count))
    a.trials = [mine]
    budget.user = a.user
    if budget.shape:  # your whole run's seconds, as your first run predicts it, and that run's own warm-up
        # (a fresh process's first steps are slow, in every setting's warm-up alike)
        budget.user_run_s = budget.shape[0] * budget.shape[1] * (mine.samples / max(mine.batches, 1)) / mine.score \
            + max(0.0, (mine.read_s or 0.0) - mine.seconds)
    a.step_rate = measuring.step_alone(step, a.kept, batches=mine.batches, device=a.dev, deadline=budget.deadline(),
                                       count=a.count)
    between_runs()  # the step ran here
    a.alone = run_trial(loader, a.user, None, a.batches, a.dev, budget, count=a.count) if budget.allows() else None


def search(a: Advising, candidates: list[LoaderSettings]) -> None:
    """Each candidate once, then wider (more workers, other depths), then the step's threads: ``a.best``."""
    budget = a.budget
    # the first round yields to the repeats of your settings and of one finalist: a recommendation
    # needs them (settings slow to start can spend the budget on their single runs)
    first = (REPEATS - 1) * 2
    a.trials += [t for s in candidates if budget.allows() and budget.leaves(first)
                 and (t := run_trial(a.loader, s, a.step, a.batches, a.dev, budget, count=a.count)) is not None]
    # widening yields to what decides: the step's threads and the repeats of the finalists
    explore.widen(a.loader, a.trials, a.step, a.batches, a.dev, budget, a.count, a.cores,
                  keep=explore.thread_runs(a.user, a.cores, a.dev) + (REPEATS - 1) * (FINALISTS + 2))
    a.waits = max(0.0, 1 - a.mine.samples_per_s / a.step_rate) > WAIT_NOISE
    fits.set_aside(a)  # settings whose memory over the run passes the budget are not recommended
    a.best = choose(a.mine, a.trials, waits=a.waits)
    if a.dev.kind == "cpu":
        a.best, a.threads = explore.try_threads(a.loader, a.best, a.step, a.batches, a.dev, budget, a.trials,
                                                cores=a.cores)


def decide_by_rounds(a: Advising) -> None:
    """The finalists repeated, rivals raced, a close call settled: the recommendation and why not another."""
    loader, step, budget = a.loader, a.step, a.budget
    fits.set_aside(a)  # the step's threads tried at the end of the search
    if all(a.best is not t for t in a.trials):
        a.best = choose(a.mine, a.trials, waits=a.waits)
    a.trials = repeat(loader, a.trials, a.best, step, a.batches, a.dev, budget, a.count)
    a.waits = max(0.0, 1 - a.mine.samples_per_s / a.step_rate) > wait_noise(a.mine)  # the median of your runs
    a.trials = race(loader, a.trials, step, a.batches, a.dev, budget, a.count, waits=a.waits)
    a.best, a.noise = decide(a.mine, a.trials, waits=a.waits)
    near = contender(a.mine, a.trials, waits=a.waits) if a.noise is not None else \
        deciding.within_reach(a.mine, a.trials, waits=a.waits) if a.best is a.mine else None
    if near is not None:
        a.trials = settle(loader, a.trials, near, step, a.batches, a.dev, budget, a.count)
        a.best, a.noise = decide(a.mine, a.trials, waits=a.waits)
    if a.threads is not None:
        top = max((t for t in a.trials if t.settings.torch_threads == a.threads["tried"]
                   and t.settings.num_workers == a.best.settings.num_workers), key=lambda t: t.samples_per_s,
                  default=None)
        a.threads_helped()
        if top is not None:
            a.threads["samples_per_s"] = round(top.samples_per_s, 2)
    if a.best is not a.mine:
        a.best = persistent(a.best)


def confirm_longer(a: Advising) -> None:
    """Longer runs of the recommendation and the user's settings; where they overturn it, of the runner-up."""
    if a.best is a.mine:
        return
    mine, batches = a.mine, a.batches
    n = max(batches, min(CONFIRM_LENGTH * batches, a.per_epoch or CONFIRM_LENGTH * batches))
    a.longer = confirm(a.loader, mine, a.best, a.step, n, a.dev, _rest(a), a.count)
    not_held = a.longer is not None and confirmed_gain(
        whole_run(mine, a.best, a.trials, a.longer, epochs=a.epochs, batches=a.per_epoch), a.longer) < 1 + MIN_GAIN
    if not_held and (nxt := deciding.runner_up(mine, a.best, a.trials, waits=a.waits)) is not None:
        # the next setting that also beat yours in repeated runs gets its own longer runs
        if (again := confirm(a.loader, mine, nxt, a.step, n, a.dev, _rest(a), a.count)) is not None:
            a.overturned, a.best, a.longer = a.best, nxt, again
            a.threads_helped()


def _rest(a: Advising) -> Budget:
    """What is left of the budget, for a recommendation's longer runs."""
    left = Budget(max(a.budget_s + a.cache_s - a.took.spent(), 0.0), 2 * CONFIRM_ROUNDS)
    left.fixed_s, left.shape, left.where = a.budget.fixed_s, a.budget.shape, a.budget.where
    return left


def conclude(a: Advising) -> None:
    """The whole run predicted; where the longer runs did not hold the gain, the user's settings kept."""
    mine, longer = a.mine, a.longer
    a.run = whole_run(mine, a.best, a.trials, longer, epochs=a.epochs, batches=a.per_epoch)
    if longer is None:
        return
    steady = longer[1].samples_per_s / max(longer[0].samples_per_s, 1e-12)
    held, faster = confirmed_gain(a.run, longer) >= 1 + MIN_GAIN, over_faster(mine, longer, a.run)
    a.confirmed = {"batches": longer[2], "runs": min(len(longer[0].rates), len(longer[1].rates)),
                   "user": longer[0].as_dict(), "recommended": longer[1].as_dict(),
                   "steady_speedup": round(steady, 3), "held": held and (faster is None or faster >= 1 + MIN_GAIN)}
    if faster is not None:
        a.confirmed["over_faster"] = round(faster, 3)
    if a.confirmed["held"]:
        return
    run = a.run
    what = (f"your runs ran at two speeds here, and over your faster runs it would be {faster:.2f}x yours "
            f"({confirmed_gain(run, longer):.2f}x over the mix of both): a run of your script may meet either speed"
            if held else
            f"over your whole run ({run['epochs']} x {run['batches']} batches) it would take "
            f"{run['recommended_s']:.2f} s, yours {run['user_s']:.2f} s" if run is not None
            else f"it measured {span(longer[1])}, yours {span(longer[0])}")
    a.noise = f"{label(a.best.settings)} was not confirmed by longer runs of {longer[2]} batches: {what}"
    a.best = mine  # your whole run as your confirming runs measured it
    a.run = whole_run(mine, a.best, a.trials, (longer[0], longer[0], longer[2]), epochs=a.epochs,
                      batches=a.per_epoch)
    a.threads_helped()


def weigh_cache(a: Advising) -> None:
    """The cache measured with the recommended settings and put in the whole run; fewer workers where, with the
    cache, they are as fast."""
    found, mine, share = a.cache, a.mine, a.budget_s * CACHE_SHARE
    if found is not None and found.recommended and a.best is not mine and not a.best.settings.worker_threads:
        a.cache = caching.cache_at(found, a.loader, a.step, a.best.settings, a.batches, share, a.dev)
    a.run, a.cache = cache_over_the_run(a.run, a.cache, assumed=a.epochs_assumed is not None)
    lighter = without_workers(mine, a.best, a.trials, a.longer, found, a.run, a.loader, a.step, a.batches, share,
                              a.dev, epochs=a.epochs, per_epoch=a.per_epoch, at_best=a.cache)
    if lighter is None:
        return
    name = "your settings" if lighter[0] is mine else label(lighter[0].settings)
    a.swapped = (f"with the cache, {name} {lighter[3]} and {label(a.best.settings)}, the fastest without it, "
                 f"{lighter[4]}: once the cache holds what the workers computed, they have little left to overlap, "
                 "and fewer is simpler")
    a.best, a.run, a.cache = lighter[:3]
    a.confirmed = None  # the longer runs confirmed the setting with workers
    if a.best is mine:
        a.noise = a.swapped
    a.threads_helped()
