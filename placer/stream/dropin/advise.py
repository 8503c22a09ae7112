"""The drop-in's entry point: :func:`advise_loader`, its phases in order, and the advice they make.

May import: placer.devices, placer.timing, placer.stream.arguments, placer.stream.keep,
placer.stream.dropin.{advice,caching,deciding,fits,guards,headtohead,measuring,phases,pinning,reorder,samples,space,trial,
whole,words,worker_threads}; torch, placer.stream.target_loader and placer.stream.precision_advice inside functions.

How it decides
--------------
Every setting is run once; then the user's settings, the few fastest and the
cheapest near the fastest run ``REPEATS`` times in all, interleaved (one run of each
per round), so that the machine's drift falls on all of them alike. Settings are
ranked by the script's whole run as each run predicts it (:func:`run_rate`: start-up,
epoch ends and the steady state over ``epochs`` x the loader's batches), where the
loader's length is known. A setting is recommended only when its median beats the
user's by ``MIN_GAIN`` and the gain exceeds the noise (:func:`beats`: its slowest run
beats the user's fastest, or its runs beat the user's of the same round in enough rounds,
a sign test); when the fastest's gain is still within noise, it and the user's settings
run up to ``SETTLE_ROUNDS`` more rounds while the budget has room (:func:`settle`), and so do
the fastest whose median is short of ``MIN_GAIN`` but whose fastest run is not (:func:`within_reach`);
otherwise the advice keeps the user's settings and says the difference is within noise.
Before that, settings run once that read faster than every repeated one are repeated with the
user's (:func:`rivals`): a single run's lead is often luck, and so is a finalist's.
A cache the advice offers is in the whole run it claims (:func:`with_cache`).
Settings whose memory over the user's run would pass ``memory_bytes`` are not recommended
(:mod:`~placer.stream.dropin.fits`; each run's memory: :mod:`~placer.stream.dropin.memory`).

The space: worker processes 0, 1, 2 and the cores, thread workers 1, 2 and the cores
(a :class:`~placer.executor.stream.threadloader.ThreadLoader`), then more workers of each kind
while the rate rises (:func:`more_workers`), prefetch 1, 2, 4 and 8 for the fastest
and for the next worker count when it is near (:func:`depth_bases`), and fewer intra-op
threads for the step. A recommendation
is then confirmed by longer runs, interleaved with the user's settings
(:func:`confirm`): it stands only when the whole run it predicts is still
``MIN_GAIN`` faster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from placer.devices import Device
from placer.stream import arguments
from placer.stream.dropin import fits, phases, pinning, reorder, samples, space, worker_threads
from placer.stream.dropin.advice import LoaderAdvice
from placer.stream.dropin.deciding import decided_by, user_speeds
from placer.stream.dropin.guards import draws_unseeded, random_state_kept
from placer.stream.dropin.headtohead import with_processes
from placer.stream.dropin.phases import Advising
from placer.stream.dropin.runs import runs_where
from placer.stream.dropin.trial import Trial, label, merged
from placer.stream.dropin.words import UNKNOWN_COUNT
from placer.stream.keep import keeps_the_process
from placer.timing import Deadline, allocator_as_is


@keeps_the_process  # arguments checked; the step's model, optimizer, generators put back (placer.stream.keep)
@allocator_as_is()  # the user's process: the script runs on in it (placer.timing.allocator_as_is)
def advise_loader(loader: Any, step: Callable[[Any], Any], *, batches: int = 20, budget_s: float = 60.0,
                  device: Any = None, target: Any = None, cache_bytes: int | None = None,
                  epochs: int | None = None, precision: Any = None, state: Any = None,
                  fresh: bool | None = None, allow_reorder: bool = False,
                  memory_bytes: int | None = None) -> LoaderAdvice:
    """Measure a DataLoader with a train step and recommend DataLoader settings (how: the module's docstring).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        The script's own loader; it is not changed (its settings are rebuilt for each run).
    step : callable
        ``step(batch)``: the script's train step, run for real on the measured batches (training a copy of
        the model in fresh processes; in this process, what it trains is put back: :mod:`placer.stream.keep`).
    batches : int
        Batches per measured run, warm-up first; more where they last under ``MIN_RUN_S`` (:func:`run_length`).
    budget_s : float
        Wall-clock budget of all runs together, each stopping at its share (:data:`CONFIRM_SHARE` kept for the
        confirming runs); a cache search inside the dataset takes up to a quarter more, and another after.
    device : str or torch.device, optional
        Where the step runs (``cpu``, ``gpu``, ``gpu:1``, ``cuda:0``); its queued work is waited for at
        the ends of each timed run. Default: ``cpu``.
    target : str or TargetDescription, optional
        Also plan the loader and step for a described machine (``"h200"``, a file ``placer describe``
        wrote): ``advice.target`` (:func:`with_target`), every number a prediction for it.
    cache_bytes : int, optional
        The memory a cache inside the dataset may take (default: a quarter of the memory available);
        ``0`` looks for no cache.
    epochs : int, optional
        Epochs of the script's run: with the loader's length, the whole run is predicted (worker start-up,
        epoch ends, the steady state) and :attr:`LoaderAdvice.speedup` is the whole run's. Not given: one
        epoch, said, and a cache offered with the epochs it needs (:mod:`placer.stream.dropin.epochs`).
    precision : str or tuple of str, optional
        Lower precisions the step may run in (``"bf16"``, ``("tf32", "bf16")``, ``"auto"``): each is
        checked here and, with a ``target``, planned there (:mod:`placer.stream.precision_advice`).
    state : object or tuple, optional
        What the step trains (model, optimizer, scheduler: objects with ``state_dict``), put back after every
        run here and between the precision checks' runs (:mod:`placer.stream.keep`); without it no lower
        precision is chosen.
    fresh : bool, optional
        Make each run in a fresh process, as the script starts (:mod:`placer.stream.fresh`). Default: where
        it can be, else in this process (as ``PLACER_FRESH_RUNS=0`` asks); the notes say which, and why.
    allow_reorder : bool
        May the advice recommend ``in_order=False`` (batches in the order workers finish them, varying run to
        run) where slow samples hold batches back (:mod:`~placer.stream.dropin.reorder`)? Else it says the gain.
    memory_bytes : int, optional
        Bytes the script's process and its loader's workers may hold over the run: settings projected past it
        are not recommended (:mod:`~placer.stream.dropin.fits`; default: the memory available less a margin).

    Returns
    -------
    LoaderAdvice
    """
    from torch.utils.data import IterableDataset

    arguments.check_memory(memory_bytes)
    a = phases.start(loader, step, device=device, batches=batches, budget_s=budget_s, epochs=epochs)
    a.memory_budget = fits.budget_for(memory_bytes)
    cands = space.candidates(a.user, cores=a.cores, gpu=a.dev.is_gpu,
                             iterable=isinstance(loader.dataset, IterableDataset))
    with random_state_kept(loader):
        phases.look_for_cache(a, cache_bytes)
    phases.plan_budget(a, cands)
    with random_state_kept(loader), runs_where(a.budget, loader, step, a.dev, fresh) as runs_in:
        phases.measure_yours(a)
        phases.search(a, cands)
        phases.decide_by_rounds(a)
        phases.confirm_longer(a)
        phases.conclude(a)
        checked = after_search(a, allow_reorder)
    phases.weigh_cache(a)
    fits.hold(a)
    advice = written(a, runs_in["where"])
    advice.reorder, advice.per_worker_threads = checked["reorder"], checked["per_worker_threads"]
    advice.notes += a.notes
    fits.said(advice, a)
    with random_state_kept(loader):
        extras(advice, a, target=target, precision=precision, state=state)
    return advice


def after_search(a: Advising, allow_reorder: bool) -> dict[str, Any]:
    """Two changes the search does not vary, each measured against the recommendation in rounds of its own:
    one thread per worker process (:mod:`~placer.stream.dropin.worker_threads`), then ``in_order=False``
    (:mod:`~placer.stream.dropin.reorder`), both from the loader's samples timed one by one."""
    # both checks change worker processes: without any, in the recommendation or yours, no sample is timed
    timed = (samples.time_samples(a.loader, a.batches, Deadline(a.budget_s * samples.TIME_SHARE))
             if with_processes(a, 1) is not None else None)
    return {"per_worker_threads": worker_threads.consider(a, timed),
            "reorder": reorder.consider(a, timed, allow_reorder)}


