"""``placer tune``'s cache inside the Dataset: found in the script's process, weighed by runs of the script.

May import: placer.tune.runs, placer.stream.rounds (the rule a change is decided by), numpy.

The drop-in's search (:func:`placer.stream.dataset_cache.find_cache`) runs inside one run of the
script, at the first ``iter()`` of the loader that holds the loop (the hook's ``cache`` mode): which
method of the dataset's own is pure in its arguments, repeats them from one epoch to the next, fits
the memory budget, and makes the loader's passes faster once filled. It cannot call the script's
step, so what it measured is the loader's alone (``epoch_speedup``: epochs 2+ over an uncached
epoch). Where it offers a cache, the script itself decides: the chosen settings without the cache
and the same settings with it, in interleaved rounds of whole-script runs that each read the same
window of at least two epochs and a batch (:func:`cache_window`: a cache fills in the first epoch
and pays from the second), recommended only by the rule every change is decided by
(:func:`placer.stream.rounds.beats`), and only where every cached run read the batches the uncached
runs read (the hook's digest of the timed loader's batches).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from placer.stream.rounds import MIN_GAIN, REPEATS, SETTLE_ROUNDS, beats, faster
from placer.tune.runs import run_script

#: the search's share of ``placer tune``'s budget (its profile, purity checks and loader passes)
FIND_SHARE = 0.10
#: the search's passes run at most this many of the loader's first batches (the drop-in's default)
FIND_BATCHES = 20
#: the search is given at least this many seconds, or not run
MIN_FIND_S = 3.0
#: rounds reserved for weighing a cache: the fewest the rule decides in (every cached run faster than every
#: uncached one, :func:`placer.stream.rounds.beats`); the rounds up to ``REPEATS`` run where the time left has room
FIRST_ROUNDS = 2


@dataclass
class CacheResult:
    """What ``placer tune`` found and measured about a cache inside the Dataset.

    Attributes
    ----------
    found : dict
        The search's result in the script's process (:meth:`CacheAdvice.as_dict
        <placer.stream.cache_advice.CacheAdvice.as_dict>`: ``method``, ``recommended``, ``reason``,
        ``epoch_speedup``, ``fill_s``, ``cached_s``, ``hit_rate``, ``bytes``, ``budget_bytes``, ...),
        or ``{"method": None, "reason": ...}`` where it was not run.
    plain, cached : list of float
        Samples/s of the counted batches of each round's run without the cache and with it (the
        same settings, the same window), round by round.
    batches : int
        Batches each of those runs counted (the window).
    recommended : bool
        Whether the cache is recommended (by the rule, over those rounds).
    reason : str
        Why (not), in words.
    """

    found: dict[str, Any]
    plain: list[float] = field(default_factory=list)
    cached: list[float] = field(default_factory=list)
    batches: int = 0
    recommended: bool = False
    reason: str = ""

    @property
    def method(self) -> str | None:
        return self.found.get("method")

    @property
    def gain(self) -> float | None:
        """The cached runs' median samples/s over the uncached runs' (the same window, the same settings)."""
        if not self.plain or not self.cached:
            return None
        return statistics.median(self.cached) / max(statistics.median(self.plain), 1e-12)

    def spec(self) -> dict[str, Any] | None:
        """What ``--apply`` and the hook need to apply the cache (None where it is not recommended)."""
        if not self.recommended:
            return None
        return {"method": self.method, "budget_bytes": int(self.found["budget_bytes"])}

    def as_dict(self) -> dict[str, Any]:
        f = self.found
        gain = self.gain
        return {"method": self.method, "recommended": self.recommended, "reason": self.reason,
                "gain": None if gain is None else round(gain, 4),
                "gain_rounds": [round(c / p, 4) for c, p in zip(self.cached, self.plain) if p > 0],
                "window_batches": self.batches, "epoch_speedup": f.get("epoch_speedup"),
                "fill_s": f.get("fill_s"), "cached_s": f.get("cached_s"), "hit_rate": f.get("hit_rate"),
                "bytes": f.get("bytes"), "budget_bytes": f.get("budget_bytes"), "search": f}


def not_searched(reason: str) -> CacheResult:
    """A cache that was not looked for, and why."""
    return CacheResult({"method": None, "recommended": False, "reason": reason}, reason=reason)


def find(command: list[str], site: str, rec: dict[str, Any], *, budget_s: float, startup_s: float,
         budget_bytes: int | None = None) -> CacheResult:
    """Look for a cache inside the dataset of the loader built at ``site``, in one run of ``command``.

    ``rec`` is that loader as the first run saw it: a map-style dataset with a length is searched; an
    ``IterableDataset`` is not (its items have no key to be found again by).
    """
    if rec.get("iterable"):
        return not_searched("an IterableDataset yields its items in its own order, with no key to find an item "
                            "again by: nothing can be cached by its arguments")
    if not rec.get("length"):
        return not_searched("the loader has no length (a map-style dataset with __len__ is searched)")
    if budget_s < MIN_FIND_S:
        return not_searched(f"the budget left {budget_s:.0f} s for the search, under {MIN_FIND_S:.0f} s: "
                            "a larger --budget-s looks for one")
    batches = max(1, min(FIND_BATCHES, int(rec["length"])))
    run = run_script(command, {"mode": "cache", "target": site, "settings": None,
                               "find": {"batches": batches, "budget_s": budget_s, "budget_bytes": budget_bytes}},
                     timeout_s=2 * (startup_s + budget_s) + 30.0)
    found = run.report.get("cache")
    if found is None:
        why = run.report.get("error") or ("the run took too long" if run.timed_out else f"exit status {run.returncode}")
        return not_searched(f"the search's run of the script found nothing to report ({why})")
    return CacheResult(found, reason=found.get("reason") or "")


def cache_window(batches: int, epoch_batches: int | None) -> int:
    """Counted batches of a run that weighs the cache: the search's window, and at least two epochs and a batch
    (the filling epoch and one that reads the cache; the batch past it pays the second epoch boundary)."""
    return max(batches, 2 * int(epoch_batches or 0) + 1)


def weigh(result: CacheResult, once: Callable[[bool], tuple[float, str | None] | None],
          fits: Callable[[int], bool], batches: int) -> CacheResult:
    """Interleaved rounds of the chosen settings without the cache and with it, then the decision.

    ``once(cached)`` runs the script once (with the cache or without it) and returns its counted
    samples/s and the digest of its counted batches, or None where the run failed; ``fits(n)`` says
    whether ``n`` more runs fit the budget. Up to ``REPEATS`` rounds (each the uncached run first;
    from the second on, none once the rule has decided), then up to ``SETTLE_ROUNDS`` more while the
    median gain is there but the rounds do not yet show it beyond their noise.
    """
    result.batches = batches
    plain: set[str | None] = set()
    cached: set[str | None] = set()

    def round_() -> bool:
        got = [once(False), once(True)]
        if any(g is None for g in got):
            return False
        result.plain.append(got[0][0])
        result.cached.append(got[1][0])
        plain.add(got[0][1])
        cached.add(got[1][1])
        return True

    for r in range(REPEATS):
        if (r >= FIRST_ROUNDS and decided(result)) or not fits(2):
            break
        round_()
    for _ in range(SETTLE_ROUNDS):
        if decided(result) or not _near(result) or not fits(2):
            break
        round_()
    if len(plain) > 1:
        # thread workers whose items draw from a global generator, say: the settings alone change the batches
        # from run to run, so the cache's cannot be set against them (its method was checked pure by the search)
        return judge(result, same=True, note="the script's batches differ from run to run with these settings "
                                              "alone, so the cached runs' were not compared with them")
    return judge(result, same=len(plain | cached) <= 1)


def decided(result: CacheResult) -> bool:
    return beats(result.cached, result.plain, pairs=list(zip(result.cached, result.plain)))


def _near(result: CacheResult) -> bool:
    """Whether the rounds so far leave the cache's gain in reach: its median faster by the gain a change needs."""
    return bool(result.plain) and faster(statistics.median(result.cached), statistics.median(result.plain))


