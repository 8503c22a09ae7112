"""The drop-in's repeated runs: finalists in interleaved rounds, rivals raced, close calls settled, and a
recommendation confirmed by longer runs (:mod:`placer.stream.rounds` runs the rounds).

May import: placer.devices, placer.stream.rounds, placer.stream.dropin.{deciding,measuring,runs,trial,whole}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from placer.devices import Device
from placer.stream import rounds
from placer.stream.dropin.deciding import rivals
from placer.stream.dropin.measuring import SampleCount
from placer.stream.dropin.runs import Budget, run_trial
from placer.stream.dropin.trial import Trial, merged
from placer.stream.dropin.whole import run_spread
from placer.stream.rounds import REPEATS


#: settings besides the user's (and the cheapest near the fastest) repeated after the first round
FINALISTS = 2
#: rounds of racing: after one, the next fastest single runs may still read faster than the repeated
RACES = 2
#: the share of the budget kept for the longer runs that confirm a recommendation
CONFIRM_SHARE = 0.3
#: rounds of the confirming runs (each runs the user's settings and the recommended, in turn): three, so
#: that one slow run does not move the median (of two runs, their mean, which one slow run halves)
CONFIRM_ROUNDS = 3
#: more rounds, up to this many in all, while either setting's confirming runs spread by more than
#: ``CONFIRM_SPREAD`` (their whole-run predictions' range over their median) and the budget has room for
#: a round as long as the last: a claim from three rounds that spread by a third is off by as much
CONFIRM_MAX_ROUNDS = 8
CONFIRM_SPREAD = 0.15
#: rounds, budget permitting, before runs that agree (within ``CONFIRM_SPREAD``) end the confirming: three
#: rounds side by side span a few seconds, and agreeing there says the machine held one speed for them, not
#: that it was its usual one; claims from five rounds or more land nearer what the script measures
CONFIRM_AGREED = 5
#: a confirming run reads up to this many times ``batches`` (at most one epoch), within its budget
CONFIRM_LENGTH = 4


def repeat(loader: Any, trials: list[Trial], best: Trial, step: Any, batches: int, dev: Device, budget: Budget,
           count: SampleCount) -> list[Trial]:
    """Run the finalists again, round-robin, until each has ``REPEATS`` runs (or the budget ends).

    The finalists: the user's settings (``trials[0]``), the ``FINALISTS`` fastest of the
    first round and the setting the first round chose. Returns ``trials`` with each
    finalist's runs merged (:func:`merged`), in the same order.
    """
    ranked = sorted(trials[1:], key=lambda t: -t.score)
    finalists = [trials[0], *[t for t in ranked[:FINALISTS]]]
    same = [t for t in ranked if (t.settings.num_workers, t.settings.prefetch_factor, t.settings.pin_memory)
            == (trials[0].settings.num_workers, trials[0].settings.prefetch_factor, trials[0].settings.pin_memory)]
    if same and same[0] not in finalists:  # the user's loader with other step threads: a step-bound choice
        finalists.append(same[0])
    if best not in finalists:
        finalists.append(best)
    return more_rounds(loader, trials, finalists, step, batches, dev, budget, count, fits=budget.allows)


def more_rounds(loader: Any, trials: list[Trial], finalists: list[Trial], step: Any, batches: int, dev: Device,
                budget: Budget, count: SampleCount, fits: Callable[[], bool]) -> list[Trial]:
    """``REPEATS - 1`` more runs of each of ``finalists``, round-robin in the order given, each while
    ``fits()``. Returns ``trials`` with each finalist's runs merged (:func:`merged`), in the same order."""
    more: dict[int, list[Trial]] = {id(t): [] for t in finalists}

    def run(t: Trial) -> None:
        again = run_trial(loader, t.settings, step, batches, dev, budget, count=count)
        if again is not None:
            more[id(t)].append(again)

    rounds.interleave(finalists, run, REPEATS - 1, fits=lambda r, t: fits())
    return [merged(t, more.get(id(t), [])) for t in trials]


