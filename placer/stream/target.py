"""A stream planned for a described machine: its profile here, turned into predictions for the target.

May import: placer.data.stream, placer.data.measures, placer.devices, placer.errors, placer.pipeline,
placer.costmodel.counts, placer.target (its description, CPU scale and this CPU's calibration),
placer.executor (to count the work of one batch), placer.timing, placer.stream.*; torch only through
the counter and the user's own loader.

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
from placer.data.stream import Alternative, CopyProfile, ScalingRow, StreamStageProfile, StreamPlan, StreamProfile
from placer.errors import PlacerError
from placer.stream.model import gil_share
from placer.stream.reasons import target_label

#: the target's GPU in the planned stream
TARGET_GPU = "gpu:0"
#: batches run to count one batch's work (the last is counted; the first warms up)
COUNT_BATCHES = 2
#: CPU time over wall time up to which a measurement is one thread's work (scaled per core, never by the
#: target's extra cores: a worker is one thread, and its parallelism is the workers)
SERIAL_USE = 1.05
#: seconds the step's work may be counted for (its time outside torch ops is the least of the calls)
STEP_COUNT_S = 1.5
#: what-if rows of a plan for a target from the rule of thumb (or the user's DataLoader), after its own options
USUAL_ROWS = 3


# -- counting one batch's work here ------------------------------------------------------------------
def count_stream_work(pipeline: Any, source: str, *, inventory: Any = None, consts: dict | None = None,
                      batches: int = COUNT_BATCHES, notes: list[str] | None = None) -> dict[str, Work]:
    """The work of one batch of every member a GPU could run, counted on this machine's CPU.

    The stream runs sequentially on the CPU for ``batches`` batches; on the last, each
    per-batch stage with a torch GPU implementation runs that implementation on CPU
    tensors under the counter, and the step's own call is counted (its state trained by
    one more batch, as profiling does).

    Returns
    -------
    dict
        Member → :class:`~placer.data.measures.Work` (members whose work could not be
        counted are left out, with a note).
    """
    from placer.costmodel.counts import count_work
    from placer.devices import SIM, Device, discover
    from placer.executor.stagecall import call_stage
    from placer.executor.stream.config import StreamConfig
    from placer.executor.stream.nodes import takes
    from placer.executor.stream.runner import StreamRun
    from placer.executor.transfer import to_location
    from placer.pipeline import BATCH_INFO
    from placer.stream.profile import can_run, one_shot_inputs

    notes = [] if notes is None else notes
    p = pipeline.validate()
    inv = inventory or discover()
    members = p.streams()[source]
    blocked = [m for m in members if not can_run(p, m, "cpu")]
    if blocked:
        notes.append(f"{', '.join(blocked)} cannot run on the CPU: the stream's work was not counted")
        return {}
    consts = one_shot_inputs(p, source, inv) if consts is None else consts
    devices = {m: inv.resolve("cpu", stage=m) for m in members}
    run = StreamRun(p, source, devices, consts, StreamConfig(workers=0, max_batches=max(1, batches)))
    counter = Device(name=SIM, kind="sim", label="work counter (runs the GPU implementation on the CPU)")
    out: dict[str, Work] = {}
    run.step.start()
    bundles = list(run.bundles())
    for i, b in enumerate(bundles):
        last = i == len(bundles) - 1
        for node in run.nodes[1:]:
            if last and node.kind == "step":
                # the least time outside torch ops over a few calls: noise on a busy machine only adds to it
                out[node.name] = count_work(lambda n=node, b=b: run.work(n, b), budget_s=STEP_COUNT_S)[1]
                continue
            if last and node.kind == "batch":
                impl = node.stage.impl_for("gpu")
                if impl is not None and impl.api == "torch":
                    inputs = {a: to_location(b.values[s][node.location], counter)[0] for a, s in node.reads.items()}
                    const = {a: to_location(v, counter)[0] for a, v in node.consts.items()}
                    extra = {BATCH_INFO: b.info} if takes(impl.fn, BATCH_INFO) else None
                    try:
                        def gpu_call(st=node.stage, x={**const, **inputs}, e=extra):
                            return call_stage(st, counter, x, extra=e)

                        out[node.name] = count_work(gpu_call)[1]
                    except Exception as exc:  # noqa: BLE001 - counting is best effort: the stage stays on the CPU
                        notes.append(f"the work of {node.name!r} on a GPU could not be counted "
                                     f"({type(exc).__name__}: {exc}); it is planned on the CPU only")
                elif impl is not None:
                    notes.append(f"{node.name!r}: its GPU implementation is {impl.api} code, whose work cannot be "
                                 "counted without a GPU; it is planned on the CPU only")
            run.work(node, b)
    return out


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


def wait_fraction(profile: StreamProfile, scorer: Any, c: Any) -> float | None:
    """The step's predicted share of time waiting for data: ``1 - stream rate / the step's own rate``."""
    take = profile.consumer_samples_per_s.get(c.place[profile.step])
    if not take:
        return None
    return max(0.0, 1.0 - scorer.predict(c).samples_per_s / take)


def machine_name(profile: StreamProfile) -> str:
    """The target in running text: ``the NVIDIA H200 machine``."""
    return target_label(profile.target)


def bound_sentence(profile: StreamProfile, scorer: Any, c: Any) -> str:
    """What the stream would be bound by on the target, in one sentence naming the target.

    "On the NVIDIA H200 machine (predicted) the step could take 9,400 samples/s; 'augment' on 14
    worker processes delivers about 3,100: the GPU would wait 67 % of the time."
    """
    pred = scorer.predict(c)
    dev = c.place[profile.step]
    take = profile.consumer_samples_per_s.get(dev, 0.0)
    on = "on the GPU" if dev != "cpu" else "on the CPU"
    head = f"On {machine_name(profile)} (predicted) the step {on} could take {take:,.0f} samples/s"
    neck = pred.rates[0] if pred.rates else None
    wait = wait_fraction(profile, scorer, c) or 0.0
    if c.settings.sequential:
        return (f"{head}; one batch at a time every stage runs in turn: about {pred.samples_per_s:,.0f} "
                f"samples/s, the step waiting {wait:.0%} of the time.")
    if neck is None or (profile.step in neck.members and (neck.kind == "stage" or neck.members == [profile.step])):
        return f"{head}; the stream keeps up: the step binds, at about {pred.samples_per_s:,.0f} samples/s."
    if neck.kind == "device" and profile.step in neck.members:
        others = ", ".join(repr(m) for m in neck.members if m != profile.step)
        return (f"{head}; {others} shares the GPU with it: about {pred.samples_per_s:,.0f} samples/s, the GPU "
                f"busy all the time ({1 - wait:.0%} of it on the step).")
    waits = "the GPU" if dev != "cpu" else "the step"
    return (f"{head}; {_who(profile, c, neck)} delivers about {pred.samples_per_s:,.0f}: {waits} would wait "
            f"{wait:.0%} of the time.")


def _workers(n: int, kind: str) -> str:
    """``16 worker processes``, ``one worker thread``."""
    noun = "process" if kind == "process" else "thread"
    return f"one worker {noun}" if n == 1 else f"{n} worker {noun}{'es' if noun == 'process' else 's'}"


def _who(profile: StreamProfile, c: Any, rate: Any) -> str:
    """The resource that binds, in words ("'augment' on 14 worker processes", "the GIL", "the link")."""
    if rate.kind == "stage":
        m = rate.members[0]
        if m == profile.source:
            w = c.workers.get(m)
            kind = (f"loader thread{'s' if w != 1 else ''}" if c.settings.loader_threads(m)
                    else "DataLoader worker processes")
            return f"the source {m!r}" + (f" on {w} {kind}" if w else "")
        w = 1 if c.settings.sequential else c.workers.get(m, 1)
        return f"{m!r} on {_workers(w, c.settings.kind_of(m))}"
    if rate.kind == "device":
        return f"the GPU ({', '.join(repr(m) for m in rate.members)} sharing it)"
    if rate.kind == "link":
        return "the host-to-GPU link"
    if rate.kind == "cores":
        return f"the {profile.cores} cores"
    if rate.kind == "gil":
        return f"the GIL ({', '.join(repr(m) for m in rate.members)} taking turns)"
    return rate.name


def target_what_if(profile: StreamProfile, scorer: Any, best: Any, ranked: list | None = None) -> list[Alternative]:
    """Options for the target beside the plan, predicted: every per-batch stage with both implementations on
    the other device (on the GPU it shares the GPU with the step; on the CPU with the workers that suit it
    best, from ``ranked``), the CPU stages with the target's cores as workers of either kind, pageable
    copies, and one batch at a time."""
    from placer.stream.search import cpu_members, worker_options

    base = scorer.score(best)
    rows: list[tuple[str, Any]] = []
    place = best.place
    for s in profile.stages:
        if s.role != "batch" or not {"cpu", TARGET_GPU} <= set(s.seconds):
            continue
        new = {**place, s.name: "cpu" if place[s.name] == TARGET_GPU else TARGET_GPU}
        if new[s.name] == TARGET_GPU:
            ws = {m: best.workers.get(m, 1) for m in cpu_members(profile, new)}
            shared = " (it shares the GPU with the step)" if place[profile.step] == TARGET_GPU else ""
            rows.append((f"{s.name!r} on the GPU{shared}", best.with_(placement=tuple(new.items()), stage_workers=ws)))
            continue
        alt = next((c for c in ranked or [] if c.place == new and not c.settings.sequential), None)
        if alt is None:
            ws = {m: max(worker_options(profile, m)) if m == s.name else best.workers.get(m, 1)
                  for m in cpu_members(profile, new)}
            alt = best.with_(placement=tuple(new.items()), stage_workers=ws)
        rows.append((f"{s.name!r} on the CPU, {_workers(alt.workers.get(s.name, 1), alt.settings.kind_of(s.name))}",
                     alt))
    if profile.source_kind != "iterable" and not best.settings.sequential:
        mine = profile.loader.num_workers if profile.loader is not None else 0
        for w in sorted({mine, profile.cores} - {best.workers.get(profile.source, 0)}):
            who = "your DataLoader's" if w == mine and profile.loader is not None else "the cores'"
            rows.append((f"{w} DataLoader worker processes ({who} count)",
                         best.with_(stage_workers={**best.workers, profile.source: w})))
    for m in cpu_members(profile, place):
        if m == profile.source or best.settings.sequential:
            continue
        for kind in ("thread", "process"):
            if kind == "process" and not any(r.kind == "process" for r in profile.stage(m).scaling):
                continue
            w = max(worker_options(profile, m, kind))
            kinds = {k: v for k, v in best.settings.worker_kind.items() if k != m} | (
                {m: "process"} if kind == "process" else {})
            cand = best.with_(stage_workers={**best.workers, m: w}, worker_kind=kinds)
            if cand != best:
                rows.append((f"{m!r} on {_workers(w, kind)}", cand))
    if best.settings.pin_memory:
        rows.append(("pageable copies (no pin_memory)", best.with_(pin_memory=False)))
    if not best.settings.sequential:
        rows.append(("one batch at a time (no workers)", best.with_(workers=0)))
    out = []
    for name, c in rows:
        pred = scorer.predict(c)
        value = scorer.value(pred)
        out.append(Alternative(name=name, change=f"from the plan, on {machine_name(profile)} (predicted)",
                               placement=c.place, config=c.settings.decisions(), predicted_samples_per_s=value,
                               predicted_total_s=pred.total_s, speedup=value / base if base else None,
                               bottleneck=pred.bottleneck))
    return out


# -- a plain script's DataLoader and step, for a target -------------------------------------------------
#: the two members of a plain script's stream: its DataLoader (the source) and its train step
LOADER, STEP = "loader", "step"


def loader_profile(loader: Any, step: Any, kept: list, *, batches: int = 6, step_on_cpu: bool = True
                   ) -> tuple[StreamProfile, dict[str, Work]]:
    """A plain script's DataLoader and step as a two-member stream profile, measured here, and the step's work.

    The loader runs in this process (``num_workers=0``, rebuilt from the user's: same dataset, sampler
    and order) for ``batches`` batches, each fetch timed (wall and CPU seconds; the first is warm-up);
    the step runs on the ``kept`` batches, timed, and once more under the work counter (when it runs on
    the CPU here: a step on a GPU here cannot be counted on CPU tensors).
    """
    import os

    from placer.costmodel.counts import count_work
    from placer.executor.transfer import nbytes
    from placer.stream.dropin.measuring import counter_of, rebuild, settings_of
    from placer.timing import Clock, Timings

    if not kept:
        raise PlacerError("no batch of the loader was kept to time the step on; give the loader at least one batch")
    user = settings_of(loader)
    plain = rebuild(loader, user.model_copy(update={"num_workers": 0, "prefetch_factor": None,
                                                    "persistent_workers": False, "pin_memory": False}))
    timings = Timings()
    fetches = []
    it = iter(plain)
    for _ in range(max(2, batches) + 1):
        with Clock() as c:
            batch = next(it, None)
        if batch is None:
            break
        fetches.append(c)
    del it
    for c in fetches[1:] or fetches:  # the first fetch is warm-up, unless it is the only one
        timings.add(LOADER, c)
    for b in [*kept, *kept][: max(3, len(kept))]:
        with Clock() as c:
            step(b)
        timings.add(STEP, c)
    work = {STEP: count_work(lambda: step(kept[-1]))[1]} if step_on_cpu else {}
    count = counter_of(loader)
    spb = sum(count(b) for b in kept) / len(kept)
    wall, cpu = timings.wall(LOADER).lower_quartile_s, timings.cpu(LOADER).lower_quartile_s
    src = StreamStageProfile(name=LOADER, role="source", kind="other", devices=["cpu"], seconds={"cpu": wall},
                       cpu_seconds={"cpu": cpu}, out_bytes={"host": int(nbytes(kept[-1]))})
    st = StreamStageProfile(name=STEP, role="step", kind="training", reads=[LOADER],
                      devices=["cpu"] if step_on_cpu else [])
    if step_on_cpu:
        st.seconds["cpu"] = timings.wall(STEP).lower_quartile_s
        st.cpu_seconds["cpu"] = timings.cpu(STEP).lower_quartile_s
    try:
        per_epoch = len(loader)
    except TypeError:
        per_epoch = None
    prof = StreamProfile(pipeline="script", source=LOADER, step=STEP, members=[LOADER, STEP],
                         batch_size=loader.batch_size, samples_per_batch=spb, batches_per_epoch=per_epoch,
                         source_kind="loader", loader=user, cores=os.cpu_count() or 1, stages=[src, st],
                         torch_threads=user.torch_threads)
    return prof, work


def plan_loader_for_target(loader: Any, step: Any, kept: list, target: Any, *, step_on_cpu: bool = True,
                           here_cpu: Any = None) -> StreamPlan:
    """A plain script's DataLoader and step planned for ``target`` (:func:`loader_profile`, then
    :func:`plan_for_target`): DataLoader workers up to the target's cores, pinning, the step on its GPU."""
    prof, work = loader_profile(loader, step, kept, step_on_cpu=step_on_cpu)
    plan = plan_for_target(prof, target, work, here_cpu=here_cpu)
    if not step_on_cpu:
        plan.notes.append("the step runs on a GPU here: its work was not counted on the CPU, so the target's GPU "
                          "time of the step is not predicted; advise with device='cpu' to count it")
    return plan


