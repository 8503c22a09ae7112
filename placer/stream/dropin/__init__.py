"""Advice for an existing training script: its own DataLoader and train step, measured.

May import: placer.stream.rounds, placer.stream.dropin.* (the package's modules, whose public names it
gathers).

:func:`advise_loader` runs the user's DataLoader with the user's step for a bounded
number of batches and answers two questions. *Who waits for whom*: the step alone on
batches fetched once (same shapes) gives the rate the consumer could take, the loader
alone the rate it can deliver, and the two together the rate the script gets; the
step's idle share is ``1 - together / step alone`` (the DS-Analyzer differential).
*Which DataLoader settings are faster*: a few settings (``num_workers`` 0, 1, 2 and
the core count; ``prefetch_factor`` 2 and 4; ``pin_memory`` when the step is on a
real GPU) are rebuilt from the user's loader (same dataset, sampler or batch
sampler, batch size, collate function, generator, ``drop_last``) and measured with
the step, within a time budget, with fewer intra-op threads for the step. After one
run of each, the user's settings and the few fastest run again, interleaved, until
each has three runs. The best is recommended only when its median beats the user's
by a clear margin and its slowest run beats the user's fastest; otherwise the user's
settings are kept (or fewer workers, when they are as fast) and a gain within the
spread is called noise. A step that waits for data only within noise gets no loader
setting at all. Samples are counted from each batch's first array (its leading
dimension), else from the loader's batch size.

The rebuilt loader yields the same batches in the same order: it draws from the
same sampler and the same generator. Measuring draws from them too, so the states
of the loader's generators and of torch's global random generator (which an
unseeded ``shuffle=True`` draws each epoch's order from) are restored afterwards:
the script's training reads what it would have read without the measurement.

:func:`measure` wraps the loader of the user's own loop instead and reports the
share of the loop spent waiting on ``next(loader)``, without trying settings.

Caching: first, within a quarter of the budget more (:data:`CACHE_SHARE`; the settings'
runs keep the whole budget), :func:`~placer.stream.dataset_cache.find_cache`
profiles the dataset's ``__getitem__`` and measures caching the deterministic
per-index work that dominates it; :attr:`LoaderAdvice.cache` says what it found, and
:meth:`LoaderAdvice.loader` applies a cache that was offered.

The package, by what each module does (each imports only those above it):

- :mod:`~placer.stream.dropin.trial`: a measured run as plain data (:class:`Trial`), and settings in words;
- :mod:`~placer.stream.dropin.measuring`: one run of a loader with the step; :mod:`~placer.stream.dropin.guards`:
  the random state kept, torch's warning about many workers silenced;
- :mod:`~placer.stream.dropin.space`: the settings tried;
- :mod:`~placer.stream.dropin.deciding`: which setting wins (the rule of :mod:`placer.stream.rounds`);
  :mod:`~placer.stream.dropin.whole`: the user's whole run predicted;
- :mod:`~placer.stream.dropin.runs`: where and how long runs happen (this process or fresh ones);
- :mod:`~placer.stream.dropin.explore`, :mod:`~placer.stream.dropin.repeats`: the search and its repeated runs;
- :mod:`~placer.stream.dropin.caching`: the cache's part;
- :mod:`~placer.stream.dropin.samples`: the samples timed one by one; :mod:`~placer.stream.dropin.headtohead`: one
  change against the recommendation in rounds of its own; :mod:`~placer.stream.dropin.reorder` (slow samples,
  ``in_order=False``, where ``allow_reorder=True``) and :mod:`~placer.stream.dropin.worker_threads` (one thread
  per worker process), the two changes so checked after the search;
- :mod:`~placer.stream.dropin.words`, :mod:`~placer.stream.dropin.advice`: the advice, its words and its JSON;
- :mod:`~placer.stream.dropin.phases`, :mod:`~placer.stream.dropin.advise`: :func:`advise_loader` as named
  phases; :mod:`~placer.stream.dropin.loop`: :func:`measure`, the user's own loop.
"""


from placer.stream.dropin.advice import LoaderAdvice
from placer.stream.dropin.advise import advise_loader, with_target
from placer.stream.dropin.caching import CACHE_SHARE
from placer.stream.dropin.deciding import (KNOBS, NEAR_BEST, RIVALS, WAIT_NOISE, beats, choose, contender,
                                           decide, decided_by, paired, rivals, runner_up, user_speeds, wait_noise,
                                           within_reach)
from placer.stream.dropin.guards import draws_unseeded
from placer.stream.dropin.loop import MeasuredLoader, measure
from placer.stream.dropin.measuring import SampleCount, counter_of, rebuild, run_loader, settings_of, step_alone
from placer.stream.dropin.repeats import (CONFIRM_AGREED, CONFIRM_LENGTH, CONFIRM_MAX_ROUNDS, CONFIRM_ROUNDS,
                                          CONFIRM_SHARE, CONFIRM_SPREAD, FINALISTS, RACES, confirm)
from placer.stream.dropin.runs import MIN_RUN_S, run_length, run_rate
from placer.stream.dropin.space import (DEPTH_NEAR, MAX_WORKERS, MORE_ROUNDS, PREFETCH, RISE, WIDEN_RUNS,
                                        candidates, depth_bases, more_workers, prefetch_depths, thread_counts)
from placer.stream.dropin.trial import Trial, label, merged
from placer.stream.dropin.whole import cached_passes_s, over_faster, run_spread, whole_run, with_cache
from placer.stream.dropin.words import UNKNOWN_COUNT, describe, verdict
from placer.stream.rounds import MIN_GAIN, REPEATS, SETTLE_ROUNDS

__all__ = ["CACHE_SHARE", "CONFIRM_AGREED", "CONFIRM_LENGTH", "CONFIRM_MAX_ROUNDS", "CONFIRM_ROUNDS", "CONFIRM_SHARE",
           "CONFIRM_SPREAD", "DEPTH_NEAR", "FINALISTS", "KNOBS", "MAX_WORKERS", "MIN_GAIN", "MIN_RUN_S", "MORE_ROUNDS",
           "NEAR_BEST", "PREFETCH", "RACES", "REPEATS", "RISE", "RIVALS", "SETTLE_ROUNDS", "UNKNOWN_COUNT",
           "WAIT_NOISE", "WIDEN_RUNS", "LoaderAdvice", "MeasuredLoader", "SampleCount", "Trial", "advise_loader",
           "beats", "cached_passes_s", "candidates", "choose", "confirm", "contender", "counter_of", "decide",
           "decided_by", "depth_bases", "describe", "draws_unseeded", "label", "measure", "merged", "more_workers",
           "over_faster", "paired", "prefetch_depths", "rebuild", "rivals", "run_length", "run_loader", "run_rate",
           "run_spread", "runner_up", "settings_of", "step_alone", "thread_counts", "user_speeds", "verdict",
           "wait_noise", "whole_run", "with_cache", "with_target", "within_reach"]
