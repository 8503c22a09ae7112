"""``placer plan``: the best placement of a pipeline, with the reason for every choice.

May import: typer, rich, placer.cli.app; the library (placer.site, placer.optimize) lazily,
inside the command.
"""

from __future__ import annotations

from pathlib import Path

import typer

from placer.cli.app import app, fail


def _from_model(pipeline: str | None, profile_file: Path | None, size: int | None,
                budget_s: float | None = None):
    """The flow's :class:`~placer.site.Costs` from a saved profile, or by profiling the pipeline now."""
    from placer.data.profile import Profile
    from placer.site import LocalSite, costs_from_profile

    if profile_file is not None:
        costs = costs_from_profile(Profile.load(profile_file), size=size)
    else:
        costs = LocalSite().costs(pipeline, size=size, budget_s=60.0 if budget_s is None else budget_s,
                                  progress=None)
    if costs.size is None:
        fail(f"the profile of {costs.profile.pipeline!r} has no sizes; give --size N")
    return costs


@app.command("plan")
def plan_command(
    pipeline: str = typer.Argument(None, help="A .py file exposing build(size=None, **params), or module:function."),
    size: int = typer.Option(None, "--size", help="Size to plan for (rows, batch, ...); for serving, the request's batch."),
    profile_file: Path = typer.Option(None, "--profile", help="Plan from this saved profile."),
    costs: Path = typer.Option(None, "--costs", help="Plan from this cost table (JSON, see docs/costs.md)."),
    objective: str = typer.Option("makespan", "--objective", help="makespan, throughput or cost."),
    method: str = typer.Option("auto", "--method", help="auto, exact or heuristic."),
    deadline_s: float = typer.Option(None, "--deadline-s", help="With --objective cost: the makespan to meet."),
    output: Path = typer.Option(None, "-o", "--output", help="Also save the plan as JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON document."),
    scheduler: str = typer.Option(
        None, "--scheduler",
        help="Plan for the dask.distributed cluster at this address (tcp://HOST:PORT): profile on its "
             "workers, measure the network between them, plan over its devices.",
    ),
    budget_s: float = typer.Option(None, "--budget-s", help="Profiling time budget in seconds (with PIPELINE; "
                                   "with --scheduler, on each worker). Default 60, or 30 on a cluster."),
    save_costs: Path = typer.Option(None, "--save-costs", help="Also save the cost table planned from (JSON; "
                                    "plan from it again with --costs)."),
) -> None:
    """Choose a device for every stage of PIPELINE, and say why."""
    from placer.errors import PlacerError
    from placer.optimize import CostTable, plan
    from placer.optimize.objectives import UnknownObjectiveError, get_objective, known

    try:
        get_objective(objective)
    except UnknownObjectiveError:
        fail(f"unknown --objective {objective!r}; use {known()}")
    if method not in ("auto", "exact", "heuristic"):
        fail(f"unknown --method {method!r}; use auto, exact or heuristic")
    if costs is not None and profile_file is not None:
        fail("give either --costs or --profile, not both")
    if costs is None and profile_file is None and pipeline is None:
        fail("give a PIPELINE, --profile FILE or --costs FILE")
    if scheduler is not None and (costs is not None or profile_file is not None or pipeline is None):
        fail("--scheduler profiles PIPELINE on the cluster; give a PIPELINE and drop --costs and --profile")
    if budget_s is not None and budget_s <= 0:
        fail(f"--budget-s must be positive, got {budget_s:g}")
    notes: list[str] = []
    try:
        if scheduler is not None:
            result, table, notes = _for_cluster(pipeline, scheduler, size, budget_s, objective, method,
                                                deadline_s)
        elif costs is not None:
            table = CostTable.load(costs)
            if size is not None and table.size is not None and size != table.size:
                fail(f"{costs} holds costs at size {table.size:g}, not {size}; drop --size "
                     "or plan from a profile, which predicts any size")
        else:
            site_costs = _from_model(pipeline, profile_file, size, budget_s)
            table = site_costs.table()
            result = site_costs.plan(objective=objective, method=method, deadline_s=deadline_s)
        if costs is not None:
            result = plan(table, objective=objective, method=method, deadline_s=deadline_s, size=size)
    except PlacerError as exc:
        fail(str(exc).splitlines()[0])
    except (KeyError, ValueError) as exc:
        fail(str(exc).strip("'\""))
    if output is not None:
        result.save(output)
    if save_costs is not None:
        table.save(save_costs)
    if as_json:
        print(result.to_json())
        return
    _print(result, notes)


def _for_cluster(pipeline, scheduler, size, budget_s, objective, method, deadline_s):
    """``(plan, table, notes)`` for the cluster at ``scheduler``."""
    from placer.site import open_site

    with open_site(scheduler) as site:
        costs = site.costs(pipeline, size=size, budget_s=30.0 if budget_s is None else budget_s)
    result = costs.plan(objective=objective, method=method, deadline_s=deadline_s)
    failed = [n for n in costs.profile.notes if ": stage " in n and " failed: " in n]
    return result, costs.table(), costs.notes + failed


def _print(result, notes: list[str] = ()) -> None:
    from rich.console import Console
    from rich.table import Table

    from placer.optimize.explain import fmt_s
    from placer.optimize.objectives import get_objective

    c = Console()
    for note in notes:
        c.print(f"  {note}")
    devs = list(result.devices)
    title = (f"{result.objective} plan ({result.method}: {result.algorithm}); "
             f"predicted makespan {fmt_s(result.predicted_makespan_s)}")
    t = Table(title=title)
    for col in ["stage", "device", *[f"{d} s" for d in devs], "copies", "why"]:
        t.add_column(col, overflow="fold")
    for s in result.stages:
        times = [f"{s.predicted_s[d]:.4g}" if d in s.predicted_s else "-" for d in devs]
        t.add_row(s.name, s.device, *times, fmt_s(s.copy_s), s.reason)
    c.print(t)
    for name, secs in result.baselines.items():
        label = name.replace("_", " ")
        c.print(f"  {label}: " + ("impossible" if secs is None else fmt_s(secs)))
    summary = get_objective(result.objective).summary(result)
    if summary is not None:
        c.print(f"  {summary}")
    for w in result.warnings:
        c.print(f"  warning: {w}")
    c.print(f"  planned in {fmt_s(result.planning_s)}")
