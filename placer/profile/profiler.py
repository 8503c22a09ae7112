"""The profiler: measured stage costs at several sizes, on every device.

May import: numpy, pydantic, placer.{pipeline,devices,timing,errors,loader,data},
placer.costmodel.counts, placer.profile.{cache,memory,transfers}, placer.executor (to
run stages and move data exactly as a run does).

:func:`profile` builds the pipeline at geometric sizes, runs it once on the CPU at
each size (so every stage gets real inputs of that size), then times every stage
on every device on those inputs with :func:`placer.timing.measure`: a cold first
call kept apart, warm-up, device synchronisation inside the timed region, repeats
until the median is stable. It records peak host and device memory and the bytes
of every output, and (when no real GPU is profiled) counts each stage's work for
predicting absent devices. Sizes grow until the next one would not fit in the time
budget. The result is a :class:`~placer.data.profile.Profile`.

Inside a cached profile each stage's entry is keyed by its code hash at the profiled
sizes and the sizes themselves, so a changed stage re-measures that stage only and
another machine never reads this one's numbers.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal


from placer.costmodel.counts import count_work, tensor_bytes_work
from placer.data.measures import Work
from placer.data.profile import SCHEMA, DeviceProfile, Point, Profile, StageProfile, WorkPoint  # noqa: F401
from placer.devices import SIM, Device, Inventory, discover
from placer.profile.cache import ProfileCache
from placer.profile.memory import PeakMemory
from placer.profile.transfers import measure_transfers
from placer.errors import PlacerError
from placer.pipeline import Pipeline, Stage, as_pipeline
from placer.timing import measure

#: geometric step between profiled sizes, and how many sizes at most
GROWTH = 2
MAX_POINTS = 6
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


def stage_key(versions: Iterable[str], sizes: Iterable[int]) -> str:
    """A cache key from a stage's code hashes at the planned sizes and the sizes."""
    h = hashlib.sha256()
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


