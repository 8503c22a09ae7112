"""The drop-in's step in a lower precision: ``advise_loader(..., precision=...)``.

May import: placer.data, placer.errors, placer.precision, placer.profile.precision, placer.costmodel.counts,
placer.stream.{precision,target,target_loader}; torch inside functions.

A plain script's train step (``step(batch)``) is one opaque call that trains the script's
model in place, so its accuracy in a lower precision can be checked only where the model
(and optimizer) can be put back between runs: with ``state=`` (objects with ``state_dict`` and
``load_state_dict``: the model, the optimizer), :func:`check_script_step` runs the step over the
batches kept from the measured runs in fp32, puts the state back, runs them again in each
allowed precision (CPU autocast with CUDA's fp32 list, emulated where this CPU has no native
bf16 products; TF32 emulated: :func:`placer.profile.precision.as_on_gpu`), puts the state back
again, and compares what the step returned (its loss) batch by batch by the one accuracy check of
every stage and stream step (:func:`placer.profile.precision.measured_check`). Without ``state``
(or when the step returns nothing) the difference is not measured and no lower precision is
chosen: the advice says what to pass.

For a described target (``target=``) the step's work is counted in fp32 and under autocast,
the step predicted on the target's GPU in each precision (:func:`placer.stream.precision.step_times`),
and the loader and step planned for the target with the precision chosen
(:func:`placer.stream.target.plan_for_target`): a faster step needs more DataLoader workers, and the
plan's settings say how many. :func:`sentence` says it in one line: "bf16 autocast: step predicted
6.2x faster on NVIDIA H200 (4.1 ms against 25 ms per batch); loss differs by 0.31% (tolerance 1.00%);
then what the target would be bound by, with the DataLoader workers that keep up".
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from typing import Any

from placer.data.measures import PrecisionCheck
from placer.errors import PlacerError
from placer.stream.precision import StepPrecision

def script_precisions(precision: str | Iterable[str] | None) -> tuple[str, ...]:
    """``precision=`` as lower precisions: ``"auto"`` (tf32 and bf16), a name, or several; fp32 dropped."""
    from placer.precision import AUTO, check_allowed

    if precision is None:
        return ()
    if isinstance(precision, str) and precision.strip().lower() == "auto":
        return AUTO  # fp16 needs the script's own GradScaler
    try:
        return check_allowed(precision) or ()
    except Exception as exc:  # noqa: BLE001 - a PipelineError names no stage here
        raise PlacerError(f"advise_loader: precision={precision!r}: {exc}") from None


def check_script_step(step: Callable[[Any], Any], kept: list, precisions: tuple[str, ...], *, state: Any = None,
               tolerance: float | None = None) -> StepPrecision:
    """The step's loss over the kept batches in each precision against fp32's (see the module).

    Returns a :class:`~placer.stream.precision.StepPrecision` whose checks hold a measured difference
    where one could be measured; where not (no ``state``, or the step returns nothing), the check's
    difference is marked unmeasurable and its method says why, so it is never chosen.
    """
    from placer.precision import DEFAULT_TOLERANCE
    from placer.profile.precision import UNMEASURABLE, emulating, measured_check, seeded

    tol = tolerance or DEFAULT_TOLERANCE
    objs = [] if state is None else (list(state) if isinstance(state, (list, tuple)) else [state])
    for o in objs:
        if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict")):
            raise PlacerError(f"advise_loader: state={type(o).__name__} has no state_dict/load_state_dict; pass the "
                              "model and optimizer the step trains")
    out = StepPrecision(step="step")
    if not objs:
        for p in precisions:
            out.checks[p] = PrecisionCheck(precision=p, metric="loss", rel_error=UNMEASURABLE, tolerance=tol,
                                           method="not measured: pass state=(model, optimizer) so the step can "
                                                  "be run again from the same weights")
        return out
    saved = [copy.deepcopy(o.state_dict()) for o in objs]

    def run(fn: Callable[[Any], Any]) -> tuple[list, float]:
        for o, s in zip(objs, saved):
            o.load_state_dict(copy.deepcopy(s))
        with seeded():
            t0 = time.perf_counter()
            got = [_detached(fn(b)) for b in kept]
            return got, time.perf_counter() - t0

    try:
        base, base_s = run(step)
        for p in precisions:
            got, secs = run(emulating(step, p))
            if all(g is None for g in base):
                c = PrecisionCheck(precision=p, metric="loss", rel_error=UNMEASURABLE, tolerance=tol,
                                   method="not measured: the step returns nothing; return the loss from it")
            else:
                c = measured_check(p, {"loss": base}, {"loss": got}, tol, secs, base_s, len(kept))
            out.checks[p] = c
    finally:
        for o, s in zip(objs, saved):
            o.load_state_dict(s)
    return out


def _detached(x: Any) -> Any:
    if hasattr(x, "detach"):
        return x.detach().float().cpu().clone()
    return x


def count_script_step(step: Callable[[Any], Any], batch: Any, precisions: tuple[str, ...], *,
                      state: Any = None) -> dict:
    """The step's work on ``batch`` counted in fp32 and under autocast in each of ``precisions`` (bf16, fp16),
    the state put back after each count when given."""
    from placer.costmodel.counts import count_work
    from placer.profile.precision import as_on_gpu

    objs = [] if state is None else (list(state) if isinstance(state, (list, tuple)) else [state])
    saved = [copy.deepcopy(o.state_dict()) for o in objs]
    out = {}
    try:
        for p in ("fp32", *[q for q in precisions if q in ("bf16", "fp16")]):
            for o, s in zip(objs, saved):
                o.load_state_dict(copy.deepcopy(s))
            with as_on_gpu(p):
                out[p] = count_work(lambda: step(batch), repeats=1)[1]
    finally:
        for o, s in zip(objs, saved):
            o.load_state_dict(s)
    return out


def plan_script_for_target(loader: Any, step: Callable[[Any], Any], kept: list, target: Any, sp: StepPrecision, *,
                    step_on_cpu: bool = True, state: Any = None) -> Any:
    """The loader and step planned for ``target`` with the step's precisions (a StreamPlan)."""
    from placer.stream.target import plan_for_target as plan
    from placer.stream.target_loader import STEP, loader_profile

    prof, work = loader_profile(loader, step, kept, step_on_cpu=step_on_cpu)
    sp.step = STEP
    if step_on_cpu and kept:
        sp.work = count_script_step(step, kept[-1], tuple(sp.checks), state=state)
    out = plan(prof, target, work, step_precision=sp)
    return out


