"""A stream's step in a lower precision: checked here, predicted, chosen, so the bottleneck and workers follow.

May import: placer.data, placer.errors, placer.precision, placer.costmodel.precision (its rule for
choosing), placer.profile.precision (the accuracy check), placer.stream.work (counting one batch's
work); torch only through the counter and the check.

A stream's step (a training loop's call per batch) may allow lower precisions like any stage
(``precision=`` on it, the pipeline's default, ``--precision auto``), or the user fixes one
(``--precision step=bf16``). Before planning, :func:`check_step` runs the stream again here in each
allowed precision and compares the step's loss over the profiled batches with fp32
(:func:`placer.profile.precision.check_precisions`; bf16 by CPU autocast, emulated where this CPU has
no native bf16 products, TF32 emulated). For a described target it also counts one batch of the
step's work under autocast (:func:`placer.stream.work.count_stream_work`), so a GPU's bf16 time
is priced with the bytes, launches and dispatches autocast really gives.

:func:`apply` then predicts the step per precision on every device the profile has
(:func:`step_times`): on the target's GPU from the roofline (the tensor-core FLOPs at that
precision's peak), on this machine's CPU from the check's own timing (bf16 there is emulated and
charged at the measured slowdown of this CPU's bf16 products, so it is never chosen; TF32 changes
nothing on a CPU). On each device it keeps the fastest precision whose check passed and that
beats fp32 by more than :data:`placer.costmodel.precision.PRECISION_GAIN` (or the fixed one), and
writes its time into the profile's step. The planner's search then runs unchanged on that
profile: a faster step moves the bottleneck to the loader, and the workers the search gives the
loader's stages follow. :func:`annotate` records the choice, the times and the checks in the
plan, with a reason that states both numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from placer.data.measures import PrecisionCheck, Work
from placer.data.stream import StreamPlan, StreamProfile

log = logging.getLogger("placer")


@dataclass
class StepPrecision:
    """The step's allowed precisions, their accuracy checks and (for a target) its work counted in each.

    Attributes
    ----------
    step : str
        The step's name.
    checks : dict
        Precision → :class:`~placer.data.measures.PrecisionCheck` (the step's loss over the
        profiled batches against fp32's).
    work : dict
        Precision → the work of one batch counted in it (``fp32``, and ``bf16``/``fp16`` under
        autocast), for a target's roofline; empty when not counted.
    fixed : str or None
        The precision ``--precision`` fixed for the step (planned as it is).
    """

    step: str
    checks: dict[str, PrecisionCheck] = field(default_factory=dict)
    work: dict[str, Work] = field(default_factory=dict)
    fixed: str | None = None

    @property
    def precisions(self) -> list[str]:
        """The lower precisions to predict: the fixed one, else each checked."""
        if self.fixed not in (None, "fp32"):
            return [self.fixed]
        return list(self.checks)


def check_step(pipeline: Any, source: str, option: str | None = None, *, count: bool = False,
               inventory: Any = None, consts: dict | None = None) -> StepPrecision | None:
    """The step's allowed (or fixed) lower precisions checked for accuracy here; None when it has none.

    Parameters
    ----------
    pipeline : Pipeline
        Built at the profiled size.
    source : str
        The stream's source.
    option : str, optional
        ``--precision``'s text (``auto``, ``STAGE=PRECISION,...``).
    count : bool
        Also count one batch of the step's work in fp32 and under autocast (for a target's roofline).
    """
    from placer.precision import parse_precision_option
    from placer.profile.precision import allowed, check_precisions

    p = pipeline.validate()
    step = p.streams()[source][-1]
    auto, fixed = parse_precision_option(option, p.stages)
    precs = list(allowed(p, auto).get(step, ()))
    fix = fixed.get(step)
    if fix not in (None, "fp32") and fix not in precs:
        precs.append(fix)
    if not precs:
        return StepPrecision(step=step, fixed=fix) if fix == "fp32" else None
    found = check_precisions(p, {step: tuple(precs)}).get(step, [])
    out = StepPrecision(step=step, checks={c.precision: c for c in found}, fixed=fix)
    if count:
        out.work = count_step(p, source, [q for q in precs if q in ("bf16", "fp16")], inventory=inventory,
                              consts=consts)
    return out


def count_step(pipeline: Any, source: str, precisions: list[str], *, inventory: Any = None,
               consts: dict | None = None) -> dict[str, Work]:
    """One batch of the step's work counted in fp32 and in each of ``precisions`` (under autocast, with
    CUDA's fp32 list; emulated where this CPU has no native products in that type)."""
    from placer.profile.precision import as_on_gpu
    from placer.stream.work import count_stream_work

    p = pipeline.validate()
    step = p.streams()[source][-1]
    out: dict[str, Work] = {}
    for prec in ["fp32", *precisions]:
        with as_on_gpu(prec):
            got = count_stream_work(p, source, inventory=inventory, consts=consts).get(step)
        if got is not None:
            out[prec] = got
    return out


