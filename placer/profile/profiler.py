"""The profiler: measured stage costs at several sizes, on every device.

May import: numpy, pydantic, placer.{pipeline,devices,timing,errors,loader,data,log,progress},
placer.costmodel.{counts,fit}, placer.profile.{cache,keys,memory,transfers},
placer.executor (to run stages and move data exactly as a run does).

:func:`profile` builds the pipeline at geometric sizes, runs it once on the CPU at
each size (so every stage gets real inputs of that size), then times every stage
on every device on those inputs with :func:`placer.timing.measure`: a cold first
call kept apart, warm-up, device synchronisation inside the timed region, repeats
until the lower quartile is stable (longer on a busy machine whose repeats stall).
It records peak host and device memory, the bytes of every output, the CPU time of
the timed calls and the load average, and (when no real GPU is profiled) counts
each stage's work for predicting absent devices.

Sizes grow geometrically up to the size predictions are wanted at, and stop when the
next one would not fit in the time budget: when a run at that size fits, it is
measured rather than extrapolated. Each stage's ``coverage`` says what was measured,
what was extrapolated and with what error. A built pipeline is profiled at its own
size (the size recorded is the size measured); a ``build(size)`` whose stages and
data do not change with ``size`` is profiled at one size, with a note.

Each timed call gets inputs as the stage found them in the run: a stage that changes
its input in place is given a fresh copy for every call, and one that consumes an
iterator or generator gets a new one (its producers called again), both outside the
timed region and with a warning naming the stage.

Inside a cached profile each stage's entry is keyed by its fingerprint
(:func:`placer.profile.keys.stage_fingerprint`: its code, the user code it calls,
the data it is given) at the profiled sizes and the sizes themselves; the file is
named after the pipeline's full path. A changed stage or helper re-measures that
stage only, and another machine never reads this one's numbers.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal


from placer.costmodel.counts import VERSION as COUNT_VERSION
from placer.costmodel.counts import count_work, tensor_bytes_work
from placer.costmodel.fit import fit_size_model
from placer.data.measures import Work
from placer.data.profile import SCHEMA, DeviceProfile, Point, Profile, StageProfile, WorkPoint  # noqa: F401
from placer.devices import SIM, Device, Inventory, discover
from placer.profile.cache import ProfileCache
from placer.profile.keys import data_signature, pipeline_fingerprint, source_id
from placer.profile.memory import PeakMemory
from placer.profile.transfers import measure_transfers
from placer.errors import PlacerError, StageFailedError
from placer.log import get_logger
from placer.pipeline import Pipeline, Stage, as_pipeline
from placer.timing import load_average, measure, torch_threads


class StageInputWarning(UserWarning):
    """A stage changes its input in place or consumes an iterator: each timed call gets fresh inputs."""

log = get_logger(__name__)

#: geometric step between profiled sizes, and how many sizes at most
GROWTH = 2
MAX_POINTS = 6
#: the first profiled size is at most the pipeline's default size (``build(None)``), or this
#: when it has none, so ``--size 1000000000000`` starts small and grows while budget and memory last
FIRST_SIZE_MAX = 10_000
#: a size whose measured memory, scaled from the size before, would exceed this share of the
#: host memory available is not profiled
MEMORY_SHARE = 0.5
#: timed work gathered per (stage, device, size) point before stopping (with at least
#: three repeats): enough for a stable lower quartile, small next to a full run
MIN_TIMED_S = 0.05


# -- sizes and keys --------------------------------------------------------------------------
def plan_sizes(max_size: int, *, points: int = MAX_POINTS, growth: float = GROWTH, min_size: int = 1) -> list[int]:
    """Geometric sizes ending at ``max_size``: ``max_size / growth**k``, ascending.

    >>> plan_sizes(2000)
    [62, 125, 250, 500, 1000, 2000]
    """
    if max_size < 1:
        raise ValueError(f"the largest profiled size must be at least 1, got {max_size}")
    out = sorted({max(min_size, int(max_size / growth**k)) for k in range(points)})
    return [s for s in out if s >= min_size]


def start_small(sizes: list[int], first_max: int, growth: float = GROWTH) -> list[int]:
    """``sizes`` with smaller sizes before them, so that the first is at most ``first_max``.

    >>> start_small([1000, 2000], 300)
    [250, 500, 1000, 2000]
    """
    out = sorted(sizes)
    while out and out[0] > max(first_max, 1):
        out.insert(0, max(1, int(out[0] / growth)))
    return out


def _default_size(build: Callable) -> int | None:
    """The pipeline's own size when built without one (its author's runnable default)."""
    try:
        size = build(None).size
    except Exception:  # noqa: BLE001 - a build that needs a size has no default
        return None
    return int(size) if isinstance(size, (int, float)) and size >= 1 else None


def available_memory() -> float | None:
    """Bytes of host memory available now (None when unknown)."""
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or unsupported here
        try:
            return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None


def memory_note(prof: Profile, last: int, nxt: int) -> str | None:
    """Why size ``nxt`` is not profiled, when the memory measured at ``last`` scaled up would not fit."""
    held = peak = 0.0
    for sp in prof.stages.values():
        pts = [pt for dp in sp.devices.values() for pt in dp.points if pt.size == last]
        if pts:
            held += max(pt.output_bytes for pt in pts)
            peak = max(peak, max(pt.peak_host_bytes for pt in pts))
    need = (held + peak) * nxt / max(last, 1)
    free = available_memory()
    if free is None or need <= MEMORY_SHARE * free:
        return None
    return (f"stopped before size {nxt}: it would need about {need / 1e9:.1f} GB of memory "
            f"(scaled from size {last}), more than {MEMORY_SHARE:.0%} of the {free / 1e9:.1f} GB available")


def stage_key(versions: Iterable[str], sizes: Iterable[int]) -> str:
    """A cache key from a stage's code hashes at the planned sizes and the sizes."""
    h = hashlib.sha256(COUNT_VERSION.encode())  # work counted by another counter is counted again
    for v in sorted(set(versions)):
        h.update(v.encode())
    h.update(repr(sorted(sizes)).encode())
    return h.hexdigest()[:16]