def judge(result: CacheResult, *, same: bool = True, note: str = "") -> CacheResult:
    """Recommend the cache where its rounds beat the uncached ones by the rule, and its batches are the same;
    ``note`` is added to the reason."""
    n = len(result.plain)
    gain = result.gain
    if not same:
        result.reason = "the script's batches with the cache differ from its batches without it"
    elif n == 0:
        result.reason = "no run of the script with and without the cache fitted the budget: a larger --budget-s " \
                        "weighs it"
    elif decided(result):
        result.recommended = True
        result.reason = (f"{gain:.2f}x over {result.batches} batches in {n} interleaved rounds of your script "
                         f"with and without it")
    elif n < REPEATS:
        result.reason = (f"{_rounds(result)} over {result.batches} batches, but only {n} of the {REPEATS} rounds "
                         "the rule needs fitted the budget: a larger --budget-s weighs it")
    else:
        result.reason = (f"{_rounds(result)} over {result.batches} batches: not more than {MIN_GAIN:.0%} faster "
                         "beyond the noise of the rounds")
    if note:
        result.reason += f" ({note})"
    return result


def _rounds(result: CacheResult) -> str:
    ratios = [c / p for c, p in zip(result.cached, result.plain) if p > 0]
    if not ratios:
        return "no measured round"
    return f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}x)"


def runs_needed(per_run_s: float) -> float:
    """Seconds the rounds reserved for weighing a cache take at ``per_run_s`` a run: ``FIRST_ROUNDS`` rounds of
    two runs."""
    return 2 * FIRST_ROUNDS * per_run_s if math.isfinite(per_run_s) else math.inf