def race(loader: Any, trials: list[Trial], step: Any, batches: int, dev: Device, budget: Budget,
         count: SampleCount, *, waits: bool) -> list[Trial]:
    """Repeat the :func:`rivals` with the user's settings (the user's first in each round), up to
    ``RACES`` times, while each run leaves the budget room for two more (a round of :func:`settle`)."""
    for _ in range(RACES):
        racers = rivals(trials[0], trials, waits=waits)
        if not racers:
            break
        budget.runs += (REPEATS - 1) * (len(racers) + 1)  # each either runs or, not fitting, is uncounted
        trials = more_rounds(loader, trials, [trials[0], *racers], step, batches, dev, budget, count,
                         fits=lambda: budget.leaves(2))
    return trials


def settle(loader: Any, trials: list[Trial], near: Trial, step: Any, batches: int, dev: Device, budget: Budget,
           count: SampleCount) -> list[Trial]:
    """Up to :data:`~placer.stream.rounds.SETTLE_ROUNDS` more rounds of the user's settings (``trials[0]``) and
    ``near``, in turn,
    while the budget leaves room for both runs of a round (a round with a failed run is dropped whole,
    so that the rounds stay paired). Returns ``trials`` with the two settings' runs merged."""
    more: dict[int, list[Trial]] = {id(trials[0]): [], id(near): []}
    settle_rounds = rounds.SETTLE_ROUNDS
    budget.runs += 2 * settle_rounds  # what is left is shared over these runs
    for done in range(settle_rounds):
        if not budget.leaves(1):
            budget.runs -= 2 * (settle_rounds - done) - 1
            break
        mine = run_trial(loader, trials[0].settings, step, batches, dev, budget, count=count)
        theirs = run_trial(loader, near.settings, step, batches, dev, budget, count=count)
        if mine is not None and theirs is not None:
            more[id(trials[0])].append(mine)
            more[id(near)].append(theirs)
    return [merged(t, more.get(id(t), [])) for t in trials]


def confirm(loader: Any, user: Trial, best: Trial, step: Any, batches: int, dev: Device, budget: Budget,
            count: SampleCount) -> tuple[Trial, Trial, int] | None:
    """Longer runs of the user's settings and the recommended, in turn, ``CONFIRM_ROUNDS`` rounds, then
    more while what is left of ``budget`` holds a round as long as the last: up to ``CONFIRM_AGREED`` in
    all, and on (up to ``CONFIRM_MAX_ROUNDS``) while either setting's runs spread by more than
    ``CONFIRM_SPREAD`` (:func:`run_spread`).

    Each run reads up to ``batches`` batches (each stops early at its share of ``budget``)
    from the start of an iterator, so that it measures the start-up, the steady state and
    the workers' shut-down again, at a length nearer the script's. A round starts only
    when what is left of ``budget`` covers the start-up costs seen so far. Returns both
    settings' runs merged (:func:`merged`) and the batches asked for, or None when no
    round fitted (or a run could not count a batch).
    """
    runs: dict[str, list[Trial]] = {"user": [], "best": []}
    settings = {"user": user.settings, "best": best.settings}

    def run(key: str) -> None:
        again = run_trial(loader, settings[key], step, batches, dev, budget, count=count)
        if again is not None:
            runs[key].append(again)

    def more(k: int) -> bool:
        if budget.total.left() <= 2 * budget.fixed_s:  # both runs of the round, or none
            return False
        if k >= CONFIRM_ROUNDS:
            if k >= CONFIRM_AGREED and max(run_spread(runs["user"]), run_spread(runs["best"])) <= CONFIRM_SPREAD:
                return False
            # a round as long as the last one, or none: a run cut short by its deadline reads less
            if budget.total.left() <= sum(budget.walls[-2:]) + 2 * budget.fixed_s:
                return False
            budget.runs = max(budget.runs, 0) + 2
        return True

    rounds.interleave(["user", "best"], run, CONFIRM_MAX_ROUNDS, more=more)
    if not runs["user"] or not runs["best"]:
        return None
    return merged(runs["user"][0], runs["user"][1:]), merged(runs["best"][0], runs["best"][1:]), batches
