"""Refusing a plan, runs, cost table and pipeline that do not belong together.

May import: placer.report.inputs, placer.devices (the registry's names: ``kind_for``,
``same_device``, ``valid_names``).

A report puts its inputs side by side, so they must describe one pipeline: the same
stages everywhere, the same pipeline name where it is known (a run and a live pipeline
know theirs, a plan when its ``pipeline`` is set; a cost table does not), and the run given as the
plan's run must have placed every stage where the plan does. Baseline runs (all on
the CPU, all on the GPU, the rule of thumb) place stages elsewhere on purpose: only
their pipeline and stages are compared.

Each saved file is also checked on its own, against the devices it names and the stages
it has: a plan or run whose placement names a device no registered kind knows
(``"tpu"``), a run record on such a device, or a run record of a stage the plan (else the
run's own placement) does not have, is refused naming the file and the field
(``the run 'run.json' (pipeline 'p'): field stages[1].device is 'tpu', ...``).

Examples
--------
>>> from placer.report.inputs import load_inputs
>>> run = {"pipeline": "p", "placement": {"a": "cpu"}, "executor": "inline", "workers": 1, "makespan_s": 1}
>>> plan = {"placement": {"a": "cpu", "b": "cpu"}, "predicted_makespan_s": 1, "objective_value": 1,
...         "schedule": {"makespan_s": 1, "stages": [], "transfers": []}}
>>> check(load_inputs(plan=plan, run=run))
Traceback (most recent call last):
...
placer.report.check.MismatchedInputsError: the plan and the run (pipeline 'p') do not belong together: different stages (only in the plan: b); give a plan, runs and cost table of one pipeline
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.devices import kind_for, same_device, valid_names
from placer.report.inputs import Inputs, ReportInputError

#: stage names listed in a message before "and N more"
SHOWN = 5
#: what every mismatch of pipeline or stages asks for
FIX = "give a plan, runs and cost table of one pipeline"
#: what every refused field asks for
FIX_FIELD = "fix the file, or make it again with placer"


class MismatchedInputsError(ReportInputError):
    """A report's inputs come from different pipelines, or a run is not the plan's run."""


@dataclass
class Part:
    """One input as the check sees it: how to name it, its stages, its pipeline's name."""

    #: ``the plan``, ``the all_cpu run``
    short: str
    #: with its file and pipeline when known: ``the run 'out/run.json' (pipeline 'etl')``
    title: str
    stages: frozenset[str]
    pipeline: str | None = None


def check(inputs: Inputs) -> None:
    """Raise :class:`MismatchedInputsError` (one line, naming the inputs and, for one file, the field)
    unless each names known devices and its own stages, and they belong together."""
    parts = _parts(inputs)
    named = [p for p in parts if p.pipeline is not None]
    for p in named[1:]:
        if p.pipeline != named[0].pipeline:
            raise _mismatch(named[0], p, f"different pipelines ({named[0].pipeline!r} and {p.pipeline!r})")
    for p in parts[1:]:
        if p.stages != parts[0].stages:
            raise _mismatch(parts[0], p, "different stages (" + stage_difference(parts[0], p) + ")")
    check_fields(inputs)
    if inputs.plan is not None and inputs.run is not None:
        moved = placement_difference(inputs.plan.placement, run_placement(inputs.run))
        if moved:
            raise _mismatch(parts[0], parts[1], moved,
                            "give the run of this plan as the run, and other runs as baselines")


