"""A stream planned for a described machine: its profile here, turned into predictions for the target.

May import: placer.data.stream, placer.data.measures, placer.devices, placer.errors, placer.pipeline,
placer.target (its description, CPU scale and this CPU's calibration), placer.timing,
placer.stream.{model,reasons,target_words,work}; placer.stream.{planner,precision,profile} inside functions.

Counting one batch's work is :mod:`placer.stream.work`; the plan in words
:mod:`placer.stream.target_words`; a plain script's DataLoader for a target
:mod:`placer.stream.target_loader`.

A stream profiled on this machine (:func:`placer.stream.profile.profile_stream`) says
what each stage costs *here*. :func:`target_profile` turns it into the profile the
stream would have on a target (``--target h200`` or a file ``placer describe``
wrote), every number a prediction for that machine:

- **CPU stages** (and the source, and a step on the CPU): this machine's seconds per
  batch scaled to the target's CPU by :class:`~placer.target.scale.CpuScale` (the scale
  one-shot stages use: ops measured on both CPUs, the threads the measurement kept
  busy). Per worker: thread workers scale by Amdahl's law with the share of the GIL
  measured here (from two threads' speed-up), process workers at their one-process
  rate measured here (moving batches included, scaled like the stage) each, up to the
  target's cores; the target's cores and the GIL (a process worker's parent share of
  moving batches) cap them as they cap any stream.
- **GPU stages and the step** on the target's GPU: the roofline of its description
  (:class:`~placer.costmodel.roofline.DeviceDescription`) over the work of one batch
  counted here on the CPU (:func:`count_stream_work`: the stage's torch GPU
  implementation, the step's own call), plus the host time a GPU run pays (the calls
  dispatched times the target's cost of one, plus the time outside torch ops: as
  :meth:`placer.costmodel.model.CostModel.host_seconds`).
- **Copies** over the target's link: pinned and pageable (the executor's copy without
  pinning), per value and batch, from its transfer model.

The stream model (:mod:`placer.stream.model`) and the planner's search then run on
that profile unchanged: workers up to the target's cores, worker kind, prefetch,
pinning, cache and device per stage, chosen for the target. Nothing runs there, so
nothing is verified: :func:`plan_for_target` labels the plan with the target's name,
states what it would be bound by (:func:`bound_sentence`) and adds a what-if table for
the target (:func:`target_what_if`), with every CPU stage that has a torch GPU
implementation moved to the GPU (sharing it with the step).
"""

from __future__ import annotations

import math
from typing import Any

from placer.data.measures import Work
from placer.data.stream import CopyProfile, ScalingRow, StreamPlan, StreamProfile, StreamStageProfile
from placer.errors import PlacerError
from placer.stream.model import gil_share
from placer.stream.reasons import target_label
from placer.stream.target_words import TARGET_GPU, bound_sentence, target_summary, target_what_if, wait_fraction
from placer.stream.work import count_stream_work

#: CPU time over wall time up to which a measurement is one thread's work (scaled per core, never by the
#: target's extra cores: a worker is one thread, and its parallelism is the workers)
SERIAL_USE = 1.05
#: what-if rows of a plan for a target from the rule of thumb (or the user's DataLoader), after its own options
USUAL_ROWS = 3

__all__ = ["TARGET_GPU", "bound_sentence", "count_stream_work", "here_seconds", "host_seconds", "plan_for_target",
           "plan_stream_for_target", "plan_streams_for_target", "target_profile", "target_summary",
           "target_what_if", "wait_fraction"]


