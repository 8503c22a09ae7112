"""Measuring one run of a loader with the step: batches fetched and stepped on, the rate after the warm-up.

May import: placer.data.stream, placer.devices, placer.executor.stream.{nodes,source}, placer.timing,
placer.stream.dropin.{memory,trial}; torch inside functions.

A loader run with other settings is the user's loader rebuilt
(:func:`~placer.executor.stream.source.rebuild_loader`): the same dataset, sampler and generator,
so the same batches in the same order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from placer.data.stream import LoaderSettings
from placer.devices import Device, canonical_name, discover, torch_device_name
from placer.executor.stream.nodes import leading_len
from placer.executor.stream.source import rebuild_loader
from placer.stream.dropin.memory import Watch
from placer.stream.dropin.trial import Trial
from placer.timing import Clock, Deadline, Measurement, Timings

log = logging.getLogger(__name__)


#: what an exhausted iterator gives ``next``
_END = object()


def settings_of(loader: Any) -> LoaderSettings:
    """The settings a DataLoader was built with (and torch's current intra-op threads)."""
    import torch

    return LoaderSettings.of(loader).model_copy(update={"torch_threads": torch.get_num_threads()})


def rebuild(loader: Any, settings: LoaderSettings, dataset: Any = None) -> Any:
    """A DataLoader with ``settings`` that reads what ``loader`` reads, in the same order
    (:func:`~placer.executor.stream.source.rebuild_loader`: every other argument kept; ``dataset``, the same
    with a cache); a thread-pool loader for thread workers, one that draws as without persistent workers; the
    threads each worker process computes with set where ``settings`` say (``threads_per_worker``)."""
    workers = bool(settings.num_workers)
    return rebuild_loader(loader, settings.kwargs(), threads=settings.worker_threads and workers, dataset=dataset,
                          same_draws=settings.persistent_workers and workers,
                          threads_per_worker=settings.threads_per_worker)


class SampleCount:
    """Samples in a batch: its first array's leading dimension, else the loader's batch size.

    When neither is known a batch counts as one sample and :attr:`unknown` is set.
    """

    def __init__(self, batch_size: int | None = None):
        self.batch_size = batch_size
        self.unknown = False

    def __call__(self, batch: Any) -> int:
        n = leading_len(batch)
        if n is not None:
            return n
        if self.batch_size:
            return int(self.batch_size)
        if not self.unknown:
            log.warning("a batch has no array and the loader no batch size: each batch counts as one sample")
        self.unknown = True
        return 1


def counter_of(loader: Any) -> SampleCount:
    return SampleCount(getattr(loader, "batch_size", None))


def run_loader(loader: Any, step: Callable[[Any], Any] | None, *, batches: int, warmup: int,
               device: Device, deadline: Deadline, keep: list | None = None,
               count: SampleCount | None = None, drain: int = 0, give_up_s: float | None = None) -> Trial | None:
    """Fetch up to ``batches`` batches (and step on each); the rate counts batches after ``warmup``.

    Stops early at ``deadline`` (after at least one counted batch). ``keep`` collects
    the first batches for the step-alone run. None when the loader runs out during the warm-up.
    ``drain``: the batches the loader's queue holds (workers x prefetch). The workers fill
    it while the first batches are taken, so the first ``drain`` counted batches may come
    from a full queue; the rate leaves them out (up to half of the counted batches), or
    a short run with many workers would measure the queue, not the workers.
    ``give_up_s``: a run still in its warm-up this long after ``iter(loader)`` stops there (``cut``; its
    rate the batches read over the time taken): a setting whose first batches come after the user's
    whole run would have ended cannot make it faster, and runs of settings slow to start would spend the
    budget the user's settings need for their repeats.
    Memory is read after the warm-up, half-way (out of the timed window) and at the end (:class:`Watch`).
    """
    count = count or counter_of(loader)
    waits = Timings()
    first = end = None
    samples = counted = read = early = 0
    cut = False
    close_s = 0.0
    starts: list[float] = []  # when each counted batch was asked for
    sizes: list[int] = []
    fetches: list[Clock] = []
    with Clock() as run:
        it = iter(loader)
        mem = Watch(it, batches - warmup)
        try:
            for i in range(batches):
                if i == warmup:
                    device.synchronize()
                    mem.start()
                with Clock() as fetch:
                    batch = next(it, _END)
                if batch is _END:
                    break
                first = run.elapsed() if first is None else first
                read += 1
                if i >= warmup:
                    starts.append(run.elapsed() - fetch.wall)
                    fetches.append(fetch)
                    sizes.append(count(batch))
                    counted += 1
                    mem.counted(counted)
                else:
                    early += count(batch)
                if keep is not None and len(keep) < 4:
                    keep.append(batch)
                if step is not None:
                    step(batch)
                if counted and deadline.passed():
                    break
                if not counted and give_up_s is not None and run.elapsed() > give_up_s:
                    cut = True
                    break
            device.synchronize()
            end = run.elapsed() - mem.paused_s
            mem.end(counted)
        finally:
            with Clock() as closing:
                close_iterator(it)
            close_s = closing.wall
    if cut:
        return Trial(settings=settings_of(loader), samples_per_s=early / max(end, 1e-12), first_batch_s=first,
                     fetch_fraction=1.0, batches=read, samples=early, seconds=end, close_s=close_s, read=read,
                     read_s=end, cut=True)
    if not counted:  # the loader ran out during the warm-up
        return None
    skip = min(max(drain, 0), (counted - 1) // 2)
    for f in fetches[skip:]:
        waits.add("fetch", f)
    counted, samples = counted - skip, sum(sizes[skip:])
    seconds = end - starts[skip]
    fetch_s = waits.wall_s["fetch"]
    return Trial(settings=settings_of(loader), samples_per_s=samples / seconds, first_batch_s=first,
                 fetch_fraction=sum(fetch_s) / seconds, batches=counted, samples=samples, seconds=seconds,
                 fetch=Measurement(raw_times=fetch_s, label="next(loader)"), close_s=close_s,
                 read=read, read_s=end, memory=mem.result())


def step_alone(step: Callable[[Any], Any], kept: list, *, batches: int, device: Device, deadline: Deadline,
               count: SampleCount | None = None) -> float:
    """Samples/s of the step on batches fetched once (no loader in the way)."""
    count = count or SampleCount()
    device.synchronize()
    samples = 0
    with Clock() as run:
        for i in range(batches):
            batch = kept[i % len(kept)]
            step(batch)
            samples += count(batch)
            if deadline.passed():
                break
        device.synchronize()
    return samples / run.wall


def step_device(device: Any) -> Device:
    """The device the step runs on: ``cpu`` by default; placer's names or torch's (``cuda:1``, a ``torch.device``),
    read by the device registry."""
    if device is None:
        return discover().resolve("cpu")
    return discover().resolve(torch_device_name(device) or canonical_name(str(device).strip().lower()))


def close_iterator(it: Any) -> None:
    """Stop a DataLoader iterator's worker processes now (not when it is collected)."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
