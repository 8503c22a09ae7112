"""Deciding between settings by repeated, interleaved runs: the one rule the stream wing decides by.

May import: placer.timing.

The drop-in (:mod:`placer.stream.dropin`), the verification of a stream plan
(:mod:`placer.stream.verify`) and the advisor's rounds of a plan against its baselines
(:mod:`placer.advisor`) measure settings on a machine whose speed moves while they run. They
share what is written here:

- **Interleaved rounds** (:func:`interleave`): each round runs every setting once, in turn, so
  that a change of the machine's load falls on all of them alike.
- **A gain worth a change** (:data:`MIN_GAIN`): a setting replaces another only when it is
  faster on the median by this share.
- **Beyond the noise** (:func:`beats`): and only when its slowest run beats the other's fastest,
  or it won so many rounds that a setting no faster would win as many with a chance of at most
  :data:`SIGN_LEVEL` (a one-sided sign test over the rounds, :func:`placer.timing.sign_tail`).
  A majority of rounds is not enough: on a shared machine whose rounds swing by a quarter, a
  setting that wins 3 of 5 rounds by 6 % on the median is as often slower as faster.
- **Settle** (:data:`SETTLE_ROUNDS`): a gain that the median shows but the rounds do not is
  given more rounds, budget permitting, before the incumbent is kept.

The rule and its reasons in words: ``docs/streams.md`` ("Deciding by repeated runs").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from placer.timing import sign_tail

K = TypeVar("K", bound=Hashable)

#: a setting replaces another only when it is this much faster (the median of its runs over the other's):
#: below it, the change is not worth its risk on a machine whose runs of one setting spread by more
MIN_GAIN = 0.05
#: runs of each setting before a comparison may be decided (rounds of the paired sign test): three, the
#: fewest whose clean sweep is unlikely by chance (1/8), and enough that one slow run does not move a median
REPEATS = 3
#: the chance a setting no faster than another may have of looking faster and still win (:func:`beats`):
#: that of a clean sweep of :data:`REPEATS` rounds (3 of 3, 4 of 4, 5 of 6, 6 of 7)
SIGN_LEVEL = 0.5 ** REPEATS
#: more interleaved rounds of two settings whose comparison the first rounds left undecided, while the
#: budget has room: a gain of 10-15 % on short, noisy runs needs them
SETTLE_ROUNDS = 4


def faster(mine: float, yours: float, gain: float = MIN_GAIN) -> bool:
    """Whether ``mine`` (a rate: higher is faster) is more than ``gain`` faster than ``yours``."""
    return mine > yours * (1 + gain)


def beats(mine: Sequence[float], yours: Sequence[float], *, pairs: Sequence[tuple[float, float]] | None = None,
          centres: tuple[float, float] | None = None) -> bool:
    """Whether the runs ``mine`` beat ``yours`` (rates: higher is faster) by more than their noise.

    ``mine``'s centre (its median, or ``centres[0]``) must be :data:`MIN_GAIN` faster than
    ``yours``'s, and either its slowest run faster than ``yours``'s fastest, or its runs faster
    than ``yours``'s of the same round (``pairs``: each run with the other's of its round; by
    default in the order run) in so many of at least :data:`REPEATS` rounds that a setting no
    faster would win as many with a chance of at most :data:`SIGN_LEVEL`.
    """
    if not mine or not yours:
        return False
    a, b = centres if centres is not None else (statistics.median(mine), statistics.median(yours))
    if not faster(a, b):
        return False
    if min(mine) > max(yours):
        return True
    pairs = list(zip(mine, yours)) if pairs is None else list(pairs)
    wins = sum(x > y for x, y in pairs)
    return len(pairs) >= REPEATS and sign_tail(wins, len(pairs)) <= SIGN_LEVEL


def most_rounds(mine: Sequence[float], yours: Sequence[float]) -> bool:
    """Whether ``mine`` ran faster than ``yours`` in most of the rounds both ran (at least two): the weaker
    test that ranks candidates among themselves, before one is weighed against the incumbent by :func:`beats`."""
    pairs = list(zip(mine, yours))
    return len(pairs) >= 2 and sum(a > b for a, b in pairs) * 2 > len(pairs)


def paired(mine: Sequence[float], started: Sequence[float], yours: Sequence[float],
           yours_started: Sequence[float]) -> list[tuple[float, float]]:
    """Each run of ``mine`` with ``yours``'s run of the same round: the last of ``yours`` started before it
    (every round runs ``yours`` first), else ``yours``'s first. Without start times, in the order run."""
    if len(started) != len(mine) or len(yours_started) != len(yours) or not yours:
        return list(zip(mine, yours))
    out = []
    for rate, when in zip(mine, started):
        before = [k for k, w in enumerate(yours_started) if w <= when]
        out.append((rate, yours[before[-1] if before else 0]))
    return out


def spread(rates: Sequence[float]) -> float:
    """How far runs of one setting disagree: their range over their median; 0 for fewer than two."""
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / max(float(statistics.median(rates)), 1e-12)


def ratio_spread(mine: Sequence[float], yours: Sequence[float]) -> float:
    """How far the rounds' ratios (``mine`` over ``yours``, round by round) lie apart, as a share of their
    median; 0 where a run measured nothing (no ratio to settle)."""
    ratios = [a / b if a > 0 and b > 0 else 0.0 for a, b in zip(mine, yours)]
    if not ratios or min(ratios) <= 0:
        return 0.0
    return (max(ratios) - min(ratios)) / statistics.median(ratios)


def rotated(names: Sequence[K], r: int) -> list[K]:
    """The order of round ``r`` that starts each round with the next name: every name leads in turn."""
    k = r % len(names) if names else 0
    return [*names[k:], *names[:k]]


def interleave(names: Sequence[K], run: Callable[[K], Any], rounds: int, *,
               order: Callable[[Sequence[K], int], Sequence[K]] | None = None,
               fits: Callable[[int, K], bool] | None = None,
               more: Callable[[int], bool] | None = None) -> int:
    """Up to ``rounds`` rounds, each running every one of ``names`` once, in turn: ``run(name)``, which keeps
    what it measured.

    ``order(names, r)`` gives round ``r``'s order (default: as given; :func:`rotated` leads with each
    in turn); ``fits(r, name)``, asked before each run, skips the run when False; ``more(r)``, asked
    before each round, ends the rounds when False. Returns the rounds begun.
    """
    begun = 0
    for r in range(rounds):
        if more is not None and not more(r):
            break
        begun += 1
        for k in (names if order is None else order(names, r)):
            if fits is None or fits(r, k):
                run(k)
    return begun