def target_summary(plan: StreamPlan) -> dict[str, Any]:
    """A stream plan for a target as plain data: every number a prediction for ``machine``.

    For a plain script (its DataLoader as the source) the chosen DataLoader settings are given in
    its own terms (``loader``: ``num_workers``, ``pin_memory``, ...).
    """
    from placer.data.stream import LoaderSettings

    out: dict[str, Any] = {
        "machine": plan.target, "label": "predicted",
        "predicted_samples_per_s": plan.predicted_samples_per_s,
        "step_predicted_samples_per_s": plan.consumer_samples_per_s,
        "bottleneck": plan.bottleneck, "predicted_wait_fraction": plan.predicted_wait_fraction,
        "bottleneck_sentence": plan.target_sentence,
        "settings": {"placement": dict(plan.placement), **plan.settings.decisions()},
        "stages": [{"name": d.name, "device": d.device, "workers": d.workers, "worker_kind": d.worker_kind,
                    "predicted_seconds_per_batch": d.seconds_per_batch, "predicted_batches_per_s": d.batches_per_s}
                   for d in plan.stages],
        "what_if": [{**a.model_dump(include={"name", "change", "predicted_samples_per_s", "speedup",
                                             "bottleneck"}), "machine": plan.target} for a in plan.what_if],
        "notes": list(plan.notes),
    }
    if plan.source == LOADER:
        out["loader"] = LoaderSettings.from_stream(plan.settings, LOADER).as_dict()
    if plan.precision_s:  # the step's times per precision, the one chosen, the checks
        out |= {"precision": dict(plan.precision), "precision_s": plan.precision_s,
                "precision_checks": list(plan.precision_checks)}
    return out
