"""The user's whole run (epochs x batches) predicted with each setting, with the cache the advice offers.

May import: numpy, placer.stream.rounds, placer.stream.wholerun, placer.stream.dropin.{deciding,trial}.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from placer.stream import rounds
from placer.stream.dropin.deciding import user_speeds
from placer.stream.dropin.trial import Trial, merged
from placer.stream.rounds import MIN_GAIN
from placer.stream.wholerun import RunCosts, cached_run_seconds, costs, run_seconds


def confirmed_gain(run: dict[str, Any] | None, longer: tuple[Trial, Trial, int]) -> float:
    """The recommendation's gain as its longer runs measured it: over the whole run they predict
    (:func:`whole_run`), or, the run's shape unknown, in the steady state."""
    return run["speedup"] if run is not None else longer[1].samples_per_s / max(longer[0].samples_per_s, 1e-12)


def over_faster(mine: Trial, longer: tuple[Trial, Trial, int], run: dict[str, Any] | None) -> float | None:
    """The recommendation's gain over the user's faster runs, where all of theirs (the search's and the confirming
    runs) ran at two speeds (:func:`user_speeds`); None where they ran at one.

    A change is confirmed only where this gain, the one the advice claims, clears ``MIN_GAIN`` too: a change
    whose claim is no gain is no advice, whichever speed the user's script then meets."""
    speeds = user_speeds(merged(mine, [longer[0]]), longer[1], basis=longer[0], speedup=confirmed_gain(run, longer))
    return None if speeds is None else speeds.get("speedup")


def run_spread(runs: list[Trial]) -> float:
    """How far one setting's runs disagree: the range of their whole-run samples/s (each run's own
    steady samples/s where the run's shape is unknown) over their median; 0 for fewer than two runs."""
    return rounds.spread([r for t in runs for r in (t.run_rates or (t.samples_per_s,))])


def refill_s(trials: list[Trial]) -> float | None:
    """One batch loaded while workers run: the first batch of a run without workers (none measured: None)."""
    zero = [t.first_batch_s for t in trials if not t.settings.num_workers]
    return float(np.median(zero)) if zero else None


def run_costs(t: Trial, refill: float | None, per_epoch: int | None = None) -> Any:
    """A setting's run costs; from a run that read a whole epoch, its time per batch is that run's own
    (first batch to last), not the steady window's: an epoch too short to reach a steady state (its
    batches fit the workers' queue) runs as that run did."""
    if per_epoch and t.read >= per_epoch > 1 and t.read_s > t.first_batch_s:
        rate = (t.read - 1) * (t.samples / max(t.batches, 1)) / (t.read_s - t.first_batch_s)
        t = replace(t, samples_per_s=rate)
    return costs(first_batch_s=t.first_batch_s, samples_per_s=t.samples_per_s,
                 samples_per_batch=t.samples / max(t.batches, 1), close_s=t.close_s, refill_s=refill,
                 workers=t.settings.num_workers,
                 persistent=t.settings.persistent_workers and not t.settings.worker_threads)


def whole_run(user: Trial, best: Trial, trials: list[Trial], longer: tuple[Trial, Trial, int] | None, *,
              epochs: int, batches: int | None) -> dict[str, Any] | None:
    """The user's run (``epochs`` x ``batches``) predicted with their settings and the recommended.

    Each setting's costs (:class:`~placer.stream.wholerun.RunCosts`) come from its longer
    confirming runs where there are some, else from the search's runs; the recommended
    setting's costs are those of its own ``persistent_workers``. None when the batches
    per epoch are unknown (an iterable dataset without a length).
    """
    if not batches:
        return None
    refill = refill_s(trials)
    u, b = (longer[0], longer[1]) if longer is not None else (user, best)
    b = replace(b, settings=best.settings)
    cu, cb = run_costs(u, refill, batches), run_costs(b, refill, batches)
    user_s, best_s = run_seconds(cu, epochs=epochs, batches=batches), run_seconds(cb, epochs=epochs, batches=batches)
    samples = epochs * batches * (u.samples / max(u.batches, 1))
    out = {"epochs": epochs, "batches": batches, "user_s": round(user_s, 3), "recommended_s": round(best_s, 3),
           "speedup": round(user_s / max(best_s, 1e-12), 3),
           "user_samples_per_s": round(samples / user_s, 2), "recommended_samples_per_s": round(samples / best_s, 2),
           "user_costs": cu.as_dict(), "recommended_costs": cb.as_dict(),
           "from": "confirming runs" if longer is not None else "search runs"}
    if best.settings.num_workers and not best.settings.worker_threads and epochs > 1:
        other = replace(cb, persistent=not cb.persistent)
        out["without_persistent_s" if cb.persistent else "with_persistent_s"] = round(
            run_seconds(other, epochs=epochs, batches=batches), 3)
    return out