def written(a: Advising, runs_in: str) -> LoaderAdvice:
    """The advice the phases made, with the notes that say how it was measured and what it rests on."""
    mine, best, longer = a.mine, a.best, a.longer
    advice = _first_advice(mine, best, a.trials, a.step_rate, a.alone, a.dev, a.threads, a.loader, a.took.spent(),
                           cores=a.cores)
    advice.runs_in, advice.epochs_assumed = runs_in, a.epochs_assumed
    if a.epochs_assumed is not None:
        advice.notes.append(a.epochs_assumed)
    if a.budget.where["here"] is not None:
        advice.notes.append(f"measured in this process, not in fresh ones as your script starts "
                            f"({a.budget.where['here']}): each run started from the heap and allocator the runs "
                            "before it left, not from a script's start, so settings that differ in your script can "
                            "measure closer together or further apart here")
    advice.notes += [f"could not be measured: {s}" for s in a.budget.where.get("stuck", [])]
    advice.budget_s, advice.within_noise, advice.cache = a.budget_s, a.noise, a.cache
    advice.whole_run, advice.confirmed = a.run, a.confirmed
    advice.knobs = decided_by(mine, best, a.trials, a.run)
    if a.overturned is not None:
        advice.notes.append(f"{label(a.overturned.settings)} measured fastest in the search, but longer runs did not "
                            f"confirm it over your whole run; {label(best.settings)} got longer runs next")
    if a.swapped is not None and best is not mine:
        advice.notes.append(a.swapped + f"; {label(best.settings)} was measured in the search's repeated runs and "
                            "the cache's passes, not in longer runs")
    elif best is not mine and longer is None and not a.changed_after:  # (a check's note says how it measured)
        advice.notes.append("not confirmed by longer runs: the budget was spent first (a larger budget_s "
                            "leaves room for them)")
    basis = longer[0] if longer is not None else mine  # the user's runs the whole run was predicted from
    speeds = user_speeds(merged(mine, [longer[0]]) if longer is not None else mine,
                         (longer[1] if longer is not None else best) if advice.change else None,
                         basis=basis, speedup=advice.mixed_speedup)
    if speeds is not None:
        advice.user_speeds = speeds
        advice.notes.append(speeds["sentence"])
    if a.count.unknown:
        advice.notes.append(UNKNOWN_COUNT)
    if (pinned := pinning.said(best, a.trials)) is not None:
        advice.notes.append(pinned)
    return advice