# -- the profiler ----------------------------------------------------------------------------
class _Budget:
    def __init__(self, seconds: float | None):
        self.t0 = time.perf_counter()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed


def _builder(pipeline: Any) -> tuple[Callable[[int | None], Pipeline], str, str, bool]:
    """``(build, name, source, fixed)``: ``fixed`` for a built pipeline (one size only)."""
    if isinstance(pipeline, str):
        from placer.loader import load_pipeline

        name = Path(pipeline).stem if pipeline.endswith(".py") else pipeline
        return (lambda n: load_pipeline(pipeline, n)), name, source_id(pipeline), False
    if callable(pipeline) and not isinstance(pipeline, Pipeline):
        probe = as_pipeline(pipeline(None))
        return (lambda n: as_pipeline(pipeline(n))), probe.name, source_id(pipeline), False
    p = as_pipeline(pipeline)
    return (lambda n: p), p.name, source_id(p, p.stages.values()), True


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _progress(show: Any, total: int):
    if hasattr(show, "add_task"):  # a live rich Progress (``placer advise``'s display): add the task to it
        return contextlib.nullcontext(show)
    if show is None:
        from placer.log import quiet

        show = sys.stderr.isatty() and not quiet()
    if not show:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from placer.progress import columns

    # percent done, time spent, and the time left (at the pace so far, within the budget)
    return Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), *columns(),
                    console=Console(stderr=True), transient=True)