def with_cache(run: dict[str, Any] | None, cache: Any) -> dict[str, Any] | None:
    """The whole run with the cache the advice offers (``advice.loader()`` applies it): its first epoch
    fills the cache, the later ones read it, each at the ratio the cache search measured over the
    same batches with the user's settings (:func:`~placer.stream.wholerun.cached_run_seconds`).
    ``run`` unchanged when no cache is offered; its ``speedup`` is then the settings' alone."""
    if run is None or cache is None or not cache.recommended or not cache.uncached_s or not cache.cached_s \
            or cache.fill_s is None:
        return run
    uncached = float(np.median(cache.uncached_s))
    # filling does an uncached epoch's work and stores it: a fill measured faster is the machine's noise
    fill = max(1.0, cache.fill_s / max(cache.first_uncached_s, 1e-12))
    hit = float(np.median(cache.cached_s)) / max(uncached, 1e-12)
    at_best = RunCosts(**{k: run["recommended_costs"][k] for k in
                        ("start_s", "per_batch_s", "close_s", "refill_s", "persistent")})
    best_s = cached_run_seconds(at_best, epochs=run["epochs"], batches=run["batches"], fill=fill, hit=hit)
    samples = run["user_samples_per_s"] * run["user_s"]
    return {**run, "settings_speedup": run["speedup"], "settings_recommended_s": run["recommended_s"],
            "recommended_s": round(best_s, 3), "speedup": round(run["user_s"] / max(best_s, 1e-12), 3),
            "recommended_samples_per_s": round(samples / best_s, 2),
            "cache": {"fill": round(fill, 4), "hit": round(hit, 4)}}


def cached_passes_s(cache: Any, epochs: int) -> float | None:
    """Seconds of ``epochs`` epochs over the cache's passes, measured at one setting: the filling pass
    (median), then ``epochs - 1`` cached reads (median); None where it has no such passes."""
    if cache is None or not getattr(cache, "recommended", False) or cache.fill_s is None or not cache.cached_s:
        return None
    return cache.fill_s + (epochs - 1) * float(np.median(cache.cached_s))


def cache_over_epochs(run: dict[str, Any], cache: Any, epochs: int) -> float | None:
    """The run's speed-up with the cache over ``epochs`` epochs of its batches, its recommended settings
    kept (:func:`with_cache` on the run's costs); None where the cache has no measured passes."""
    cached = with_cache({**run, "epochs": epochs, "user_s": 1.0, "user_samples_per_s": 1.0}, cache)
    if cached is None or "cache" not in cached:
        return None
    at_best = RunCosts(**{k: run["recommended_costs"][k] for k in
                        ("start_s", "per_batch_s", "close_s", "refill_s", "persistent")})
    return run_seconds(at_best, epochs=epochs, batches=run["batches"]) / max(cached["recommended_s"], 1e-12)


def cache_pays_from(run: dict[str, Any], cache: Any, *, most: int = 1000) -> int | None:
    """The fewest epochs over which the cache makes the run ``MIN_GAIN`` faster; None within ``most``."""
    gain = cache_over_epochs(run, cache, most)
    if gain is None or gain < 1 + MIN_GAIN:
        return None
    lo, hi = 1, most  # the gain rises with the epochs (each later epoch reads the cache), so bisect
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cache_over_epochs(run, cache, mid) >= 1 + MIN_GAIN else (mid + 1, hi)
    return lo


def cache_over_the_run(run: dict[str, Any] | None, cache: Any, *,
                       assumed: bool = False) -> tuple[dict[str, Any] | None, Any]:
    """The whole run with the cache (:func:`with_cache`), when the cache makes it ``MIN_GAIN`` faster;
    otherwise the cache is not offered (``recommended`` False, and why): over a run of one epoch, or
    of a few short ones, filling the cache costs more than reading it saves.

    Where the run's epochs were ``assumed`` (not given), a cache that pays over more epochs is still
    offered, outside the run's prediction, with the epochs it needs (``pays_from_epochs``) and its
    gain over them (``by_epochs``): the user knows their epochs, the advice does not."""
    cached = with_cache(run, cache)
    if cached is run or cached["recommended_s"] * (1 + MIN_GAIN) <= cached["settings_recommended_s"]:
        return cached, cache
    n, pays = run["epochs"], cache_pays_from(run, cache)
    by_epochs = {} if pays is None else {k: round(cache_over_epochs(run, cache, k), 3)
                                          for k in sorted({n, pays, max(pays, 10)})}
    if assumed and pays is not None:
        return run, replace(cache, pays_from_epochs=pays, by_epochs=by_epochs)
    why = (f"over your run ({n} epoch{'s' if n != 1 else ''} x {run['batches']} batches) it would take "
           f"{cached['recommended_s']:.2f} s against {run['recommended_s']:.2f} s without it: filling it costs "
           "more than reading it saves" + (f"; it pays from {pays} epochs" if pays is not None else ""))
    return run, replace(cache, recommended=False, reason=why, pays_from_epochs=pays, by_epochs=by_epochs)