def _builder(pipeline: Any) -> tuple[Callable[[int], Pipeline], str]:
    if isinstance(pipeline, str):
        from placer.loader import load_pipeline

        name = Path(pipeline).stem if pipeline.endswith(".py") else pipeline
        return (lambda n: load_pipeline(pipeline, n)), name
    if callable(pipeline) and not isinstance(pipeline, Pipeline):
        probe = as_pipeline(pipeline(None))
        return (lambda n: as_pipeline(pipeline(n))), probe.name
    p = as_pipeline(pipeline)
    return (lambda n: p), p.name


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _progress(show: bool | None, total: int):
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
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
    progress: bool | None = None,
    threads: int | None = None,
) -> Profile:
    """Measure every stage of ``pipeline`` on every device at several sizes.

    Parameters
    ----------
    pipeline : str, callable or Pipeline
        A pipeline file or ``module:function`` (see :mod:`placer.loader`), a
        ``build(size)`` function, or a built pipeline (profiled at its one size).
    size : int, optional
        The size predictions are wanted at. By default profiling goes up to a
        tenth of it.
    max_size : int, optional
        The largest size to profile (default ``size // 10``, or the pipeline's
        own size when ``size`` is not given).
    sizes : list of int, optional
        Exact sizes to profile (overrides ``max_size``).
    budget_s : float or None
        Time budget for the whole profile; sizes stop growing once the next would
        not fit. None: no limit.
    devices : list of str, optional
        Devices to profile (default: every device of the inventory).
    cache : ProfileCache, None or False
        Where cached entries are read and the result written (None: the default
        cache; False: no cache).
    count_work_for_absent : bool, optional
        Count FLOPs and bytes for absent-device predictions (default: when no real
        GPU is profiled).
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
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
    import torch

    old = torch.get_num_threads()
    if n is None:
        yield old
        return
    if n < 1:
        raise ValueError(f"threads must be at least 1, got {n}")
    nb_old = None
    try:
        import numba

        nb_old = numba.get_num_threads()
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except Exception:  # noqa: BLE001 - numba is optional for profiling
        nb_old = None
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(old)
        if nb_old is not None:
            import numba

            numba.set_num_threads(nb_old)


def _profile(pipeline, *, size, max_size, sizes, budget_s, devices, inventory, cache, count_work_for_absent,
             progress, threads) -> Profile:
    budget = _Budget(budget_s)
    build, name = _builder(pipeline)
    inv = inventory or discover()
    fp = inv.fingerprint()
    devs = [inv.resolve(d) for d in devices] if devices else list(inv.devices)
    if count_work_for_absent is None:
        count_work_for_absent = not any(d.is_gpu for d in devs)
    probe = build(size)
    unit = getattr(probe, "size_unit", None) or "rows"
    if sizes is None:
        top = max_size or (max(1, size // 10) if size else (probe.size or 1))
        sizes = plan_sizes(top) if probe.size is not None or size is not None else [probe.size or 1]
    sizes = sorted(set(int(s) for s in sizes))
    store = None if cache is False else (cache or ProfileCache())
    cached = store.load(name, fp) if store else None
    versions = {n: set() for n in probe.stages}
    builds: dict[int, Pipeline] = {}
    notes: list[str] = []
    for s in sizes:
        try:
            builds[s] = build(s)
        except (ValueError, PlacerError) as exc:
            notes.append(f"size {s} skipped: build failed: {exc}")
            continue
        for n, st in builds[s].stages.items():
            versions.setdefault(n, set()).add(st.code_hash())
    if not builds and size and size not in sizes:
        # every smaller size failed to build: measure at the requested size itself
        try:
            builds[size] = build(size)
            for n, st in builds[size].stages.items():
                versions.setdefault(n, set()).add(st.code_hash())
            notes.append(f"no size below {size} could be built; profiled at {size} itself")
        except (ValueError, PlacerError) as exc:
            notes.append(f"size {size} skipped: build failed: {exc}")
    if not builds:
        raise PlacerError(
            f"pipeline {name!r}: no profiling size could be built ({'; '.join(notes)}); "
            "profile at a larger --size or let build() accept smaller sizes"
        )
    keys = {n: stage_key(v, builds) for n, v in versions.items()}
    prof = Profile(pipeline=name, fingerprint=fp, machine={**inv.host, "threads": threads}, sizes=list(builds),
                   devices={d.name: d.model_dump(include={"kind", "label", "workers", "memory_bytes"}) for d in devs},
                   target_size=size, size_unit=unit, budget_s=budget_s, created_at=_now(), notes=notes)
    notes = prof.notes  # pydantic copied the list
    reuse = {}
    for n, st in probe.stages.items():
        old = cached.stages.get(n) if cached else None
        same_threads = cached is not None and cached.machine.get("threads") == threads
        if old is not None and same_threads and old.key == keys[n] and all(d.name in old.devices for d in devs if _can_run(st, d)):
            reuse[n] = old
    todo = [n for n in probe.order() if n not in reuse]
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
            task = bar.add_task(f"profiling {name}", total=len(builds) * len(todo)) if bar else None
            last = None  # (size, seconds) of the previous size's pass
            order = list(builds)
            for i, (s, p) in enumerate(builds.items()):
                # later sizes cost more: give this one its share in proportion to its size
                size_budget = budget.left * s / sum(order[i:]) if budget_s is not None else None
                if last is not None and budget_s is not None:
                    guess = last[1] * (s / last[0]) ** 1.2 * 1.3
                    if guess > budget.left:
                        notes.append(f"stopped before size {s}: it would take about {guess:.1f} s, "
                                     f"{max(budget.left, 0):.1f} s of the budget left")
                        break
                t0 = time.perf_counter()
                cold = _profile_size(p, s, todo, devs, prof, size_budget, count_work_for_absent, notes,
                                     lambda: bar.advance(task) if bar else None, bound=profiling_bound(budget_s))
                measured.append(s)
                # one-time costs (compilation, first imports) will not recur at the next size
                last = (s, max(time.perf_counter() - t0 - cold, 1e-3))
    prof.measured_sizes = measured or sorted({pt.size for sp in reuse.values()
                                              for dp in sp.devices.values() for pt in dp.points})
    prof.elapsed_s = budget.elapsed
    if store:
        store.save(prof)
    return prof


def profiling_bound(budget_s: float | None) -> float | None:
    """The longest one stage call may take while profiling: the stage timeout when one is set,
    else twice the budget, and at least :data:`MIN_BOUND_S`.

    So a stage that hangs ends the profile with an error naming it soon after the
    budget runs out, never many budgets later, while a slow first call (imports,
    compilation) on a small budget still gets its time.
    """
    from placer.executor.stagecall import default_stage_timeout

    given = default_stage_timeout()
    if given is not None:
        return given
    return None if budget_s is None else max(2.0 * float(budget_s), MIN_BOUND_S)


#: the shortest bound on one stage call while profiling (see :func:`profiling_bound`)
MIN_BOUND_S = 30.0


def _can_run(stage: Stage, device: Device) -> bool:
    return stage.impl_for(device.driver.implementation) is not None


def _profile_size(p: Pipeline, size: int, todo: list[str], devs: list[Device], prof: Profile,
                  size_budget: float | None, count: bool, notes: list[str], tick: Callable[[], Any],
                  bound: float | None = None) -> float:
    """Run ``p`` once on the CPU, then measure each stage in ``todo`` on each device,
    sharing ``size_budget`` seconds (None: no limit) between them. A stage call that
    runs longer than ``bound`` seconds is stopped (see :func:`profiling_bound`).

    Returns the seconds spent on one-time costs (first calls beyond steady state)."""
    from placer.executor import call_stage, execute
    from placer.executor.stagecall import time_limit
    from placer.executor.transfer import nbytes, to_location

    cpu_dev = next((d for d in devs if not d.is_accelerator), None) or discover().get("cpu")
    budget = _Budget(size_budget)
    run = execute(p, "all=cpu", executor="inline", stage_timeout=bound)
    outputs = run.outputs
    first = {r.name: r.seconds for r in run.stages}
    stages_left = len(todo) * max(1, len(devs))
    cold_extra = 0.0
    for n in todo:
        st = p.stages[n]
        sp = prof.stages[n]
        host_inputs = {a: outputs[src] for a, src in st.inputs.items()}
        in_bytes = float(sum(nbytes(v) for v in host_inputs.values()))
        out_bytes = float(nbytes(outputs[n]))
        sp.reference_s[size] = first[n]
        for d in devs:
            if not _can_run(st, d):
                continue
            dp = sp.devices.setdefault(d.name, DeviceProfile(device=d.name, kind=d.kind))
            share = max(0.0, budget.left) / max(stages_left, 1) if budget.seconds is not None else 2.0
            stages_left -= 1
            try:
                on_host = not d.is_accelerator
                inputs = host_inputs if on_host else {a: to_location(v, d)[0] for a, v in host_inputs.items()}
                workers = cpu_dev.workers if on_host else 1
                call = lambda: call_stage(st, d, inputs, workers=workers)  # noqa: E731
                cold = None
                # the calls below: a cold one, a warm-up and at least three timed repeats
                limit = None if bound is None else bound + 5 * first[n] + 2.0
                with time_limit(limit, n, why="profiling bounds each stage by the budget"):
                    if on_host:
                        cold = first[n]  # the reference run was this size's first call
                    else:
                        t0 = time.perf_counter()
                        call()
                        cold = time.perf_counter() - t0
                    with PeakMemory(d) as mem:
                        call()  # warm-up, instrumented for memory
                    m = measure(call, cold=False, warmup=0, min_reps=3, max_reps=30,
                                min_time_s=min(MIN_TIMED_S, share / 3), max_time_s=max(min(1.0, share * 0.6), 1e-3),
                                label=f"stage {n!r} on {d.name} at size {size}", warn=False)
            except Exception as exc:  # noqa: BLE001 - recorded; other stages still profiled
                dp.error = f"{type(exc).__name__}: {exc}"
                notes.append(f"stage {n!r} on {d.name} at size {size} failed: {dp.error}")
                continue
            cold_extra += max((cold or 0.0) - m.median_s, 0.0)
            if m.noisy:
                notes.append(f"stage {n!r} on {d.name} at size {size}: noisy (IQR/median "
                             f"{m.iqr_s / m.median_s:.0%} over {m.reps} repeats)")
            dp.points.append(Point(size=size, median_s=m.median_s, iqr_s=m.iqr_s, reps=m.reps,
                                   number_per_run=m.number_per_run, raw_times=m.raw_times,
                                   first_call_s=cold, noisy=m.noisy, peak_host_bytes=mem.host,
                                   peak_device_bytes=mem.dev, input_bytes=in_bytes, output_bytes=out_bytes))
        if count:
            work = _count(st, host_inputs, in_bytes, out_bytes)
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