def step_times(profile: StreamProfile, sp: StepPrecision, gpu: Any = None) -> dict[str, dict[str, float]]:
    """Device → precision → the step's predicted seconds per batch (fp32: the profile's own).

    On a described GPU (``gpu``, a :class:`~placer.costmodel.roofline.DeviceDescription`, with the
    step's counted fp32 work): the roofline in each precision, the host time the profile charged
    (``cpu_seconds`` on that device) scaled by the calls autocast dispatches; bf16 and fp16 with
    the work counted under autocast when there is one (its two-byte bytes and its casts), else
    fp32's work with the products' bytes halved. On the CPU: fp32's seconds times the check's
    measured ratio (``tf32``: unchanged). Elsewhere: fp32 only.
    """
    st = profile.stage(sp.step)
    out: dict[str, dict[str, float]] = {}
    for dev, base in st.seconds.items():
        times = {"fp32": base}
        for prec in sp.precisions:
            t = None
            if dev == "cpu":
                c = sp.checks.get(prec)
                if prec == "tf32":
                    t = base
                elif c is not None and c.seconds and c.fp32_seconds:
                    t = base * c.seconds / c.fp32_seconds
            elif gpu is not None and "fp32" in sp.work:
                t = _roofline(gpu, sp.work, prec, base, st.cpu_seconds.get(dev, 0.0))
            if t is not None:
                times[prec] = t
        out[dev] = times
    return out


def _roofline(gpu: Any, work: dict[str, Work], prec: str, base: float, host: float) -> float:
    """``base`` (the fp32 prediction) times the roofline's ratio of ``prec`` to fp32 for one batch."""
    w32 = work["fp32"].model_copy(update={"host_s": host})
    low = work.get(prec)
    if low is not None:
        calls = (low.dispatches / w32.dispatches) if w32.dispatches else 1.0
        w = low.model_copy(update={"host_s": host * calls, "tensor_bytes": 0.0, "precision": w32.precision})
    else:
        w = w32
    fp32 = gpu.predict(w32)
    return base * gpu.predict(w, precision=prec) / fp32 if fp32 > 0 else base


def choose(times: dict[str, float], sp: StepPrecision) -> str:
    """The precision to plan the step with on one device (:func:`placer.costmodel.precision.fastest_checked`)."""
    from placer.costmodel.precision import fastest_checked

    return fastest_checked(times, sp.checks, sp.fixed)


def apply(profile: StreamProfile, sp: StepPrecision | None, gpu: Any = None
          ) -> tuple[StreamProfile, dict[str, dict[str, float]], dict[str, str]]:
    """``profile`` with the step's seconds per batch on each device in the precision chosen there.

    Returns
    -------
    (StreamProfile, times, chosen)
        A copy of the profile (``profile`` itself when nothing changes), device → precision →
        seconds (:func:`step_times`), and device → the precision chosen.
    """
    if sp is None or not sp.precisions:
        return profile, {}, {}
    times = step_times(profile, sp, gpu)
    chosen = {d: choose(t, sp) for d, t in times.items()}
    if all(v == "fp32" for v in chosen.values()):
        return profile, times, chosen
    out = profile.model_copy(deep=True)
    st = out.stage(sp.step)
    for d, prec in chosen.items():
        st.seconds[d] = times[d][prec]
    out.consumer_samples_per_s = {d: out.samples_per_batch / s for d, s in st.seconds.items() if s > 0}
    return out, times, chosen


def annotate(plan: StreamPlan, sp: StepPrecision | None, times: dict[str, dict[str, float]],
             chosen: dict[str, str]) -> StreamPlan:
    """Record the step's precision in ``plan`` (``precision``, ``precision_s``, ``precision_checks``) and
    say why: the times in both precisions and the measured difference, or why a lower one was not chosen."""
    if sp is None or not times:
        return plan
    dev = plan.placement.get(sp.step, "cpu")
    prec = chosen.get(dev, "fp32")
    plan.precision_s = times
    plan.precision_checks = [c.model_dump() for c in sp.checks.values()]
    if prec != "fp32":
        plan.precision = {sp.step: prec}
    here = times.get(dev, {})
    parts = []
    if prec != "fp32":
        how = "fixed by --precision" if sp.fixed == prec else (sp.checks[prec].words() if prec in sp.checks else "")
        parts.append(f"step {sp.step!r} in {prec} on {dev}: {_ms(here[prec])} per batch against "
                     f"{_ms(here['fp32'])} in fp32 ({here['fp32'] / here[prec]:.1f}x)"
                     + (f"; {how}" if how else "") + f"; the stream is then bound by {plan.bottleneck or '?'}")
    for p, t in here.items():
        if p in ("fp32", prec):
            continue
        c = sp.checks.get(p)
        if c is not None and not c.ok:
            parts.append(f"{p} not chosen for the step: {c.words()}")
        else:
            parts.append(f"{p} not chosen for the step: {_ms(t)} per batch against {_ms(here['fp32'])} in fp32 "
                         f"on {dev}")
    for text in parts:
        if text not in plan.reasons:
            plan.reasons.append(text)
    return plan


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"