def profile(
    pipeline: Any,
    *,
    size: int | None = None,
    max_size: int | None = None,
    sizes: list[int] | None = None,
    budget_s: float | None = 60.0,
    devices: list[str] | None = None,
    inventory: Inventory | None = None,
    cache: ProfileCache | None | Literal[False] = None,
    count_work_for_absent: bool | None = None,
    progress: Any = None,
    threads: int | None = None,
) -> Profile:
    """Measure every stage of ``pipeline`` on every device at several sizes.

    Parameters
    ----------
    pipeline : str, callable or Pipeline
        A pipeline file or ``module:function`` (see :mod:`placer.loader`), a
        ``build(size)`` function, or a built pipeline (profiled at its own size,
        ``pipeline.size``, and recorded at that size).
    size : int, optional
        The size predictions are wanted at. Profiling goes up to it when the budget
        allows (measured, not extrapolated).
    max_size : int, optional
        The largest size to profile (default ``size``, or the pipeline's own size
        when ``size`` is not given).
    sizes : list of int, optional
        Exact sizes to profile (overrides ``max_size``).
    budget_s : float or None
        Time budget for the whole profile; sizes stop growing once the next would
        not fit. None: no limit.
    devices : list of str, optional
        Devices to profile (default: every device of the inventory).
    inventory : Inventory, optional
        The devices there are (default: discovered on this machine).
    cache : ProfileCache, None or False
        Where cached entries are read and the result written (None: the default
        cache; False: no cache).
    count_work_for_absent : bool, optional
        Count FLOPs and bytes for absent-device predictions (default: when no real
        GPU is profiled).
    progress : bool or rich.progress.Progress, optional
        Show a progress bar with percent done and an ETA (default: when stderr is a
        terminal); a live ``Progress`` gets the profiling task added to it instead.
    threads : int, optional
        Intra-op threads for torch and numba while profiling (default: leave them as
        the executor finds them, so timings match a run in this process). The count
        used is recorded in ``machine["threads"]``.

    Returns
    -------
    Profile
    """
    with cpu_threads(threads) as used:
        prof = _profile(pipeline, size=size, max_size=max_size, sizes=sizes, budget_s=budget_s, devices=devices,
                        inventory=inventory, cache=cache, count_work_for_absent=count_work_for_absent,
                        progress=progress, threads=used)
    return prof


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Set torch's and numba's intra-op threads to ``n`` for the block; yield the count in use."""
    import torch  # noqa: F401 - loaded, so that the count in use is torch's

    with torch_threads(n, numba=True) as used:
        yield used


def _profile(pipeline, *, size, max_size, sizes, budget_s, devices, inventory, cache, count_work_for_absent,
             progress, threads) -> Profile:
    t_start = time.perf_counter()
    build, name, source, fixed = _builder(pipeline)
    inv = inventory or discover()
    devs = [inv.resolve(d) for d in devices] if devices else list(inv.devices)
    for d in devs:  # a device's one-off start is not spent from the budget
        d.driver.start(d)
    started_s = time.perf_counter() - t_start
    budget = _Budget(budget_s)
    load_start = load_average()
    fp = inv.fingerprint()
    if count_work_for_absent is None:
        count_work_for_absent = not any(d.is_gpu for d in devs)
    probe = build(size)
    unit = getattr(probe, "size_unit", None) or "rows"
    notes: list[str] = []
    if started_s >= 0.5:
        notes.append(f"starting {', '.join(d.name for d in devs if d.is_accelerator) or 'the devices'} took "
                     f"{started_s:.1f} s (a context, library handles), before the budget's clock started")
    if fixed:
        # a built pipeline runs at its own size whatever is asked: record that size
        own = probe.size or size or 1
        if sizes is not None and list(sizes) != [own]:
            notes.append(f"pipeline {name!r} is already built (size {own}): profiled at that size only")
        if size is not None and probe.size is not None and size != probe.size:
            notes.append(f"asked for size {size}, but the built pipeline has size {probe.size}: "
                         f"measured and recorded at {probe.size}; pass a build(size) function to profile other sizes")
        sizes = [own]
    elif sizes is None:
        top = max_size or size or probe.size or 1
        sizes = plan_sizes(top) if probe.size is not None or size is not None else [probe.size or 1]
        sizes = start_small(sizes, _default_size(build) or FIRST_SIZE_MAX)
    sizes = sorted(set(int(s) for s in sizes))
    store = None if cache is False else (cache or ProfileCache())
    cached = store.load(name, fp, source) if store else None
    builds: dict[int, Pipeline] = {}
    prints: dict[int, dict[str, str]] = {}
    for s in sizes:
        try:
            builds[s] = probe if fixed else build(s)
        except (ValueError, PlacerError) as exc:
            notes.append(f"size {s} skipped: build failed: {exc}")
            continue
        prints[s] = pipeline_fingerprint(builds[s].stages.values())
    if not builds and size and size not in sizes:
        # every smaller size failed to build: measure at the requested size itself
        try:
            builds[size] = build(size)
            prints[size] = pipeline_fingerprint(builds[size].stages.values())
            notes.append(f"no size below {size} could be built; profiled at {size} itself")
        except (ValueError, PlacerError) as exc:
            notes.append(f"size {size} skipped: build failed: {exc}")
    if not builds:
        raise PlacerError(
            f"pipeline {name!r}: no profiling size could be built ({'; '.join(notes)}); "
            "profile at a larger --size or let build() accept smaller sizes"
        )
    same_at = _size_independent(prints)
    if same_at:
        keep = max(builds)
        notes.append(f"build() gives the same stages and data at every size ({', '.join(map(str, same_at))}): "
                     f"profiled at size {keep} only, and its times stand for every size; make build() use "
                     "its size argument to profile how the stages scale")
        builds = {keep: builds[keep]}
    versions = {n: set() for n in probe.stages}
    for s in builds:
        for n, v in prints[s].items():
            versions.setdefault(n, set()).add(v)
    keys = {n: stage_key(v, [*builds, *same_at]) for n, v in versions.items()}
    prof = Profile(pipeline=name, fingerprint=fp, machine={**inv.host, "threads": threads},
                   sizes=sorted({*builds, *same_at}),
                   devices={d.name: d.model_dump(include={"kind", "label", "workers", "memory_bytes"}) for d in devs},
                   target_size=size if not fixed else probe.size or size, size_unit=unit, budget_s=budget_s,
                   created_at=_now(), notes=notes, source=source)
    notes = prof.notes  # pydantic copied the list
    reuse = {}
    for n, st in probe.stages.items():
        old = cached.stages.get(n) if cached else None
        same_threads = cached is not None and cached.machine.get("threads") == threads
        if (old is not None and same_threads and old.key == keys[n]
                and all(d.name in old.devices and (old.devices[d.name].points or old.devices[d.name].error)
                        for d in devs if _can_run(st, d))):
            reuse[n] = old
    todo = [n for n in probe.order() if n not in reuse]
    log.info("profiling %s at sizes %s on %s: %d stages to measure, %d from the cache", name, list(builds),
             ", ".join(d.name for d in devs), len(todo), len(reuse))
    for d in devs:
        if not d.is_accelerator:
            continue
        tm = store.load_transfer(d.name, fp) if store else None
        if tm is None:  # planning across devices needs a link model, so never skip it
            tm = measure_transfers(d, budget_s=min(10.0, max(1.0, 0.15 * budget.left)), fingerprint=fp)
            if store:
                store.save_transfer(tm)
        if tm is not None:
            prof.transfer[d.name] = tm
    for n in probe.order():
        st = probe.stages[n]
        prof.stages[n] = reuse.get(n) or StageProfile(
            name=n, kind=st.kind, inputs=list(dict.fromkeys(st.inputs.values())), key=keys[n], measured_at=_now())
        # declarations, not measurements: always taken from the pipeline as it is now
        prof.stages[n].kind = st.kind
        prof.stages[n].pin = st.pin
        prof.stages[n].device_classes = st.device_classes()
    measured: list[int] = []
    if todo:
        with _progress(progress, len(builds)) as bar:
            # work grows with size: weigh each stage's tick by its size, so the ETA holds across sizes
            deadline = time.monotonic() + budget.left if budget_s is not None else None
            task = (bar.add_task(f"profiling {name}", total=sum(builds) * len(todo), deadline=deadline)
                    if bar else None)
            last = None  # (size, seconds) of the previous size's pass
            order = list(builds)
            top = order[-1]
            skipped: list[int] = []
            for i, (s, p) in enumerate(builds.items()):
                growth = _stage_fits(prof, todo) if last is not None else None
                if last is not None and budget_s is not None:
                    guess, at_top = _guess(last, s, growth), _guess(last, top, growth)
                    if guess > budget.left:
                        notes.append(f"stopped before size {s}: it would take about {guess:.1f} s, "
                                     f"{max(budget.left, 0):.1f} s of the budget left")
                        if bar:
                            bar.update(task, total=next(t.completed for t in bar.tasks if t.id == task))  # done: the bar fills
                        break
                    if s != top and guess + at_top > budget.left and at_top <= budget.left:
                        skipped.append(s)  # keep the budget for the size predictions are wanted at
                        continue
                if last is not None:
                    too_big = memory_note(prof, last[0], s)
                    if too_big:
                        notes.append(too_big)
                        break
                # later sizes cost more: give this one its share in proportion to its size
                rest = [x for x in order[i:] if x == s or x == top or last is None
                        or _guess(last, x, growth) + _guess(last, top, growth) <= budget.left]
                size_budget = budget.left * s / sum(rest) if budget_s is not None else None
                t0 = time.perf_counter()
                try:
                    cold = _profile_size(p, s, todo, devs, prof, size_budget, count_work_for_absent, notes,
                                         lambda s=s: bar.advance(task, s) if bar else None,
                                         bound=profiling_bound(budget_s))
                except StageFailedError as exc:
                    if not measured:
                        raise
                    # keep what smaller sizes measured; the run at full size will say the same
                    notes.append(f"stopped at size {s}: {str(exc).splitlines()[0]}")
                    break
                measured.append(s)
                # one-time costs (compilation, first imports) will not recur at the next size
                last = (s, max(time.perf_counter() - t0 - cold, 1e-3))
            if skipped:
                notes.append(f"sizes {', '.join(map(str, skipped))} skipped to keep the budget for size {top}")
        if same_at and measured:
            _copy_points(prof, todo, measured[0], same_at)
    prof.measured_sizes = measured or sorted({pt.size for sp in reuse.values()
                                              for dp in sp.devices.values() for pt in dp.points
                                              if pt.copied_from is None})
    for sp in prof.stages.values():
        sp.coverage = coverage(sp, prof.target_size)
    _flag_extrapolation(prof, notes)
    prof.elapsed_s = budget.elapsed
    prof.machine_load = _load_seen(prof, load_start)
    if store:
        store.save(prof)
    return prof


def _guess(last: tuple[int, float], size: int, stage_fits: Callable[[float], float] | None = None) -> float:
    """Seconds a pass at ``size`` should take, from the last pass ``(size, seconds)``, with a margin.

    ``stage_fits(n)`` (the stages' fitted times summed, once two sizes are measured) scales
    the last pass by how the stages themselves grow, fixed costs included; without it the
    pass is taken to grow a little faster than the size."""
    if stage_fits is not None:
        at_last = stage_fits(last[0])
        if at_last > 0:
            return last[1] * max(stage_fits(size) / at_last, 1.0) * 1.25
    return last[1] * (size / last[0]) ** 1.1 * 1.2


def _stage_fits(prof: Profile, todo: list[str]) -> Callable[[float], float] | None:
    """The sum of the stages' fitted times, as a function of size (None before two sizes are measured)."""
    fits = []
    for n in todo:
        for dp in prof.stages[n].devices.values():
            own = [p for p in dp.points if p.copied_from is None and p.median_s > 0]
            if len({p.size for p in own}) >= 2:
                fits.append(fit_size_model([p.size for p in own], [p.median_s for p in own]))
    if not fits:
        return None
    return lambda n: float(sum(max(f(n), 0.0) for f in fits))


def _size_independent(prints: dict[int, dict[str, str]]) -> list[int]:
    """The sizes, when every size built the very same stages and data (else [])."""
    if len(prints) < 2:
        return []
    first = next(iter(prints.values()))
    return sorted(prints) if all(v == first for v in prints.values()) else []


def _copy_points(prof: Profile, todo: list[str], at: int, sizes: list[int]) -> None:
    """A size-independent pipeline: the measurement at ``at`` stands for each of ``sizes``."""
    for n in todo:
        sp = prof.stages[n]
        for dp in sp.devices.values():
            base = [p for p in dp.points if p.size == at]
            for s in sizes:
                if s != at:
                    dp.points += [p.model_copy(update={"size": s, "copied_from": at}) for p in base]
        if at in sp.reference_s:
            for s in sizes:
                sp.reference_s.setdefault(s, sp.reference_s[at])
        sp.work += [w.model_copy(update={"size": s}) for w in sp.work if w.size == at for s in sizes if s != at]


def coverage(sp: StageProfile, target: int | None) -> dict[str, Any]:
    """Per device: the sizes measured, whether ``target`` was measured or is extrapolated, and
    the error estimate (the spread at the target when measured there, else leave-one-out).

    >>> from placer.data.profile import DeviceProfile, Point
    >>> pts = [Point(size=n, median_s=1e-3 * n, iqr_s=0.0, reps=3, raw_times=[1e-3 * n] * 3) for n in (1, 2, 4, 8)]
    >>> sp = StageProfile(name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)})
    >>> c = coverage(sp, 16)["cpu"]
    >>> c["extrapolated"], c["error_from"], c["measured"]
    (True, 'leave-one-out', [1, 2, 4, 8])
    """
    out: dict[str, Any] = {}
    for dev, dp in sp.devices.items():
        own = [p for p in dp.points if p.copied_from is None and p.median_s > 0]
        sizes = sorted({p.size for p in own})
        entry: dict[str, Any] = {"measured": sizes, "target_size": target,
                                 "single_repeat": sorted({p.size for p in own if p.reps == 1}),
                                 "stalled": sorted({p.size for p in own if p.stalled})}
        if not own:
            entry.update(extrapolated=None, rel_error=None, error_from="none")
            out[dev] = entry
            continue
        at = [p for p in dp.points if target is not None and p.size == target]
        if target is None or at:
            p = at[0] if at else max(own, key=lambda q: q.size)
            spread = p.iqr_s / p.median_s if p.reps > 1 and p.median_s > 0 else None
            entry.update(extrapolated=False, rel_error=spread, error_from="spread" if spread is not None else "none")
        else:
            fit = fit_size_model([p.size for p in own], [_low(p) for p in own])
            x = fit.extrapolation(target)
            pred = fit.predict(target)
            entry.update(extrapolated=True, rel_error=pred.rel_error,
                         error_from=("fit forms disagree" if pred.fit_spread > 0 else "leave-one-out") if fit.valid
                         else "none (too few sizes)",
                         extrapolation=x, form=fit.form)
        out[dev] = entry
    return out


def _low(p: Point) -> float:
    raw = [t for t in p.raw_times if t > 0]
    if len(raw) >= 3:
        import numpy as np

        return float(min(np.percentile(raw, 25), p.median_s))
    return p.median_s


def _flag_extrapolation(prof: Profile, notes: list[str]) -> None:
    """One note for the stages whose target size was extrapolated, and for single repeats."""
    ext = sorted({n for n, sp in prof.stages.items() for c in sp.coverage.values() if c.get("extrapolated")})
    if ext and prof.target_size:
        top = max(prof.measured_sizes or [0])
        notes.append(f"size {prof.target_size} was not measured (largest measured: {top}): "
                     f"{', '.join(ext)} extrapolated; a larger --budget-s measures it")
    single = sorted({f"{n} on {d} at {s}" for n, sp in prof.stages.items() for d, c in sp.coverage.items()
                     for s in c.get("single_repeat", [])})
    if single:
        notes.append(f"timed once, spread unknown (not to be trusted alone): {'; '.join(single[:6])}"
                     + (f" and {len(single) - 6} more" if len(single) > 6 else ""))


def _load_seen(prof: Profile, load_start: float | None) -> dict[str, float | None]:
    """The load average before and after, and the timed calls' CPU seconds per wall second."""
    cpu = wall = 0.0
    for sp in prof.stages.values():
        for dp in sp.devices.values():
            for p in dp.points:
                if p.cpu_s is not None and p.copied_from is None:
                    calls = p.reps * p.number_per_run
                    cpu += p.cpu_s * calls
                    wall += sum(p.raw_times) * p.number_per_run
    return {"load_start": load_start, "load_end": load_average(),
            "cpu_per_wall": cpu / wall if wall > 0 else None, "cores": prof.machine.get("cores")}


def profiling_bound(budget_s: float | None) -> float | None:
    """The longest one stage call may take while profiling: the stage timeout when one is set,
    else twice the budget, and at least :data:`MIN_BOUND_S`.

    So a stage that hangs ends the profile with an error naming it soon after the
    budget runs out, never many budgets later, while a slow first call (imports,
    compilation) on a small budget still gets its time. Each call runs in a helper
    thread (:func:`~placer.executor.stagecall.call_with_limit`), so even a stage stuck
    in a call Python cannot interrupt ends the profile at the bound plus
    :data:`~placer.executor.stagecall.STOP_WAIT_S` (``docs/timeouts.md``).
    """
    from placer.executor.stagecall import default_stage_timeout

    given = default_stage_timeout()
    if given is not None:
        return given
    return None if budget_s is None else max(2.0 * float(budget_s), MIN_BOUND_S)


#: the shortest bound on one stage call while profiling (see :func:`profiling_bound`)
MIN_BOUND_S = 30.0
#: why a stage call is bounded while profiling (in the timeout's message)
WHY = "profiling bounds each stage by the budget"


def _can_run(stage: Stage, device: Device) -> bool:
    return stage.impl_for(device.driver.implementation) is not None


def _ancestors(p: Pipeline, name: str) -> list[str]:
    """Stages ``name`` depends on, in run order."""
    need, todo = set(), [name]
    while todo:
        for src in p.stages[todo.pop()].inputs.values():
            if src not in need:
                need.add(src)
                todo.append(src)
    return [n for n in p.order() if n in need]


def _recompute(p: Pipeline, name: str, cpu: Device) -> dict[str, Any]:
    """Fresh host inputs of ``name``: its producers run again from the sources, on the CPU."""
    from placer.executor import call_stage

    out: dict[str, Any] = {}
    for n in _ancestors(p, name):
        st = p.stages[n]
        out[n] = call_stage(st, cpu, {a: out[src] for a, src in st.inputs.items()}, workers=cpu.workers)
    return {a: out[src] for a, src in p.stages[name].inputs.items()}


def _reference_run(p: Pipeline, cpu: Device, bound: float | None = None
                   ) -> tuple[dict[str, Any], dict[str, float], dict[str, list[str]]]:
    """Run ``p`` once on the CPU, stage by stage as the inline executor does: the outputs, each
    stage's seconds (its first call at this size) and, per stage, the inputs it changed in place.
    A stage call longer than ``bound`` seconds is stopped (:class:`StageTimeoutError`).

    A failing stage is run again through :func:`placer.executor.execute`, whose error names it."""
    from placer.executor import call_stage, execute
    from placer.executor.stagecall import StageTimeoutError, call_with_limit

    outputs: dict[str, Any] = {}
    first: dict[str, float] = {}
    changed: dict[str, list[str]] = {}
    for n in p.order():
        st = p.stages[n]
        ins = {a: outputs[src] for a, src in st.inputs.items()}
        before = {a: data_signature(v) for a, v in ins.items() if not isinstance(v, Iterator)}
        t0 = time.perf_counter()
        try:
            outputs[n] = call_with_limit(lambda: call_stage(st, cpu, ins, workers=cpu.workers), bound, n, why=WHY)
        except StageTimeoutError as exc:
            raise StageFailedError(str(exc), stage=n, outputs=dict(outputs)) from exc
        except Exception:  # noqa: BLE001 - the executor reports it, naming the stage
            execute(p, "all=cpu", executor="inline", stage_timeout=bound)
            raise
        first[n] = time.perf_counter() - t0
        moved = [a for a, sig in before.items() if data_signature(ins[a]) != sig]
        if moved:
            changed[n] = moved
    return outputs, first, changed


def _fresh_inputs(p: Pipeline, n: str, outputs: dict[str, Any], changed: dict[str, list[str]], cpu: Device,
                  notes: list[str], sp: StageProfile) -> tuple[dict[str, Any], Callable[[], dict[str, Any]] | None]:
    """Inputs for timing ``n`` as the run gave them and, when each call needs its own, a maker of fresh ones.

    An iterator input (a generator) was consumed by the run: each call gets a new one from
    the producers. A stage that changed its input in place gets a deep copy of fresh
    inputs for every call; a stage reading data a later stage changed gets fresh inputs once."""
    st = p.stages[n]
    host_inputs = {a: outputs[src] for a, src in st.inputs.items()}
    its = [a for a, v in host_inputs.items() if isinstance(v, Iterator)]
    if its:
        _warn_stage(sp, notes, f"stage {n!r} consumes an iterator ({', '.join(its)} from "
                    f"{', '.join(st.inputs[a] for a in its)}): each timed call gets a new one (its producers "
                    "run again outside the timed region); in a run it gets one pass only")
        return _recompute(p, n, cpu), (lambda: _recompute(p, n, cpu))
    own = changed.get(n, [])
    if own:
        _warn_stage(sp, notes, f"stage {n!r} changes its input {', '.join(own)} (from "
                    f"{', '.join(st.inputs[a] for a in own)}) in place: each timed call gets a fresh copy "
                    "(made outside the timed region); in a run, a later stage reading it sees the changed data")
    dirty = {p.stages[m].inputs[a] for m, args in changed.items() for a in args}
    if not own and not dirty & set(st.inputs.values()):
        return host_inputs, None
    pristine = _recompute(p, n, cpu)
    if not own:
        return pristine, None
    return copy.deepcopy(pristine), (lambda: copy.deepcopy(pristine))


def _warn_stage(sp: StageProfile, notes: list[str], msg: str) -> None:
    if msg not in sp.warnings:
        sp.warnings.append(msg)
    if msg not in notes:
        notes.append(msg)
        warnings.warn(msg, StageInputWarning, stacklevel=4)


def _profile_size(p: Pipeline, size: int, todo: list[str], devs: list[Device], prof: Profile,
                  size_budget: float | None, count: bool, notes: list[str], tick: Callable[[], Any],
                  bound: float | None = None) -> float:
    """Run ``p`` once on the CPU, then measure each stage in ``todo`` on each device,
    sharing ``size_budget`` seconds (None: no limit) between them. A stage call that
    runs longer than ``bound`` seconds is stopped (see :func:`profiling_bound`).

    Returns the seconds spent on one-time costs (first calls beyond steady state)."""
    from placer.executor import call_stage
    from placer.executor.stagecall import call_with_limit
    from placer.executor.transfer import nbytes, to_location

    cpu_dev = next((d for d in devs if not d.is_accelerator), None) or discover().get("cpu")
    budget = _Budget(size_budget)
    outputs, first, changed = _reference_run(p, cpu_dev, bound)
    stages_left = len(todo) * max(1, len(devs))
    cold_extra = 0.0
    for n in todo:
        st = p.stages[n]
        sp = prof.stages[n]
        host_inputs = {a: outputs[src] for a, src in st.inputs.items()}
        in_bytes = float(sum(nbytes(v) for v in host_inputs.values()))
        out_bytes = float(nbytes(outputs[n]))
        sp.reference_s[size] = first[n]
        host_inputs, fresh = _fresh_inputs(p, n, outputs, changed, cpu_dev, notes, sp)
        for d in devs:
            if not _can_run(st, d):
                continue
            dp = sp.devices.setdefault(d.name, DeviceProfile(device=d.name, kind=d.kind))
            share = max(0.0, budget.left) / max(stages_left, 1) if budget.seconds is not None else 2.0
            stages_left -= 1
            try:
                on_host = not d.is_accelerator
                place = (lambda ins: ins) if on_host else (
                    lambda ins, d=d: {a: to_location(v, d)[0] for a, v in ins.items()})
                inputs = place(host_inputs)
                setup = None if fresh is None else (lambda place=place: place(fresh()))
                workers = cpu_dev.workers if on_host else 1
                call = lambda ins, d=d, workers=workers: call_stage(st, d, ins, workers=workers)  # noqa: E731
                # the calls below: a cold one, a warm-up and at least three timed repeats
                limit = None if bound is None else bound + 5 * first[n] + 2.0

                def timed(d=d, on_host=on_host, inputs=inputs, setup=setup, call=call, share=share):
                    if on_host:
                        cold = first[n]  # the reference run was this size's first call
                    else:
                        t0 = time.perf_counter()
                        call(inputs)
                        cold = time.perf_counter() - t0
                    with PeakMemory(d) as mem:
                        call(inputs if setup is None else setup())  # warm-up, instrumented for memory
                    m = measure(call if setup is not None else (lambda: call(inputs)), setup=setup,
                                cold=False, warmup=0, min_reps=3, max_reps=30,
                                min_time_s=min(MIN_TIMED_S, share / 3), max_time_s=max(min(1.0, share * 0.6), 1e-3),
                                label=f"stage {n!r} on {d.name} at size {size}", warn=False)
                    one = None
                    if on_host and int(prof.machine.get("threads") or 1) > 1:
                        one = one_core_seconds(call if setup is not None else (lambda: call(inputs)), setup=setup,
                                               max_time_s=max(min(0.5, share * 0.2), 1e-3),
                                               cores=int(prof.machine.get("cores") or 1),
                                               label=f"stage {n!r} on {d.name} at size {size}, one thread")
                    return cold, mem, m, one

                cold, mem, m, one_core = call_with_limit(timed, limit, n, why=WHY)
            except Exception as exc:  # noqa: BLE001 - recorded; other stages still profiled
                dp.error = f"{type(exc).__name__}: {exc}"
                notes.append(f"stage {n!r} on {d.name} at size {size} failed: {dp.error}")
                continue
            cold_extra += max((cold or 0.0) - m.median_s, 0.0)
            log.debug("stage %r on %s at size %s: median %.4g s, IQR %.2g s over %d repeats",
                      n, d.name, size, m.median_s, m.iqr_s, m.reps)
            stalled = m.stalled
            if m.noisy or stalled:
                what = "stalled repeats (a slower cluster: the machine was busy)" if stalled else "noisy"
                notes.append(f"stage {n!r} on {d.name} at size {size}: {what}, IQR/median "
                             f"{m.iqr_s / m.median_s:.0%} over {m.reps} repeats"
                             + (f", load average {m.load:.1f}" if m.load is not None else "")
                             + "; fitted to the lower quartile")
            dp.points.append(Point(size=size, median_s=m.median_s, iqr_s=m.iqr_s, reps=m.reps,
                                   number_per_run=m.number_per_run, raw_times=m.raw_times,
                                   first_call_s=cold, noisy=m.noisy, stalled=stalled,
                                   single_repeat=m.single_repeat, cpu_s=m.cpu_s, load=m.load,
                                   one_core_s=one_core, peak_host_bytes=mem.host, peak_device_bytes=mem.dev,
                                   input_bytes=in_bytes, output_bytes=out_bytes))
        if count:
            work = _count(st, host_inputs if fresh is None else fresh(), in_bytes, out_bytes)
            if work is not None:
                sp.work.append(WorkPoint(size=size, work=work))
            else:
                msg = (f"stage {n!r}: its GPU implementation is {st.impl_for('gpu').api} code, whose work "
                       "cannot be counted without a GPU, so an absent GPU gets no prediction for it; "
                       "declare flops= and bytes_moved= on the stage, or profile on a GPU")
                if msg not in notes:
                    notes.append(msg)
        tick()
    return cold_extra


def one_core_seconds(fn: Callable[..., Any], *, setup: Callable[[], Any] | None = None, max_time_s: float = 0.5,
                     cores: int = 1, label: str = "") -> float | None:
    """Seconds per call of ``fn`` at one intra-op thread (torch's and numba's): one core's work,
    whatever the profile's thread count.

    At several threads a pool thread waiting for a core that other work holds leaves the
    others spinning at the pool's barrier: that CPU time is no work, and the wall time is
    mostly waiting (a stage of many small ops ran 40x its one-thread time at two threads
    here), so neither tells one core's work. At one thread there is no barrier: the lower
    quartile of the wall times, or the CPU time per call where it is less and the machine
    had no idle core (load average at least ``cores`` less a half: the thread waited for
    one). A wait on anything else (a file, a socket) stays in. A target's CPU time is
    scaled from it (:meth:`placer.costmodel.model.CostModel.scale_inputs`). A few calls (one
    to size the blocks, two timed at least).
    """
    with torch_threads(1, numba=True):
        m = measure(fn, setup=setup, cold=False, warmup=0, min_reps=2, max_reps=5, min_time_s=0.0,
                    max_time_s=max_time_s, label=label, warn=False)
    return one_core_of(m.lower_quartile_s, m.cpu_s, m.load, cores)


def one_core_of(wall_s: float, cpu_s: float | None, load: float | None, cores: int) -> float:
    """One core's work of a one-thread measurement (see :func:`one_core_seconds`)."""
    waited = load is not None and load >= cores - 0.5
    return float(cpu_s) if waited and cpu_s and cpu_s < wall_s else float(wall_s)


_SIM = Device(name=SIM, kind="sim", label="work counter (runs the GPU implementation on the CPU)")


def _count(st: Stage, inputs: dict[str, Any], in_bytes: float, out_bytes: float) -> Work | None:
    """The stage's work: declared counts, else torch's counters on its GPU implementation
    (None for GPU code that cannot be counted: numba.cuda kernels)."""
    if st.flops is not None or st.bytes_moved is not None:
        return Work(flops=float(st.flops or 0.0), bytes=float(st.bytes_moved or in_bytes + out_bytes),
                    ops=1, source="declared")
    impl = st.impl_for("gpu")
    if impl is None:
        return tensor_bytes_work(in_bytes, out_bytes)
    if impl.api != "torch":
        # numba.cuda code: its work (and whether it is parallel at all) cannot be
        # counted without a GPU, so no roofline prediction is made for it
        return None
    from placer.executor import call_stage
    from placer.executor.transfer import to_location

    try:
        moved = {a: to_location(v, _SIM)[0] for a, v in inputs.items()}
        return count_work(lambda: call_stage(st, _SIM, moved))[1]
    except Exception:  # noqa: BLE001 - counting is best effort; sizes still known
        return tensor_bytes_work(in_bytes, out_bytes)