def extras(advice: LoaderAdvice, a: Advising, *, target: Any, precision: Any, state: Any) -> None:
    """The step's lower precisions (:mod:`placer.stream.precision_advice`, which plans ``target`` too), or the plan
    for ``target`` alone (:func:`with_target`)."""
    if precision:
        from placer.stream.precision_advice import advise_precision

        advise_precision(advice, a.loader, a.step, a.kept, precision, state, target, a.dev)
    elif target is not None:
        with_target(advice, a.loader, a.step, a.kept, target, a.dev)


def with_target(advice: LoaderAdvice, loader: Any, step: Any, kept: list, target: Any, dev: Device) -> None:
    """Plan the loader and step for ``target`` (:func:`placer.stream.target_loader.plan_loader_for_target`):
    ``advice.target`` holds the plan, its JSON and text say what the target would be bound by."""
    from placer.stream.target_loader import plan_loader_for_target

    advice.target = plan_loader_for_target(loader, step, kept, target, step_on_cpu=dev.kind == "cpu")


def _first_advice(mine: Trial, best: Trial, trials: list[Trial], step_rate: float, alone: Trial | None, dev: Device,
                  threads: dict | None, loader: Any, seconds: float, cores: int | None = None) -> LoaderAdvice:
    """The advice's measurements, recommendation and the notes its settings call for."""
    loader_rate = alone.samples_per_s if alone is not None else None
    bottleneck = "loader" if loader_rate is not None and loader_rate < step_rate else "step"
    notes = []
    if best.settings.worker_threads:
        pass  # a thread pool has no processes to keep
    elif best.settings.num_workers and not best.settings.persistent_workers:
        notes.append("for more than one epoch, persistent_workers=True keeps the worker processes between "
                     f"epochs (starting them took {best.first_batch_s:.2f} s before the first batch)")
    elif best.settings.num_workers and best is not mine:
        notes.append("persistent_workers=True keeps the worker processes between epochs (starting them took "
                     f"{best.first_batch_s:.2f} s before the first batch); written into your DataLoader it also "
                     "makes torch draw one random number fewer per epoch (the workers' seed), so a shuffled "
                     "order or your script's own random draws differ from epoch 2 on: advice.loader() draws it "
                     "and reads your batches")
    if best.settings.num_workers != mine.settings.num_workers and draws_unseeded(loader.dataset):
        notes.append("a dataset that draws random numbers in __getitem__ draws them in the workers, each seeded "
                     "from the loader's generator and its worker id: with other num_workers, other draws")
    if cores and best is not mine and not best.settings.worker_threads and best.settings.num_workers > cores:
        notes.append(f"num_workers={best.settings.num_workers} starts more worker processes than this machine's "
                     f"{cores} cores: torch warns about that when the loader starts; the runs above measured it "
                     "faster than fewer")
    if best.settings.pin_memory and not mine.settings.pin_memory:
        notes.append("pinned batches copy to the GPU faster, and without blocking with .to(device, non_blocking=True)")
    return LoaderAdvice(user=mine, recommended=best, trials=trials, bottleneck=bottleneck,
                        wait_fraction=max(0.0, 1 - mine.samples_per_s / step_rate), step_samples_per_s=step_rate,
                        loader_samples_per_s=loader_rate, step_device=dev.name, threads=threads, notes=notes,
                        seconds=seconds, source=loader)
