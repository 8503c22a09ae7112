"""One change to the recommended settings measured against them: interleaved rounds of both, decided by the rule of
:mod:`placer.stream.rounds`.

May import: placer.data.stream, placer.stream.rounds, placer.stream.dropin.{deciding,phases,runs,trial,whole}.

The checks made after the search (:mod:`~placer.stream.dropin.reorder`,
:mod:`~placer.stream.dropin.worker_threads`) each change one thing the search does not vary
(``in_order``, the threads inside each worker) in the recommended settings, or in the user's where
only theirs have worker processes (:func:`with_processes`), and run :data:`~placer.stream.rounds.REPEATS`
rounds of the recommended settings and the changed ones, the recommended first in each round, within
:data:`CHECK_SHARE` of the budget more. The change is faster when all those rounds ran and its runs
beat the others' by :func:`~placer.stream.dropin.deciding.beats`: the rule every recommendation of the
drop-in passes (fewer rounds decide nothing: one run each always has a slowest faster than a fastest).
"""

from __future__ import annotations

from typing import Any

from placer.data.stream import LoaderSettings
from placer.stream import rounds
from placer.stream.dropin.deciding import beats
from placer.stream.dropin.phases import Advising
from placer.stream.dropin.runs import Budget, run_length, run_trial
from placer.stream.dropin.trial import Trial, merged
from placer.stream.dropin.whole import whole_run
from placer.stream.rounds import REPEATS

#: the share of ``budget_s`` each check may take more (its rounds run on top of the budget, as the cache's)
CHECK_SHARE = 0.25


def side_by_side(a: Advising, base: LoaderSettings, other: LoaderSettings) -> tuple[Trial, Trial] | None:
    """``base`` and ``other`` run in turn, ``REPEATS`` rounds while a round fits, then up to ``SETTLE_ROUNDS``
    more while ``other``'s median gain is not yet beyond the noise and a round fits; each setting's runs merged.

    Each run reads the search's batches, or more where those last under ``MIN_RUN_S`` at the recommended
    settings' rate (:func:`run_length`): a gain in how batches flow needs the runs to reach a steady state.
    A round whose runs did not both count a batch is dropped whole, so that the rounds stay paired.
    None where no round completed.
    """
    budget = Budget(a.budget_s * CHECK_SHARE, runs=2 * REPEATS)
    if a.budget is not None:  # the same run shape, processes and give-up time as the search's runs
        budget.shape, budget.where, budget.fixed_s = a.budget.shape, a.budget.where, a.budget.fixed_s
        budget.user, budget.user_run_s = a.budget.user, a.budget.user_run_s
    runs: dict[str, list[Trial]] = {"base": [], "other": []}
    settings = {"base": base, "other": other}
    last: dict[str, Trial | None] = {}
    batches = run_length(a.best, a.batches, a.per_epoch, budget)

    def run(key: str) -> None:
        last[key] = run_trial(a.loader, settings[key], a.step, batches, a.dev, budget, count=a.count)
        if key == "other" and last.get("base") is not None and last["other"] is not None:
            runs["base"].append(last["base"])
            runs["other"].append(last["other"])

    def more(r: int) -> bool:
        if r < REPEATS:
            return r == 0 or budget.total.left() > 2 * budget.fixed_s
        # a gain the median shows but the rounds do not yet: more rounds while one as long as the last fits
        pair = _merged(runs)
        if pair is None or not rounds.faster(pair[1].score, pair[0].score) or beats(pair[1], pair[0]) \
                or budget.total.left() <= sum(budget.walls[-2:]) + 2 * budget.fixed_s:
            return False
        budget.runs = max(budget.runs, 0) + 2
        return True

    rounds.interleave(["base", "other"], run, REPEATS + rounds.SETTLE_ROUNDS, more=more)
    return _merged(runs)


def _merged(runs: dict[str, list[Trial]]) -> tuple[Trial, Trial] | None:
    if not runs["base"]:
        return None
    return merged(runs["base"][0], runs["base"][1:]), merged(runs["other"][0], runs["other"][1:])


def outcome(pair: tuple[Trial, Trial] | None) -> dict[str, Any]:
    """What the rounds measured: each side's samples/s, the gain (the change's over the base's, as the
    drop-in ranks settings: :attr:`Trial.score`), the rounds, and whether the change is faster by the rule."""
    if pair is None:
        return {"measured_gain": None, "rounds": 0, "faster": False}
    base, other = pair
    return {"measured_gain": round(other.score / max(base.score, 1e-12), 3), "rounds": len(other.rates),
            "base_samples_per_s": [round(r, 2) for r in base.rates],
            "samples_per_s": [round(r, 2) for r in other.rates],
            "faster": len(other.rates) >= REPEATS and beats(other, base)}


def with_processes(a: Advising, least: int) -> LoaderSettings | None:
    """The settings a change to worker processes is tried on: the recommendation's where it has at least
    ``least`` worker processes, else the user's where theirs do (a change the search does not vary can make
    the user's workers beat a recommendation without worker processes), else None. Either way it is
    measured against the recommendation."""
    for s in (a.best.settings, a.mine.settings):
        if not s.worker_threads and s.num_workers >= least:
            return s
    return None


def adopt(a: Advising, pair: tuple[Trial, Trial]) -> None:
    """The change its rounds measured faster becomes the recommendation: the whole run predicted anew from
    its runs; the longer runs that confirmed the settings without it, and what they overturned, no longer
    speak for it."""
    a.best = pair[1]
    a.trials.append(a.best)
    a.run = whole_run(a.mine, a.best, a.trials, None, epochs=a.epochs, batches=a.per_epoch)
    a.longer = a.confirmed = a.overturned = None
    a.changed_after = True


def measured(out: dict[str, Any]) -> str:
    """What the rounds measured, in words: the gain, the rounds, and why it is not faster where it is not."""
    text = f"{out['measured_gain']:.2f}x in {out['rounds']} interleaved round{'s' if out['rounds'] != 1 else ''}"
    if out["faster"]:
        return text
    if out["rounds"] < REPEATS:
        return text + f", fewer than the {REPEATS} a decision needs (the check's share of the budget ran out)"
    return text + ", not beyond the noise of their runs"