def check_fields(inputs: Inputs) -> None:
    """Refuse a plan or run that names an unknown device, or a run record of a stage it should not have."""
    files = inputs.files
    plan = inputs.plan
    if plan is not None:
        title = _part("plan", files.get("plan"), (), plan.pipeline).title
        _devices_known(title, {f"placement.{n}": d for n, d in plan.placement.items()})
        _devices_known(title, {f"schedule.stages[{i}].device": e.device for i, e in enumerate(plan.schedule.stages)})
    runs = [("run", "run", inputs.run)] + [(f"baselines.{key}", f"{key} run", r) for key, r in inputs.baselines.items()]
    for key, what, run in runs:
        if run is None:
            continue
        title = _part(what, files.get(key), (), run.pipeline).title
        _devices_known(title, {f"placement.{n}": d for n, d in run.placement.items()})
        _devices_known(title, {f"stages[{i}].device": r.device for i, r in enumerate(run.stages)})
        if plan is not None:
            have, whose = set(plan.placement), _part("plan", files.get("plan"), ()).title
        else:
            have, whose = set(run.placement), "its placement"
        if not have:
            continue
        names = [(f"stages[{i}].name", r.name) for i, r in enumerate(run.stages)]
        names += [("failed_stage", run.failed_stage)] if run.failed_stage is not None else []
        for field, name in names:
            if name not in have:
                raise MismatchedInputsError(
                    f"{title}: field {field} names stage {name!r}, which {whose} does not have "
                    f"(it has {_listed(have)}); {FIX}")


def _devices_known(title: str, fields: dict[str, str]) -> None:
    """Refuse the first field whose device no registered kind knows, naming it."""
    for field, device in fields.items():
        if not isinstance(device, str) or kind_for(device) is None:
            raise MismatchedInputsError(f"{title}: field {field} is {device!r}, not a device placer knows "
                                        f"(use {valid_names()}); {FIX_FIELD}")


def _listed(names) -> str:
    names = sorted(names)
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _parts(inputs: Inputs) -> list[Part]:
    files = inputs.files
    out = []
    if inputs.plan is not None:
        out.append(_part("plan", files.get("plan"), inputs.plan.placement, inputs.plan.pipeline))
    runs = [("run", "run", inputs.run)] + [(f"baselines.{key}", f"{key} run", r) for key, r in inputs.baselines.items()]
    for key, what, run in runs:
        if run is not None:
            out.append(_part(what, files.get(key), run_placement(run), run.pipeline))
    if inputs.costs is not None:
        out.append(_part("cost table", files.get("costs"), [s.name for s in inputs.costs.stages]))
    p = inputs.pipeline
    if p is not None:
        out.append(Part("the pipeline", f"the pipeline {p.name!r}", frozenset(p.order()), p.name))
    return out


def _part(what: str, path: str | None, stages, pipeline: str | None = None) -> Part:
    title = f"the {what} {path!r}" if path is not None else f"the {what}"
    if pipeline is not None:
        title += f" (pipeline {pipeline!r})"
    return Part(f"the {what}", title, frozenset(stages), pipeline)


def run_placement(run) -> dict[str, str]:
    """Where a run placed each stage (its records' devices when its placement is empty)."""
    return dict(run.placement) or {s.name: s.device for s in run.stages}


def placement_difference(planned: dict[str, str], ran: dict[str, str]) -> str:
    """Where the run put stages the plan puts elsewhere, in words; empty when nowhere."""
    moved = [(n, ran[n], planned[n]) for n in planned if n in ran and not same_device(ran[n], planned[n])]
    if not moved:
        return ""
    name, there, here = moved[0]
    more = f" (and {len(moved) - 1} more stage{'s' * (len(moved) > 2)})" if len(moved) > 1 else ""
    return f"the run placed stage {name!r} on {there} where the plan places it on {here}{more}"


def stage_difference(a: Part, b: Part) -> str:
    """``only in the plan: x, y; only in the run: z``."""
    out = []
    for p, q in ((a, b), (b, a)):
        only = sorted(p.stages - q.stages)
        if only:
            shown = ", ".join(only[:SHOWN]) + (f" and {len(only) - SHOWN} more" if len(only) > SHOWN else "")
            out.append(f"only in {p.short}: {shown}")
    return "; ".join(out)


def _mismatch(a: Part, b: Part, what: str, fix: str = FIX) -> MismatchedInputsError:
    return MismatchedInputsError(f"{a.title} and {b.title} do not belong together: {what}; {fix}")