# -- the profile on the target -----------------------------------------------------------------------
def target_profile(profile: StreamProfile, target: Any, work: dict[str, Work], *, here_cpu: Any = None,
                   dispatch_s: float | None = None) -> StreamProfile:
    """``profile`` (measured here) as predicted on ``target``'s CPU, first GPU and link.

    Parameters
    ----------
    profile : StreamProfile
        Measured on this machine.
    target : TargetDescription or str
        The machine planned for (``"h200"``, a file, or a description).
    work : dict
        Member → the work of one batch (:func:`count_stream_work`): members with work get
        a roofline time on the target's GPU.
    here_cpu : CpuDescription, optional
        This machine's CPU calibration (default: measured once per machine and cached,
        :func:`placer.target.calibrate.this_cpu`).
    dispatch_s : float, optional
        Seconds one op costs to issue here (default: ``here_cpu``'s).

    Returns
    -------
    StreamProfile
        Devices ``cpu`` (the target's) and ``gpu:0`` (its first GPU), ``target`` set.
    """
    from placer.target import CpuScale, load_target

    t = load_target(target)
    if not t.gpus:
        raise PlacerError(f"target {t.name!r} describes no GPU: a stream is planned for a machine with one")
    notes = [f"every number is a prediction for {t.name} (described, not measured): nothing ran there; "
             "CPU times scaled from this machine's, GPU times from the roofline of the work counted here"]
    scale = None
    if t.cpu is None:
        notes.append(f"target {t.name!r} describes no CPU: its CPU times are this machine's")
    else:
        if here_cpu is None:
            from placer.target.calibrate import this_cpu

            here_cpu = this_cpu()
        scale = CpuScale.between(here_cpu, t.cpu)
        notes.append(scale.describe() if scale is not None else
                     f"no op measured on both this CPU and {t.name}'s: its CPU times are this machine's")
    if dispatch_s is None and here_cpu is not None:
        dispatch_s = here_cpu.dispatch_s
    cores = t.cpu.cores if t.cpu is not None else profile.cores
    gpu = t.gpus[0]
    ratio_of = _ratio(profile, scale)
    stages = [_target_stage(profile, s, ratio_of, work.get(s.name), gpu, scale, dispatch_s, cores)
              for s in profile.stages]
    out = StreamProfile(
        pipeline=profile.pipeline, source=profile.source, step=profile.step, members=list(profile.members),
        epochs=profile.epochs, batch_size=profile.batch_size, samples_per_batch=profile.samples_per_batch,
        batches_per_epoch=profile.batches_per_epoch, source_kind=profile.source_kind, loader=profile.loader,
        cores=cores, devices=["cpu", TARGET_GPU],
        device_titles={"cpu": f"{t.cpu.model} ({cores} cores)" if t.cpu else "CPU", TARGET_GPU: gpu.name},
        real_gpus=[TARGET_GPU], stages=stages, copies=_copies(profile, stages, gpu),
        measured_batches=dict(profile.measured_batches), budget_s=profile.budget_s, seconds=profile.seconds,
        torch_threads=(t.cpu.threads or t.cpu.cores) if t.cpu else profile.torch_threads,
        notes=[*notes, *(f"measured on this machine: {n}" for n in profile.notes)], target=t.name)
    step = out.stage(out.step)
    out.consumer_samples_per_s = {d: out.samples_per_batch / s for d, s in step.seconds.items() if s > 0}
    if out.step not in work:
        out.notes.append(f"the step's work was not counted: {out.step!r} is planned on the target's CPU only")
    return out


def _ratio(profile: StreamProfile, scale: Any):
    """Target seconds per second here, for a member's CPU time (wall and CPU seconds per batch): the
    per-core ratio for one thread's work, else :meth:`CpuScale.ratio` with the threads it kept busy."""
    threads = profile.torch_threads or 1

    def ratio(wall: float, cpu: float, work: Work | None = None) -> float:
        if scale is None or wall <= 0:
            return 1.0
        used = max(cpu / wall, 1.0)
        if used <= SERIAL_USE:  # one thread's work (a worker, pure Python): the per-core ratio
            return scale.dispatch_ratio
        kw: dict[str, Any] = {"threads_used": used, "threads": max(threads, math.ceil(used))}
        if work is not None and work.source == "counted":
            kw["ops"] = work.ops
            if work.bytes > 0:
                kw["bytes"] = work.bytes
        return scale.ratio(wall, **kw)

    return ratio


