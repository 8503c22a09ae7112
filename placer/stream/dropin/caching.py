"""The cache's part of the advice: caching found inside the dataset, measured again with the recommended
settings, and weighed against fewer workers.

May import: placer.data.stream, placer.devices, placer.timing, placer.stream.{dataset_cache,rounds},
placer.stream.dropin.{guards,trial,whole}.
"""

from __future__ import annotations

import logging
from typing import Any

from placer.data.stream import LoaderSettings
from placer.devices import Device
from placer.stream import dataset_cache
from placer.stream.dropin.guards import past_the_cores, random_state_kept
from placer.stream.dropin.trial import Trial
from placer.stream.dropin.whole import cache_over_the_run, cached_passes_s, whole_run
from placer.stream.rounds import MIN_GAIN
from placer.timing import torch_threads

log = logging.getLogger(__name__)


#: the search for a cache inside the dataset takes at most this share of the budget, before the settings' runs
CACHE_SHARE = 0.25


def find_cache(loader: Any, step: Any, user: LoaderSettings, batches: int, budget_s: float,
               cache_bytes: int | None, dev: Device) -> Any:
    """Caching inside the dataset, found and measured with the user's settings (None when not looked for)."""
    if cache_bytes == 0:
        return None
    try:
        with torch_threads(user.torch_threads), past_the_cores():
            return dataset_cache.find_cache(loader, step, loader_kwargs=user.kwargs(), batches=batches,
                                            budget_s=budget_s, budget_bytes=cache_bytes, sync=dev.synchronize)
    except Exception as e:  # noqa: BLE001 - a dataset that cannot be probed still gets its loader advice
        log.warning("could not look for a cache inside the dataset: %s: %s", type(e).__name__, e)
        return dataset_cache.CacheAdvice(None, reason=f"probing the dataset failed: {type(e).__name__}: {e}")


def cache_at(cache: Any, loader: Any, step: Any, settings: LoaderSettings, batches: int, budget_s: float,
             dev: Device) -> Any:
    """The cache's passes measured again with the recommended ``settings`` (its workers, its step
    threads), so that the whole run it claims is that of the settings it runs with
    (:func:`placer.stream.dataset_cache.measure_at`); as found where that fails. Not for a thread-pool
    loader, which the cache's passes (a DataLoader) cannot run."""
    try:
        with random_state_kept(loader), torch_threads(settings.torch_threads), past_the_cores():
            return dataset_cache.measure_at(cache, loader, step, loader_kwargs=settings.kwargs(), batches=batches,
                                            budget_s=budget_s, sync=dev.synchronize)
    except Exception as e:  # noqa: BLE001 - the cache's first measurement still stands
        log.warning("could not measure the cache again with the recommended settings: %s: %s", type(e).__name__, e)
        return cache


def without_workers(user: Trial, best: Trial, trials: list[Trial], longer: tuple[Trial, Trial, int] | None,
                    found: Any, run: dict[str, Any] | None, loader: Any, step: Any, batches: int, budget_s: float,
                    dev: Device, *, epochs: int, per_epoch: int | None,
                    at_best: Any = None) -> tuple[Trial, dict[str, Any], Any, str, str] | None:
    """The fastest setting measured without workers, with its whole run and cache and the two runs' words
    (its, ``best``'s), where the cache is offered beside ``best``'s workers and that setting runs the
    user's whole run with the cache within ``MIN_GAIN`` of ``best``'s (``run``); else None.

    The search ranks the settings without the cache, and a worker earns its place there by overlapping
    the work the cache then keeps: with the cache, a worker that tied no workers in the search has little
    left to overlap, and costs its start-up. The setting without workers has its cache passes measured at
    its own settings (``found``, the cache search's, where they are the user's).

    Each whole run scales the cache's passes by its setting's own runs in the search, whose spread the
    passes then carry (a slow search run of no workers would keep the worker). So where ``best``'s
    passes were measured at its own settings (``at_best``), the passes also decide directly: both loaders
    ran the same batches, filling the cache and reading it, so the filling pass and ``epochs - 1`` reads
    are each setting's epochs with the cache, measured without a search run's rate in between.
    """
    if run is None or "cache" not in run or not best.settings.num_workers or not per_epoch:
        return None
    bare = [t for t in trials if not t.settings.num_workers]
    if not bare:
        return None
    alt = max(bare, key=lambda t: t.score)
    at = found if alt.settings == user.settings else cache_at(found, loader, step, alt.settings, batches,
                                                                budget_s, dev)
    u = (longer[0], alt, longer[2]) if longer is not None else None
    alt_run, cache = cache_over_the_run(whole_run(user, alt, trials, u, epochs=epochs, batches=per_epoch), at)
    if alt_run is None or "cache" not in alt_run:
        return None
    words = (f"would take {alt_run['recommended_s']:.2f} s over your whole run", f"{run['recommended_s']:.2f} s")
    if alt_run["recommended_s"] <= run["recommended_s"] * (1 + MIN_GAIN):
        return alt, alt_run, cache, *words
    mine, theirs = cached_passes_s(at, epochs), cached_passes_s(at_best, epochs)
    # each setting's passes measured at its own settings (where a new measurement failed, it is the user's)
    measured = all(c is not found or t.settings == user.settings for c, t in ((at, alt), (at_best, best)))
    if not measured or mine is None or theirs is None or mine > theirs * (1 + MIN_GAIN):
        return None
    n = at.batches or batches
    return alt, alt_run, cache, (f"ran the cache's passes over the same {n} batches (filling it, then {epochs - 1} "
                                 f"reads, as your {epochs} epochs would) in {mine:.2f} s"), f"in {theirs:.2f} s"
