"""A stage's predicted time in each precision it may run in, and the one to plan with.

May import: placer.costmodel.fit, placer.data. Never torch.

A stage's fp32 time comes from the cost model as always. Each lower precision scales it:

- on a **described GPU** (the roofline): the roofline's time in that precision for the stage's
  counted work at each counted size, fitted over size like the fp32 one, which prices the
  tensor-core part (``Work.tensor_flops``) at the precision's peak and the rest at fp32's; in
  bf16 and fp16 the bytes moved, kernels launched and host dispatches are those counted under
  autocast when the accuracy check counted them (:func:`under`: the ratios to fp32's counts at the
  check's size, applied at every size), else fp32's with the tensor-core ops' bytes halved;
- on the **CPU**: ``bf16`` and ``fp16`` by the ratio measured here when the precision's accuracy
  was checked (:mod:`placer.profile.precision`: autocast on this CPU is real); ``tf32`` changes
  nothing (a CPU has no TF32), so it is never chosen there;
- on a measured accelerator: not predicted (fp32 only) until it is measured there.

A lower precision is chosen for a (stage, device) only when its accuracy check passed (its
difference from fp32 within the stage's tolerance) and it is predicted faster than fp32 by
more than :data:`PRECISION_GAIN`; a precision the user fixed (``--precision train=bf16``) is taken
as it is. Because a stage's precision changes only its own time, choosing the fastest
allowed precision per (stage, device) before the search over devices gives the best
(device, precision) for every stage together.
"""

from __future__ import annotations

from typing import Any

from placer.costmodel.fit import fit_size_model
from placer.data.measures import PrecisionCheck

#: a lower precision must be predicted faster than fp32 by more than this share to be chosen: a prediction's
#: gain below it is not worth the numerics' change
PRECISION_GAIN = 0.05


def checks(model: Any, stage: str) -> dict[str, PrecisionCheck]:
    """The stage's accuracy checks by precision (empty when no lower precision was allowed)."""
    sp = model.profile.stages.get(stage)
    return {c.precision: c for c in getattr(sp, "precision_checks", [])} if sp is not None else {}


def ratio(model: Any, stage: str, device: str, precision: str, size: float | None = None) -> float | None:
    """Seconds in ``precision`` over seconds in fp32 for ``stage`` on ``device`` at ``size`` (default:
    the largest counted size; None: not predicted)."""
    if precision == "fp32":
        return 1.0
    if device in model.described:
        sp = model.profile.stages[stage]
        if not sp.work:
            return None
        at = size if size is not None else max(w.size for w in sp.work)
        base, low = roofline_at(model, stage, device, at, "fp32"), roofline_at(model, stage, device, at, precision)
        return low / base if base > 0 else None
    if device == "cpu":
        if precision == "tf32":
            return 1.0
        c = checks(model, stage).get(precision)
        if c is not None and c.seconds and c.fp32_seconds:
            return c.seconds / c.fp32_seconds
    return None


def under(model: Any, stage: str, precision: str | None, work: Any, host_s: float, size: float | None = None
          ) -> tuple[Any, float]:
    """``work`` (counted in fp32) and its host seconds as ``stage`` runs in ``precision`` on a GPU.

    For ``bf16`` and ``fp16`` with a check that counted the stage under autocast
    (:attr:`~placer.data.measures.PrecisionCheck.bytes_ratio` and the others): bytes moved, kernels
    launched and the host's dispatch time scale by the counted ratios, and ``tensor_bytes`` is 0
    (the counted bytes already have the products' two-byte elements, so the roofline must not
    halve them again). Counted at two sizes (:attr:`~placer.data.measures.PrecisionCheck.counted`),
    the difference autocast makes to each is read at ``size`` off the line through them (a
    weight's casts are fixed, an activation's halving grows with the size); counted at one, the
    ratios apply at every size. Otherwise (fp32, tf32, nothing counted) as it is: the roofline then halves
    the tensor-core ops' bytes only (:meth:`placer.costmodel.roofline.DeviceDescription.predict`).
    """
    if precision not in ("bf16", "fp16"):
        return work, host_s
    c = checks(model, stage).get(precision)
    if c is None or not c.bytes_ratio:
        return work, host_s
    sizes = {e["size"] for e in c.counted}
    if len(sizes) >= 2 and size is not None:  # the difference autocast makes, a line over size
        d_bytes, d_ops, d_calls = (_line(c.counted, f"low_{k}", k, size) for k in ("bytes", "ops", "calls"))
        calls = work.calls or work.ops
        upd = {"bytes": max(work.bytes + d_bytes, 0.25 * work.bytes), "tensor_bytes": 0.0,
               "ops": max(1, round(work.ops + d_ops))}
        return work.model_copy(update=upd), host_s * (max(calls + d_calls, 1.0) / calls if calls else 1.0)
    upd: dict[str, Any] = {"bytes": work.bytes * c.bytes_ratio, "tensor_bytes": 0.0}
    if c.ops_ratio:
        upd["ops"] = max(1, round(work.ops * c.ops_ratio))
    return work.model_copy(update=upd), host_s * (c.calls_ratio or 1.0)


def _line(counted: list[dict[str, float]], low: str, base: str, size: float) -> float:
    """The difference ``low - base`` read at ``size`` off the line through the counted sizes (the two
    extreme sizes)."""
    pts = sorted(counted, key=lambda e: e["size"])
    a, b = pts[0], pts[-1]
    da, db = a[low] - a[base], b[low] - b[base]
    return da + (db - da) * (size - a["size"]) / (b["size"] - a["size"])


def roofline_at(model: Any, stage: str, device: str, size: float, precision: str) -> float:
    """The roofline's seconds for ``stage`` on the described ``device`` in ``precision``: its time at
    each counted size (host time included), fitted over size and read at ``size``."""
    pts = model.described_points(stage, model.described[device], precision=precision)
    return float(max(fit_size_model(*zip(*pts))(size), 0.0))


def seconds(model: Any, stage: str, device: str, size: float, precisions: list[str] | None = None) -> dict[str, float]:
    """Predicted seconds per precision (fp32 and each checked, or each of ``precisions``) where predicted."""
    base = model.predict(stage, device, size).value
    out = {"fp32": base}
    for p in precisions if precisions is not None else list(checks(model, stage)):
        r = ratio(model, stage, device, p, size)
        if r is not None:
            out[p] = base * r
    return out


def choose(model: Any, stage: str, device: str, times: dict[str, float], fixed: str | None = None) -> str:
    """The precision to plan ``stage`` on ``device`` with: ``fixed`` when given, else the fastest whose
    accuracy check passed and that beats fp32 by more than :data:`PRECISION_GAIN`, else fp32
    (:func:`fastest_checked`)."""
    return fastest_checked(times, checks(model, stage), fixed)


def fastest_checked(times: dict[str, float], checked: dict[str, Any], fixed: str | None = None) -> str:
    """The one rule that picks a precision: ``fixed`` when given (fp32 where it has no time), else the fastest
    of ``times`` whose accuracy check (``checked[p].ok``) passed and that beats fp32 by more than
    :data:`PRECISION_GAIN`, else fp32."""
    if fixed is not None:
        return fixed if fixed in times else "fp32"
    best = "fp32"
    for p, t in times.items():
        c = checked.get(p)
        if p != "fp32" and c is not None and c.ok and t < times["fp32"] * (1 - PRECISION_GAIN) and t < times[best]:
            best = p
    return best