def sentence(plan: Any, sp: StepPrecision) -> str | None:
    """One line on the step's precision for the target: chosen (both numbers, the difference, what then
    binds) or why not; None without per-precision times."""
    gpu = plan.placement.get(sp.step)
    times = (plan.precision_s or {}).get(gpu or "", {})
    if not times:
        return None
    label = plan.target or "the target"
    chosen = plan.precision.get(sp.step)
    if chosen:
        c = sp.checks.get(chosen)
        how = "autocast" if chosen in ("bf16", "fp16") else "matrix products"
        return (f"{chosen} {how}: step predicted {times['fp32'] / times[chosen]:.1f}x faster on {label} "
                f"({times[chosen] * 1e3:.3g} ms against {times['fp32'] * 1e3:.3g} ms per batch)"
                + (f"; {c.words()}" if c is not None else "")
                + (f"; then {plan.target_sentence}" if plan.target_sentence else ""))
    best = min((p for p in times if p != "fp32"), key=lambda p: times[p], default=None)
    if best is None:
        return None
    c = sp.checks.get(best)
    why = c.method if c is not None and c.rel_error >= 1e6 else (c.words() if c is not None else "not checked")
    return (f"{best} not chosen for the step: predicted {times['fp32'] / times[best]:.1f}x faster on {label}, "
            f"but {why}")


def advise_precision(advice: Any, loader: Any, step: Callable[[Any], Any], kept: list, precision: Any, state: Any,
                     target: Any, dev: Any) -> None:
    """The hook of :func:`placer.stream.dropin.advise_loader`: check the step's precisions, plan the target with
    them (``advice.target``), and add the sentence to ``advice.notes``."""
    precs = script_precisions(precision)
    if not precs or not kept:
        return
    sp = check_script_step(step, kept, precs, state=state)
    for c in sp.checks.values():
        advice.notes.append(f"step in {c.precision}: {c.words() if c.rel_error < 1e6 else c.method}")
    if target is None:
        return
    advice.target = plan_script_for_target(loader, step, kept, target, sp, step_on_cpu=dev.kind == "cpu", state=state)
    line = sentence(advice.target, sp)
    if line:
        advice.notes.append(line)
