"""Widening the search after its first round: more workers while the rate rises, other prefetch depths, and
fewer intra-op threads for the step.

May import: placer.data.stream, placer.devices, placer.stream.rounds, placer.stream.dropin.{measuring,runs,space,trial}.
"""

from __future__ import annotations

from typing import Any

from placer.data.stream import LoaderSettings
from placer.devices import Device
from placer.stream.dropin import space
from placer.stream.dropin.measuring import SampleCount
from placer.stream.dropin.runs import Budget, run_trial
from placer.stream.dropin.space import MORE_ROUNDS, WIDEN_RUNS, depth_bases, measured_as, more_workers
from placer.stream.dropin.trial import Trial
from placer.stream.rounds import MIN_GAIN


def widen(loader: Any, trials: list[Trial], step: Any, batches: int, dev: Device, budget: Budget,
          count: SampleCount, cores: int, keep: int = 0) -> None:
    """After the first round: more workers while the rate rises, then other prefetch depths (:func:`depth_bases`).

    A run starts only while it leaves room for ``keep`` more runs (those that decide: the
    step's threads and the repeats), at the mean run's length so far.
    """
    def seen(s: LoaderSettings) -> bool:
        return any(measured_as(s) == measured_as(t.settings) for t in trials)

    def attempt(s: LoaderSettings) -> None:
        nonlocal planned
        planned -= 1
        if budget.leaves(keep) and (t := run_trial(loader, s, step, batches, dev, budget, count=count)) is not None:
            trials.append(t)

    planned = WIDEN_RUNS  # the runs the budget counted for widening
    for _ in range(MORE_ROUNDS):
        more = [s for s in more_workers(trials, cores=cores) if not seen(s)]
        if not more:
            break
        for s in more:
            attempt(s)
    for base in depth_bases(trials):
        for s in space.prefetch_depths(base, [t.settings for t in trials]):
            attempt(s)
    budget.runs -= max(planned, 0)  # counted but not tried: their shares go to the runs to come


def try_threads(loader: Any, best: Trial, step: Any, batches: int, dev: Device, budget: Budget,
                trials: list[Trial], *, cores: int) -> tuple[Trial, dict[str, Any] | None]:
    """Fewer intra-op threads for the step: measured with the best loader setting found, the user's,
    and the best of each kind of workers (processes, threads).

    Knobs interact: on a machine with few cores, loader workers and the step's intra-op
    threads compete for them, so workers that lose to the user's settings at the step's
    threads may win with fewer.
    """
    now = best.settings.torch_threads
    tried = []
    # with the best loader setting found, and with the user's (which a step that waits for data
    # only within noise keeps: fewer threads may still make its step faster)
    bases = [best.settings, *([trials[0].settings] if best is not trials[0] else [])]
    for kind in (False, True):  # the best process workers, the best thread workers
        same = [t for t in trials if t.settings.num_workers and t.settings.worker_threads is kind
                and t.settings.torch_threads == now]
        top = max(same, key=lambda t: t.score, default=None)
        if top is not None and top.settings not in bases:
            bases.append(top.settings)
    for base in bases:
        for n in space.thread_counts(now, base.num_workers, cores):
            s = base.model_copy(update={"torch_threads": n})
            seen = next((t for t in trials if measured_as(t.settings) == measured_as(s)), None)
            t = seen if seen is not None else (run_trial(loader, s, step, batches, dev, budget)
                                               if budget.allows() else None)
            if t is not None and t not in tried:  # measured in the first round: not run again
                if seen is None:
                    trials.append(t)
                tried.append(t)
    if not tried:
        return best, None
    top = max(tried, key=lambda t: t.score)
    helped = top.score > best.score * (1 + MIN_GAIN)
    info = {"current": now, "tried": top.settings.torch_threads, "samples_per_s": round(top.samples_per_s, 2),
            "helped": helped, "all_tried": {str(t.settings.torch_threads): round(t.samples_per_s, 2) for t in tried}}
    return (top if helped else best), info


def thread_runs(user: LoaderSettings, cores: int, dev: Device) -> int:
    """The runs :func:`try_threads` may take: two bases (the best and the user's) at each thread count tried."""
    return 2 * len(space.thread_counts(user.torch_threads or 1, 0, cores)) if dev.kind == "cpu" else 0