def _target_stage(profile: StreamProfile, s: StreamStageProfile, ratio_of, work: Work | None, gpu: Any, scale: Any,
                  dispatch_s: float | None, cores: int) -> StreamStageProfile:
    """One member on the target: scaled CPU seconds, scaling rows to the target's cores, the GPU's roofline."""
    new = StreamStageProfile(name=s.name, role=s.role, kind=s.kind, reads=list(s.reads), out_bytes=dict(s.out_bytes),
                       gil_bound=s.gil_bound, gil=s.gil, cacheable=s.cacheable, pin=s.pin, work=work)
    r = 1.0
    if "cpu" in s.seconds:
        wall = here_seconds(s)
        cpu = min(s.cpu_seconds.get("cpu", wall), wall)
        r = ratio_of(wall, cpu, work if s.role == "step" else None)
        new.seconds["cpu"] = wall * r
        new.cpu_seconds["cpu"] = cpu * r
        new.devices.append("cpu")
    if s.role == "batch" and "cpu" in s.seconds:
        new.scaling = _scaling_rows(profile, s, r, cores)
    if work is not None and s.role != "source":
        host = host_seconds(work, dispatch_s, scale)
        new.seconds[TARGET_GPU] = gpu.predict(work.model_copy(update={"host_s": host}))
        new.cpu_seconds[TARGET_GPU] = host
        new.devices.append(TARGET_GPU)
    if not new.seconds and s.role != "source":
        raise PlacerError(f"stream member {s.name!r} has neither CPU times nor counted work to predict it on the "
                          "target with; profile it on the CPU")
    return new


def here_seconds(s: StreamStageProfile) -> float:
    """A member's seconds per batch on one worker here: the sweep's, or one thread's rate in the scaling
    runs when that was faster (noise from other work only adds time)."""
    one = next((r.batches_per_s for r in s.scaling if r.kind == "thread" and r.workers == 1), 0.0)
    return min(s.seconds["cpu"], 1.0 / one) if one > 0 else s.seconds["cpu"]


def host_seconds(work: Work, dispatch_s: float | None, scale: Any) -> float:
    """The host time a GPU run of ``work`` pays on the target: the calls dispatched times the target's
    cost of one, plus the time outside torch ops (:meth:`placer.target.CpuScale.host_seconds`, as
    :meth:`placer.costmodel.model.CostModel.host_seconds` does for one-shot stages)."""
    if scale is not None:
        return scale.host_seconds(work.dispatches, work.outside_s, dispatch_s)
    return work.dispatches * (dispatch_s or 0.0) + work.outside_s


def _scaling_rows(profile: StreamProfile, s: StreamStageProfile, ratio: float, cores: int) -> list[ScalingRow]:
    """A batch stage's workers on the target, 1 .. its cores: threads by Amdahl's law with the GIL's share
    measured here (from two threads' speed-up); processes at the one-process rate measured here (moving
    batches included), scaled, per worker. Several workers here share this machine's few (and often busy)
    cores, so their rates here say nothing of the target's; the cores resource and the GIL (the parent's
    share of moving batches) cap the workers in the stream model."""
    rows = []
    counts = range(1, max(1, cores) + 1)
    if any(r.kind == "thread" for r in s.scaling) or not s.scaling:
        g = gil_share(profile, s.name) if any(r.kind == "thread" and r.workers >= 2 for r in s.scaling) else 0.0
        one = 1.0 / (here_seconds(s) * ratio)
        for w in counts:
            sp = 1.0 / (g + (1.0 - g) / w)
            rows.append(ScalingRow(kind="thread", workers=w, batches_per_s=one * sp, speedup=sp))
    first = next((r for r in s.scaling if r.kind == "process" and r.workers == 1), None)
    if first is not None and first.batches_per_s > 0:
        one = first.batches_per_s / ratio
        for w in counts:
            rows.append(ScalingRow(kind="process", workers=w, batches_per_s=one * w, speedup=float(w)))
    return rows


def _copies(profile: StreamProfile, stages: list[StreamStageProfile], gpu: Any) -> list[CopyProfile]:
    """Every per-batch value's copies between the host and the target's GPU, over its link (the value's
    bytes as measured here; a value made on the GPU taken at its host size)."""
    tm = gpu.transfer
    out = []
    for s in stages:
        n = max(s.out_bytes.values(), default=0)
        if s.role == "step" or n <= 0:
            continue
        pinned = tm.links["h2d"].get("pinned") or tm.link_for("h2d", n, pin=True)
        pageable = tm.link_for("h2d", n, pin=False)
        out.append(CopyProfile(value=s.name, src="host", dst=TARGET_GPU, bytes=n,
                               seconds={"pinned": pinned.seconds(n), "pageable": pageable.seconds(n),
                                        "executor": tm.link_for("h2d", n, pin=True).seconds(n)}))
        back = tm.link_for("d2h", n)
        out.append(CopyProfile(value=s.name, src=TARGET_GPU, dst="host", bytes=n,
                               seconds={"executor": back.seconds(n)}))
    return out


