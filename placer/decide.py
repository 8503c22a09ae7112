"""Measure where the uncertainty decides: a tie that only a stage time's spread makes is profiled again.

May import: placer.site (costs from a profile), placer.data.profile. The site measures; nothing here
runs a stage itself.

A plan's tie with ``fits_disagree`` (the placements' intervals overlap only because fit forms that
match the measurements as well disagree at the planned size) names the stages that decide it. When
the budget allows, the pipeline is profiled at a size nearer the planned one (the planned size when
its predicted time here fits what is left of the budget, else the geometric middle between the
largest measured size and it), the new points join the profile, and the plan is made again from
the refitted model. Only then, if still tied, does the tie rule decide.
"""

from __future__ import annotations

import math
from typing import Any

#: a size is profiled again only when its predicted time here, this many times over, fits what is
#: left of the budget: profiling one size runs each stage warm-up and repeats on every device, once
#: more on one thread (to scale it to a target's CPU) and once to count its work, so one size costs
#: about twenty runs of the pipeline at that size
SIZE_COST_TIMES = 20


def deciding_stages(*plans: Any) -> set[str]:
    """Stages placed differently in a tie that only the stage times' spread makes (a Plan, or a
    target's report data with ``ties`` as mappings)."""
    out: set[str] = set()
    for p in plans:
        ties = (p.get("ties") or []) if isinstance(p, dict) else getattr(p, "ties", []) if p is not None else []
        for t in ties:
            t = t if isinstance(t, dict) else t.model_dump()
            if t.get("fits_disagree"):
                out.update(t.get("differs", {}))
    return out


def merge(profile: Any, more: Any) -> list[int]:
    """Add ``more``'s points (and counted work) at sizes ``profile`` lacks; return the sizes added."""
    added: set[int] = set()
    for name, sp in more.stages.items():
        mine = profile.stages.get(name)
        if mine is None:
            continue
        for dev, dp in sp.devices.items():
            have = mine.devices.get(dev)
            if have is None:
                continue
            sizes = {p.size for p in have.points}
            new = [p for p in dp.points if p.size not in sizes]
            have.points = sorted([*have.points, *new], key=lambda p: p.size)
            added.update(p.size for p in new)
        counted = {w.size for w in mine.work}
        mine.work = sorted([*mine.work, *(w for w in sp.work if w.size not in counted)], key=lambda w: w.size)
    profile.measured_sizes = sorted({*profile.measured_sizes, *added})
    return sorted(added)


def next_size(measured: list[int], size: float, predicted_s: float, left_s: float) -> int | None:
    """The size to measure for a decision at ``size``: ``size`` itself when ``predicted_s`` (its time here)
    fits ``left_s`` :data:`SIZE_COST_TIMES` times over, else the geometric middle between the largest measured
    size and it; None when that is already measured or nothing fits."""
    top = max(measured, default=0)
    if not measured or size <= top:
        return None
    if predicted_s * SIZE_COST_TIMES <= left_s:
        return int(size)
    mid = int(round(math.sqrt(top * size)))
    scale = mid / size  # times grow at most in proportion to the size above the measured ones
    if mid <= top or predicted_s * scale * SIZE_COST_TIMES > left_s:
        return None
    return mid


def remeasure(site: Any, pipeline: Any, costs: Any, *, size: float, budget_s: float | None,
              plans: list[Any], target: str | None) -> tuple[Any, dict[str, str]]:
    """Profile again where a tie is made only by the spread, and return ``(costs, stage -> what was
    measured for it)``; ``costs`` is unchanged (and the mapping empty) when nothing was measured."""
    from placer.site import costs_from_profile

    stages = deciding_stages(*plans)
    if not stages or not size:
        return costs, {}
    prof = costs.profile
    spent = float(prof.elapsed_s or 0.0)
    left = (budget_s - spent) if budget_s is not None else math.inf
    table = costs.table(size)
    here = sum(min(s for s in st.seconds.values() if s is not None) for st in table.stages)
    at = next_size(list(prof.measured_sizes), size, here, left)
    if at is None:
        why = (f"not measured again: the planned {size:,.0f} {prof.size_unit} is within the measured sizes"
               if size <= max(prof.measured_sizes, default=0) else
               f"not measured again: a size nearer {size:,.0f} {prof.size_unit} would not fit the budget")
        return costs, {n: why for n in stages}
    more = site.measure(pipeline, size=at, sizes=[at], budget_s=max(left, 1.0))
    added = merge(prof, more)
    if not added:
        return costs, {}
    inv = costs.inventory if getattr(costs, "inventory", None) is not None else None
    again = costs_from_profile(prof, size=int(size), describe=target, inventory=inv)
    for model in {id(m): m for m in (again.model, again.target_model)}.values():
        model.fixed_precision = dict(getattr(costs.model, "fixed_precision", {}) or {})
    sizes = ", ".join(f"{n:,}" for n in added)
    return again, {n: f"the fit forms disagreed at {size:,.0f} {prof.size_unit}, so it was measured again at "
                      f"{sizes} {prof.size_unit} before deciding" for n in stages}


def note(plan: Any, said: dict[str, str]) -> None:
    """Add what was measured for each deciding stage to its reason in ``plan``."""
    for st in plan.stages:
        if st.name in said:
            st.reason += f"; {said[st.name]}"
