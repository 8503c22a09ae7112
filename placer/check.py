"""A CI gate: is the saved placement still the best, and did any stage get slower?

May import: json, pathlib, pydantic, placer.{data,errors,files,loader,site,warnings,log}; torch,
dask and numba only through the site (its profiler and executor).

``placer check PIPELINE --baseline DIR`` re-profiles the pipeline here (without the
profile cache: every stage is measured again), plans it and runs the plan, then
compares with the baseline saved in ``DIR`` (by ``placer check --update``, or by
``placer advise --save DIR``):

- **placement**: the new plan puts a stage on another device than the saved plan;
- **speed**: a stage on its planned device is slower than its saved measurement,
  at the largest size both profiles measured, by more than the allowed ratio

  ``allowed = 1 + max(noise_k × noise, tolerance)``

  where ``noise`` is the larger of the two measurements' IQR/median (the spread of
  their repeats) and ``tolerance`` the floor (default 50%: this is for catching 2×
  regressions on shared, noisy CI machines, not 5% ones). Stages whose both times are
  under ``min_seconds`` are never called slower (timer and scheduler noise dominate).

Either fails the check, once confirmed: when the first comparison finds a
regression, the pipeline is profiled (and planned) a second time, and only what both
comparisons find counts (for each slower stage the milder of its two ratios), so one
burst of load on a shared machine does not fail a build. Faster stages and a changed
outputs digest are reported but do not fail it (update the baseline to keep the new
numbers).

Examples
--------
>>> from placer.data.profile import DeviceProfile, Point, Profile, StageProfile
>>> def prof(seconds):
...     pt = Point(size=100, median_s=seconds, iqr_s=seconds * 0.05, reps=5, raw_times=[seconds] * 5)
...     sp = StageProfile(name="train", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=[pt])})
...     return Profile(pipeline="demo", fingerprint="f", stages={"train": sp}, measured_sizes=[100])
>>> res = compare(prof(0.2), {"train": "cpu"}, prof(0.6), {"train": "cpu"})
>>> res.passed, res.stages[0].verdict, round(res.stages[0].ratio, 1)
(False, 'slower', 3.0)
>>> compare(prof(0.2), {"train": "cpu"}, prof(0.25), {"train": "cpu"}).passed
True
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from placer.data.profile import Profile
from placer.errors import PlacerError
from placer.log import get_logger
from placer.warnings import CheckWarning

#: the smallest slow-down ratio ever called a regression (50%)
TOLERANCE = 0.5
#: how many times the measured noise (IQR/median) a slow-down must exceed
NOISE_K = 3.0
#: stages faster than this on both sides are never called slower
MIN_SECONDS = 1e-3
#: the file ``--update`` writes beside profile.json, plan.json and run.json
SETTINGS = "check.json"
#: default profiling budget of a check (seconds)
BUDGET_S = 30.0

log = get_logger(__name__)


class BaselineError(PlacerError):
    """The baseline folder is missing, incomplete or unreadable."""


class StageChange(BaseModel):
    """One stage on its planned device: the saved and the new measurement, and the verdict."""

    stage: str
    device: str
    size: int
    baseline_s: float
    baseline_iqr_s: float
    current_s: float
    current_iqr_s: float
    #: current over baseline seconds
    ratio: float
    #: the ratio above which the stage counts as slower
    allowed_ratio: float
    verdict: Literal["slower", "faster", "same"]


class PlacementChange(BaseModel):
    stage: str
    baseline: str | None
    current: str | None


class CheckResult(BaseModel):
    """What ``placer check`` found; ``passed`` is its exit status (0 when True)."""

    pipeline: str
    size: int | float | None = None
    passed: bool
    placement_changes: list[PlacementChange] = Field(default_factory=list)
    stages: list[StageChange] = Field(default_factory=list)
    #: stages the comparison could not cover (no common measurement), with why
    uncovered: list[str] = Field(default_factory=list)
    #: no stage of the baseline could be compared (the check fails rather than pass blind)
    blind: bool = False
    baseline_makespan_s: float | None = None
    current_makespan_s: float | None = None
    baseline_digest: str | None = None
    current_digest: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)

    @property
    def slower(self) -> list[StageChange]:
        return [s for s in self.stages if s.verdict == "slower"]

    def lines(self) -> list[str]:
        """The readable diff: one line per finding, the verdict last."""
        out = [f"placement changed: stage {c.stage!r} {c.baseline} -> {c.current}" for c in self.placement_changes]
        for s in self.stages:
            if s.verdict == "same":
                continue
            out.append(f"{s.verdict}: stage {s.stage!r} on {s.device} at size {s.size}: {_s(s.baseline_s)} -> "
                       f"{_s(s.current_s)} ({s.ratio:.2f}x; allowed up to {s.allowed_ratio:.2f}x)")
        same = [s.stage for s in self.stages if s.verdict == "same"]
        if same:
            out.append(f"within tolerance: {', '.join(same)}")
        out += [f"not compared: {u}" for u in self.uncovered]
        if self.baseline_makespan_s and self.current_makespan_s:
            out.append(f"makespan of the plan: {_s(self.baseline_makespan_s)} -> {_s(self.current_makespan_s)} "
                       f"(one run each: shown, not checked)")
        if self.baseline_digest and self.current_digest and self.baseline_digest != self.current_digest:
            out.append(f"outputs digest changed: {self.baseline_digest} -> {self.current_digest} (not checked)")
        problems = len(self.placement_changes) + len(self.slower)
        out.append("check passed" if self.passed else
                   f"check failed: {problems} regression{'s' if problems != 1 else ''}; if intended, update the "
                   "baseline with --update")
        return out


def _s(v: float) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"


def _points(prof: Profile, stage: str, device: str) -> dict[int, Any]:
    sp = prof.stages.get(stage)
    dp = sp.devices.get(device) if sp else None
    return {p.size: p for p in (dp.points if dp else []) if p.median_s > 0}


def compare_stage(stage: str, device: str, baseline: Profile, current: Profile, *, tolerance: float = TOLERANCE,
                  noise_k: float = NOISE_K, min_seconds: float = MIN_SECONDS) -> StageChange | str:
    """The verdict on one stage on one device, at the largest size both profiles measured.

    Returns
    -------
    StageChange or str
        The comparison, or why there is none (a sentence for the report).
    """
    old, new = _points(baseline, stage, device), _points(current, stage, device)
    common = sorted(set(old) & set(new))
    if not common:
        if not old:
            return f"stage {stage!r} on {device}: the baseline has no measurement"
        return f"stage {stage!r} on {device}: no size measured in both profiles"
    size = common[-1]
    a, b = old[size], new[size]
    noise = max(a.iqr_s / a.median_s, b.iqr_s / b.median_s)
    allowed = 1.0 + max(noise_k * noise, tolerance)
    ratio = b.median_s / a.median_s
    tiny = max(a.median_s, b.median_s) < min_seconds
    verdict = ("slower" if ratio > allowed and not tiny else
               "faster" if ratio < 1.0 / allowed and not tiny else "same")
    return StageChange(stage=stage, device=device, size=size, baseline_s=a.median_s, baseline_iqr_s=a.iqr_s,
                       current_s=b.median_s, current_iqr_s=b.iqr_s, ratio=ratio, allowed_ratio=allowed,
                       verdict=verdict)


def compare(baseline: Profile, baseline_placement: dict[str, str], current: Profile,
            current_placement: dict[str, str], *, tolerance: float = TOLERANCE, noise_k: float = NOISE_K,
            min_seconds: float = MIN_SECONDS) -> CheckResult:
    """Compare a fresh profile and plan with the saved ones.

    Parameters
    ----------
    baseline, current : Profile
        The saved and the fresh measurements.
    baseline_placement, current_placement : dict of str to str
        Stage → device of the saved and of the fresh plan.
    tolerance : float
        The smallest slow-down counted (0.5: 50% slower).
    noise_k : float
        A slow-down must also exceed ``noise_k`` times the measurements' IQR/median.
    min_seconds : float
        Stages under this on both sides are never called slower or faster.

    Returns
    -------
    CheckResult
        ``passed`` is False when the placement changed or a stage got slower.
    """
    moved = [PlacementChange(stage=n, baseline=baseline_placement.get(n), current=current_placement.get(n))
             for n in dict.fromkeys([*baseline_placement, *current_placement])
             if baseline_placement.get(n) != current_placement.get(n)]
    stages, uncovered = [], []
    for n, device in baseline_placement.items():
        if n not in current.stages:
            uncovered.append(f"stage {n!r} is no longer in the pipeline")
            continue
        got = compare_stage(n, device, baseline, current, tolerance=tolerance, noise_k=noise_k,
                            min_seconds=min_seconds)
        (stages if isinstance(got, StageChange) else uncovered).append(got)
    uncovered += [f"stage {n!r} is new (not in the baseline)" for n in current.stages if n not in baseline_placement]
    blind = bool(baseline_placement) and not stages
    if blind:
        uncovered.append("no stage of the baseline could be compared: the check fails (update the baseline)")
    passed = not moved and not any(s.verdict == "slower" for s in stages) and not blind
    return CheckResult(pipeline=current.pipeline, passed=passed, placement_changes=moved, stages=stages,
                       uncovered=uncovered, blind=blind, settings={"tolerance": tolerance, "noise_k": noise_k,
                                                      "min_seconds": min_seconds})


# -- the baseline folder ---------------------------------------------------------------------------
def load_baseline(folder: str | Path) -> tuple[Profile, Any, Any, dict[str, Any]]:
    """``(profile, plan, run, settings)`` saved in ``folder`` (run None and settings {} when absent).

    Raises
    ------
    BaselineError
        The folder or its profile.json / plan.json is missing or unreadable.
    """
    from placer.data.plan import Plan
    from placer.data.run import Run

    folder = Path(folder)
    if not folder.is_dir():
        raise BaselineError(f"baseline folder {str(folder)!r} does not exist; write it with "
                            f"`placer check PIPELINE --baseline {folder} --update`")
    for name in ("profile.json", "plan.json"):
        if not (folder / name).is_file():
            raise BaselineError(f"baseline {str(folder)!r} has no {name}; write it with --update "
                                "(or `placer advise --save`)")
    prof = Profile.load(folder / "profile.json")
    try:
        plan = Plan.model_validate_json((folder / "plan.json").read_text())
        run = Run.model_validate_json((folder / "run.json").read_text()) if (folder / "run.json").is_file() else None
        settings = json.loads((folder / SETTINGS).read_text()) if (folder / SETTINGS).is_file() else {}
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline {str(folder)!r}: {str(exc).splitlines()[0]}") from None
    return prof, plan, run, settings


def save_baseline(folder: str | Path, costs: Any, plan: Any, run: Any, settings: dict[str, Any]) -> list[Path]:
    """Write profile.json (as ``placer profile -o`` does), plan.json, run.json and check.json in ``folder``."""
    from placer.data.documents import profile_document
    from placer.files import write_text_atomic

    folder = Path(folder)
    doc = profile_document(costs.profile, costs.model, costs.size)
    return [write_text_atomic(folder / "profile.json", json.dumps(doc, indent=1, default=str)),
            write_text_atomic(folder / "plan.json", plan.model_dump_json(indent=1)),
            write_text_atomic(folder / "run.json", run.model_dump_json(indent=1)),
            write_text_atomic(folder / SETTINGS, json.dumps(settings, indent=1, default=str))]


def measure_now(pipeline: str, *, size: int | None, budget_s: float, sizes: list[int] | None = None,
                objective: str = "makespan", run: bool = True):
    """Profile ``pipeline`` here without the cache (at ``sizes`` when given), plan it and run the plan.

    Returns ``(costs, plan, run)`` (``run`` None when ``run=False``).
    """
    from placer.loader import load_pipeline
    from placer.site import LocalSite

    site = LocalSite(cache=False)
    p = load_pipeline(pipeline, size)
    if p.streams():
        raise PlacerError(f"pipeline {p.name!r} has streams; placer check covers one-shot pipelines for now")
    log.info("check: profiling %s afresh (budget %g s)", p.name, budget_s)
    costs = site.costs(pipeline, size=size, budget_s=budget_s, **({"sizes": sizes} if sizes else {}))
    plan = costs.plan(objective=objective, size=size or p.size or costs.size)
    if not run:
        return costs, plan, None
    log.info("check: running the plan %s", plan.placement)
    return costs, plan, site.execute(p, plan.placement, warmup=True)


def confirmed(first: CheckResult, second: CheckResult) -> CheckResult:
    """A regression only where both comparisons found it: each stage's milder verdict, each change in both.

    A busy machine can slow one profile down; a real regression shows in two.
    """
    again = {(s.stage, s.device): s for s in second.stages}
    stages = [min((s, again.get((s.stage, s.device), s)), key=lambda c: c.ratio) if s.verdict == "slower" else s
              for s in first.stages]
    both = {c.stage for c in second.placement_changes}
    moved = [c for c in first.placement_changes if c.stage in both]
    passed = not moved and not any(s.verdict == "slower" for s in stages) and not first.blind
    return first.model_copy(update={"stages": stages, "placement_changes": moved, "passed": passed})


def check(pipeline: str, baseline: str | Path, *, size: int | None = None, budget_s: float | None = None,
          update: bool = False, tolerance: float = TOLERANCE, noise_k: float = NOISE_K,
          min_seconds: float = MIN_SECONDS) -> CheckResult:
    """Re-profile, re-plan and run ``pipeline``; compare with (or with ``update``, write) the baseline.

    Parameters
    ----------
    pipeline : str
        A pipeline file or ``module:function``.
    baseline : path
        The baseline folder.
    size, budget_s : optional
        Size and profiling budget (default: the baseline's, else the pipeline's size
        and :data:`BUDGET_S`).
    update : bool
        Write the fresh measurements as the new baseline instead of comparing.
    tolerance, noise_k, min_seconds
        See :func:`compare`.

    Returns
    -------
    CheckResult
        With ``update``: a passed result describing what was saved.
    """
    from placer.loader import current_build_params

    saved = None if update else load_baseline(baseline)
    settings = saved[3] if saved else {}
    if size is None and saved:
        size = settings["size"] if "size" in settings else saved[1].size
    size = int(size) if size is not None else None
    budget_s = budget_s if budget_s is not None else settings.get("budget_s") or BUDGET_S
    given = current_build_params()
    if saved and settings.get("params") and not given:
        from placer.loader import build_params

        with build_params(**settings["params"]):
            return check(pipeline, baseline, size=size, budget_s=budget_s, tolerance=tolerance, noise_k=noise_k,
                         min_seconds=min_seconds)
    if saved and settings.get("params", {}) != given and given:
        warnings.warn(f"checking with build parameters {given}, the baseline was saved with "
                      f"{settings.get('params', {})}", CheckWarning, stacklevel=2)
    # the baseline's sizes again, so that every stage has measurements to compare at
    costs, plan, run = measure_now(pipeline, size=size, budget_s=budget_s, sizes=saved[0].sizes if saved else None)
    now = {"size": size, "budget_s": budget_s, "params": given}
    if update:
        save_baseline(baseline, costs, plan, run, now)
        return CheckResult(pipeline=costs.profile.pipeline, size=size, passed=True, current_makespan_s=run.makespan_s,
                           current_digest=run.outputs_digest, settings=now)
    prof, old_plan, old_run, _ = saved
    options = {"tolerance": tolerance, "noise_k": noise_k, "min_seconds": min_seconds}
    res = compare(prof, dict(old_plan.placement), costs.profile, dict(plan.placement), **options)
    if not res.passed and (res.slower or res.placement_changes):
        log.info("check: %d stage(s) slower, %d moved: profiling again to confirm", len(res.slower),
                 len(res.placement_changes))
        costs2, plan2, _ = measure_now(pipeline, size=size, budget_s=budget_s, sizes=prof.sizes, run=False)
        res = confirmed(res, compare(prof, dict(old_plan.placement), costs2.profile, dict(plan2.placement),
                                     **options))
    return res.model_copy(update={
        "size": size, "settings": {**res.settings, **now},
        "baseline_makespan_s": old_run.makespan_s if old_run else None, "current_makespan_s": run.makespan_s,
        "baseline_digest": old_run.outputs_digest if old_run else None, "current_digest": run.outputs_digest})
