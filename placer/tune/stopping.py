"""A ``placer tune`` search stopped by Ctrl-C: what it measured so far, as a result marked interrupted.

May import: placer.tune.{search,caching}, placer.stream.dropin (its trials, merged).

A stopped search keeps every run it completed. What it recommends follows the rule every
recommendation is made by: a setting is recommended only by its completed interleaved rounds
(:func:`placer.stream.dropin.decide`), never from a first round or from rounds cut short, since a
single run is the luckiest of many. So a search stopped before its rounds decided recommends
nothing (``decided`` is False: the words and the JSON show no recommendation, and
``placer tune --apply`` refuses the saved file); one stopped while the cache inside the Dataset
was weighed keeps the settings its rounds decided, and the cache is not recommended.
"""

from __future__ import annotations

import json
from dataclasses import replace

from placer.stream.dropin import Trial, merged
from placer.tune.caching import CacheResult, not_searched
from placer.tune.search import (CACHE_SEARCH, WEIGHING, Tuned, TuneState, other_loader, settings_dict,
                                user_of)


def stopped(state: TuneState) -> Tuned | None:
    """The result of a search stopped at ``state.step``: its completed runs, marked ``interrupted``.

    Returns None where no run over the search's window completed (Ctrl-C during the script's first
    run or the first run of its settings): nothing was measured to show.
    """
    if state.tuned is not None:
        return _after_the_decision(state)
    runner = state.runner
    trials = by_settings(runner.measured) if runner is not None else []
    if not trials or state.rec is None or state.as_written is None:
        return None
    mine = settings_dict(state.as_written)
    if settings_dict(trials[0].settings) != mine:
        return None  # the first run over the window is always the script as written
    rec = state.rec
    return Tuned(command=state.command, site=rec["site"], others=[other_loader(r) for r in state.others],
                 user=user_of(trials), recommended=user_of(trials), trials=trials, noise=None,
                 startup_s=state.startup_s, budget_s=state.budget_s, used_s=state.used_s(),
                 batches=state.batches, arguments=rec.get("arguments", {}), runs=runner.runs,
                 iterable=bool(rec.get("iterable")), cache=_unweighed(state.cache, state.step),
                 interrupted=state.step, decided=False)


def by_settings(measured: list[Trial]) -> list[Trial]:
    """Each setting's runs as one trial (:func:`placer.stream.dropin.merged`), in the order first run."""
    groups: dict[str, list[Trial]] = {}
    for t in measured:
        groups.setdefault(json.dumps(settings_dict(t.settings), sort_keys=True), []).append(t)
    return [merged(runs[0], runs[1:]) for runs in groups.values()]


def _after_the_decision(state: TuneState) -> Tuned:
    """The settings were decided by their rounds: they stand; a cache whose rounds were under way is not kept."""
    t = state.tuned
    if state.step != WEIGHING or t.cache is None:
        return t  # nothing was left to measure: the result is whole
    cache = replace(t.cache, recommended=False,
                    reason=f"stopped by Ctrl-C while it was weighed, after {len(t.cache.plain)} complete "
                           "round(s) of your script with and without it: not decided")
    return replace(t, cache=cache, interrupted=state.step, used_s=state.used_s())


def _unweighed(cache: CacheResult | None, step: str) -> CacheResult | None:
    """The cache as far as it was looked for, before the settings were decided: not weighed, not recommended."""
    if step == CACHE_SEARCH:
        return not_searched("stopped by Ctrl-C while it was looked for")
    if cache is not None and cache.found.get("recommended"):
        return replace(cache, reason="offered by the search in the script's process, not weighed: stopped by "
                                     "Ctrl-C before its rounds")
    return cache