# -- the plan for the target -------------------------------------------------------------------------
def plan_for_target(profile: StreamProfile, target: Any, work: dict[str, Work], *, objective: str = "auto",
                    epochs: int | None = None, here_cpu: Any = None, dispatch_s: float | None = None,
                    step_precision: Any = None) -> StreamPlan:
    """The plan of a stream profiled here, for ``target``: settings chosen for it, every number a prediction.

    Returns
    -------
    StreamPlan
        ``target`` set, ``target_sentence`` (what it would be bound by), ``predicted_wait_fraction``
        and a what-if table for the target (:func:`target_what_if`) ahead of the usual one. With a
        ``step_precision`` (:class:`~placer.stream.precision.StepPrecision`), the step is predicted in each
        allowed precision and planned in the one chosen on each device (:func:`placer.stream.precision.apply`).
    """
    from placer.stream.planner import plan_from_profile
    from placer.stream.precision import annotate, apply
    from placer.target import load_target

    tp = target_profile(profile, target, work, here_cpu=here_cpu, dispatch_s=dispatch_s)
    if step_precision is not None and "fp32" not in step_precision.work and profile.step in work:
        step_precision.work["fp32"] = work[profile.step]
    tp, times, chosen = apply(tp, step_precision, load_target(target).gpus[0])
    plan, ranked, scorer = plan_from_profile(tp, objective=objective, epochs=epochs)
    plan.target = tp.target
    best = ranked[0]
    plan.predicted_wait_fraction = wait_fraction(tp, scorer, best)
    plan.target_sentence = bound_sentence(tp, scorer, best)
    label = target_label(tp.target)
    for alt in [*plan.what_if, *plan.baselines]:
        alt.change = f"{alt.change}; predicted on {label}" if alt.change else f"predicted on {label}"
    ours = target_what_if(tp, scorer, best, ranked)
    seen: set = set()
    usual = []
    for a in plan.what_if:  # single changes from the rule of thumb: one row per distinct outcome
        key = (round(a.predicted_samples_per_s, -1), a.bottleneck)
        if key not in seen:
            seen.add(key)
            usual.append(a)
    plan.what_if = [*ours, *usual[:USUAL_ROWS]]
    annotate(plan, step_precision, times, chosen)
    return plan


def plan_stream_for_target(pipeline: Any, target: Any, *, source: str | None = None, budget_s: float = 10.0,
                           inventory: Any = None, objective: str = "auto", epochs: int | None = None,
                           here_cpu: Any = None, profile: StreamProfile | None = None,
                           work: dict[str, Work] | None = None, precision: str | None = None) -> StreamPlan:
    """Profile one stream of ``pipeline`` here (or take ``profile``), count one batch's work, and plan it
    for ``target`` (:func:`plan_for_target`). Nothing is verified by running: the target is not here."""
    from placer.stream.profile import one_shot_inputs, profile_stream

    p = pipeline.validate()
    if not p.streams():
        raise PlacerError(f"pipeline {p.name!r} has no stream to plan")
    source = source or next(iter(p.streams()))
    notes: list[str] = []
    consts = None
    if profile is None or work is None:
        from placer.devices import discover

        inventory = inventory or discover()
        consts = one_shot_inputs(p, source, inventory)
    if profile is None:
        profile = profile_stream(p, source, budget_s=0.8 * budget_s, inventory=inventory, consts=consts)
    if work is None:
        work = count_stream_work(p, source, inventory=inventory, consts=consts, notes=notes)
    from placer.stream.precision import check_step

    sp = check_step(p, source, precision, count=True, inventory=inventory, consts=consts)
    plan = plan_for_target(profile, target, work, objective=objective, epochs=epochs, here_cpu=here_cpu,
                           step_precision=sp)
    plan.notes.extend(n for n in notes if n not in plan.notes)
    return plan


def plan_streams_for_target(pipeline: Any, target: Any, **kwargs: Any) -> list[StreamPlan]:
    """:func:`plan_stream_for_target` for every stream of ``pipeline`` (the budget split between them)."""
    streams = list(pipeline.validate().streams())
    budget = kwargs.pop("budget_s", 10.0) / max(1, len(streams))
    return [plan_stream_for_target(pipeline, target, source=s, budget_s=budget, **kwargs) for s in streams]
