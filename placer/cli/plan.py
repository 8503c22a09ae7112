"""``placer plan``: the best placement of a pipeline, with the reason for every choice.

May import: typer, rich, placer.cli.app; the library (placer.site, placer.optimize, placer.loader,
placer.stream.planner, placer.stream.target, placer.stream.offload, placer.target) lazily, inside the command.

A pipeline with streams is planned by the stream planner: devices, workers, prefetch and a
cache point per stream, from a profile of its first batches (``--json``: the plan as JSON);
with ``--target``, for the described machine from a profile taken here (every number a prediction);
with ``--cluster FILE``, with a described dask cluster's workers in the search (remote workers and
batches per task per CPU stage, the network load), without connecting to anything.
"""

from __future__ import annotations

from pathlib import Path

import typer

from placer.cli.app import app, error_line, fail, output_path, positive_int, positive_seconds, scheduler_address, usage
from placer.cli.options import build_param_option


def _from_model(pipeline: str | None, profile_file: Path | None, size: int | None,
                budget_s: float | None = None, target: str | None = None, precision: str | None = None):
    """The flow's :class:`~placer.site.Costs` from a saved profile, or by profiling the pipeline now
    (with ``target``: also for that described machine)."""
    from placer.data.profile import Profile
    from placer.site import LocalSite, costs_from_profile

    if profile_file is not None:
        costs = costs_from_profile(Profile.load(profile_file), size=size, describe=target)
    else:
        costs = LocalSite().costs(pipeline, size=size, budget_s=60.0 if budget_s is None else budget_s,
                                  progress=None, describe=target, precision=precision)
    if costs.size is None:
        fail(f"the profile of {costs.profile.pipeline!r} has no sizes; give --size N")
    return costs


@app.command("plan")
@build_param_option
def plan_command(
    pipeline: str = typer.Argument(None, help="A .py file exposing build(size=None, **params), or module:function."),
    size: int = typer.Option(None, "--size", callback=positive_int, help="Size to plan for (rows, batch, ...); for serving, the request's batch."),
    profile_file: Path = typer.Option(None, "--profile", help="Plan from this saved profile."),
    costs: Path = typer.Option(None, "--costs", help="Plan from this cost table (JSON, see docs/costs.md)."),
    objective: str = typer.Option("makespan", "--objective", help="makespan, throughput or cost."),
    method: str = typer.Option("auto", "--method", help="auto, exact or heuristic."),
    deadline_s: float = typer.Option(None, "--deadline-s", callback=positive_seconds, help="With --objective cost: the makespan to meet."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_path, help="Also save the plan as JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON document."),
    scheduler: str = typer.Option(
        None, "--scheduler", callback=scheduler_address,
        help="Plan for the dask.distributed cluster at this address (tcp://HOST:PORT): profile on its "
             "workers, measure the network between them, plan over its devices.",
    ),
    budget_s: float = typer.Option(None, "--budget-s", callback=positive_seconds, help="Profiling time budget in seconds (with PIPELINE; "
                                   "with --scheduler, on each worker). Default 60, or 30 on a cluster."),
    save_costs: Path = typer.Option(None, "--save-costs", callback=output_path, help="Also save the cost table planned from (JSON; "
                                    "plan from it again with --costs)."),
    target: str = typer.Option(None, "--target", help="Plan for this machine instead of the one here: h200 "
                               "(an H200 and its 16-core host) or a JSON file from `placer describe`."),
    precision: str = typer.Option(None, "--precision", help="auto: every torch stage may run in tf32 or bf16 when "
                                  "its accuracy holds here; STAGE=PRECISION,... fixes one (fp32, tf32, bf16, fp16). "
                                  "Default: only what stages declare."),
    cluster: Path = typer.Option(None, "--cluster", help="A pipeline with streams: also plan its CPU stages as tasks "
                                 "on a dask cluster that is not running, described in this JSON or YAML file "
                                 "(nodes, cores_per_node, bandwidth_gbit_s; see docs/streams.md). Nothing is "
                                 "connected to."),
) -> None:
    """Choose a device for every stage of PIPELINE, and say why."""
    from placer.errors import PlacerError
    from placer.optimize import CostTable, plan
    from placer.optimize.objectives import UnknownObjectiveError, get_objective, known

    try:
        get_objective(objective)
    except UnknownObjectiveError:
        usage(f"unknown --objective {objective!r}; use {known()}")
    if method not in ("auto", "exact", "heuristic"):
        usage(f"unknown --method {method!r}; use auto, exact or heuristic")
    if costs is not None and profile_file is not None:
        usage("give either --costs or --profile, not both")
    if costs is None and profile_file is None and pipeline is None:
        usage("give a PIPELINE, --profile FILE or --costs FILE")
    if scheduler is not None and (costs is not None or profile_file is not None or pipeline is None):
        usage("--scheduler profiles PIPELINE on the cluster; give a PIPELINE and drop --costs and --profile")
    if target is not None and (costs is not None or scheduler is not None):
        usage("--target plans a described machine from a profile; drop --costs and --scheduler")
    if precision is not None and (pipeline is None or costs is not None or profile_file is not None):
        usage("--precision checks a lower precision's accuracy by running PIPELINE; give a PIPELINE and drop "
              "--costs and --profile")
    if cluster is not None and (costs is not None or profile_file is not None or scheduler is not None
                                or target is not None or pipeline is None):
        usage("--cluster plans a stream's CPU stages for a described cluster from a profile taken here; give a "
              "PIPELINE with streams and drop --costs, --profile, --scheduler and --target")
    if cluster is not None:
        from placer.errors import PlacerError
        from placer.stream.offload import load_cluster

        try:
            described = load_cluster(cluster)  # a clear error now, naming the field, rather than after profiling
        except PlacerError as exc:
            fail(error_line(exc))
    if pipeline is not None and costs is None and profile_file is None and scheduler is None:
        streamed = _stream_pipeline(pipeline, size)
        if streamed is not None:
            _plan_streams(streamed, budget_s, output, as_json, target=target, precision=precision,
                          cluster=described if cluster is not None else None)
            return
        if cluster is not None:
            usage(f"--cluster plans the CPU stages of a stream, and {pipeline} has none; drop --cluster")
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
            site_costs = _from_model(pipeline, profile_file, size, budget_s, target, precision)
            on_target = target is not None
            table = site_costs.table(target=on_target)
            result = site_costs.plan(objective=objective, method=method, deadline_s=deadline_s, target=on_target)
            if profile_file is None:  # a tie only the spread makes: measure nearer the size, then decide again
                from placer.decide import note, remeasure
                from placer.site import LocalSite

                site_costs, said = remeasure(LocalSite(), pipeline, site_costs, size=site_costs.size,
                                             budget_s=60.0 if budget_s is None else budget_s, plans=[result],
                                             target=target)
                if said:
                    table = site_costs.table(target=on_target)
                    result = site_costs.plan(objective=objective, method=method, deadline_s=deadline_s,
                                             target=on_target)
                    note(result, said)
            if on_target:
                notes = [f"planned for {site_costs.target.name} (described, not measured)"]
        if costs is not None:
            result = plan(table, objective=objective, method=method, deadline_s=deadline_s, size=size)
    except PlacerError as exc:
        fail(error_line(exc))
    except (KeyError, ValueError) as exc:
        fail(error_line(exc).strip("'\""))
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


#: above this many stages the plan is printed as plain aligned columns, one line a stage (a framed,
#: wrapped table of a thousand rows takes seconds to lay out and is read with grep, not by eye)
PLAIN_ROWS = 200


def _plain_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, the last one (the reason) left unpadded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(r, widths)), r[-1]]) for r in [header, *rows])


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
    lower = any(s.precision_s for s in result.stages)
    header = ["stage", "device", *(["precision"] if lower else []), *[f"{d} s" for d in devs], "copies", "why"]
    rows = [[s.name, s.device, *([s.precision] if lower else []),
             *[f"{s.predicted_s[d]:.4g}" if d in s.predicted_s else "-" for d in devs],
             fmt_s(s.copy_s), s.reason] for s in result.stages]
    if len(rows) > PLAIN_ROWS:
        c.out(title, highlight=False)
        c.out(_plain_table(header, rows), highlight=False)
    else:
        t = Table(title=title)
        for col in header:
            t.add_column(col, overflow="fold")
        for row in rows:
            t.add_row(*row)
        c.print(t)
    for name, secs in result.baselines.items():
        label = name.replace("_", " ")
        c.print(f"  {label}: " + ("impossible" if secs is None else fmt_s(secs)))
    for tie in result.ties:
        moved = ", ".join(f"{n} on {d}" for n, d in tie.differs.items())
        within = (f"within the noise ({result.noise:.0%}) and the spread of the stage times it moves"
                  if tie.fits_disagree else f"within the noise ({result.noise:.0%})")
        mine = result.predicted_makespan_s
        way = (f"the plan, {mine / tie.predicted_makespan_s - 1:.0%} slower at the point estimate, wins by "
               f"{result.tie_rule}" if tie.predicted_makespan_s < mine else
               "the plan is also the faster at the point estimate")
        c.print(f"  tie: {moved} predicted {fmt_s(tie.predicted_makespan_s)}, {within}; {way}")
    summary = get_objective(result.objective).summary(result)
    if summary is not None:
        c.print(f"  {summary}")
    for s in result.stages:
        for d, times in s.precision_s.items():
            c.print(f"  what-if {s.name} on {d}: " + ", ".join(f"{p} {fmt_s(t)}" for p, t in times.items()))
    for n in result.precision_notes:
        c.print(f"  {n}")
    for w in result.warnings:
        c.print(f"  warning: {w}")
    c.print(f"  planned in {fmt_s(result.planning_s)}")


# -- streams -------------------------------------------------------------------------------------
def _stream_pipeline(pipeline: str, size: int | None):
    """The built pipeline when it has streams (else None: the one-shot path loads it itself)."""
    from placer.errors import PlacerError
    from placer.loader import load_pipeline

    try:
        p = load_pipeline(pipeline, size)
    except (PlacerError, ValueError, TypeError, OSError):
        return None
    return p if p.streams() else None


def _plan_streams(p, budget_s: float | None, output: Path | None, as_json: bool, target: str | None = None,
                  precision: str | None = None, cluster=None) -> None:
    """Plan every stream of ``p`` here (:func:`placer.stream.planner.plan_streams`), or for ``target`` from a
    profile taken here (:func:`placer.stream.target.plan_streams_for_target`), or with a described
    ``cluster``'s workers in the search (:func:`placer.stream.offload.plan_offload`); print or save it."""
    import json

    from placer.errors import PlacerError
    from placer.files import write_text_atomic

    budget = 20.0 if budget_s is None else budget_s
    try:
        if target is not None:
            from placer.stream.target import plan_streams_for_target
            from placer.target import load_target

            plans = plan_streams_for_target(p, load_target(target), budget_s=budget, precision=precision)
        elif cluster is not None:
            from placer.stream.offload import describe_link, plan_offload
            from placer.stream.planner import plan_streams

            profiles: list = []
            plan_streams(p, budget_s=budget, profiles=profiles, verify_runs=False, precision=precision)
            link = describe_link(cluster)
            plans = [plan_offload(prof, link)[0] for prof in profiles]
        else:
            from placer.stream.planner import plan_streams

            plans = plan_streams(p, budget_s=budget, precision=precision)
    except PlacerError as exc:
        fail(error_line(exc))
    docs = [json.loads(plan.to_json()) for plan in plans]
    text = json.dumps(docs[0] if len(docs) == 1 else docs, indent=1)
    if output is not None:
        write_text_atomic(output, text)
    if as_json:
        print(text)
        return
    for plan in plans:
        print_stream_plan(plan)


def _workers_cell(plan, s) -> str:
    """A stage's workers: ``N local`` (threads or processes here) or ``N remote × G batches/task``."""
    if s.name in (plan.source, plan.step) or s.device != "cpu":
        return str(s.workers)
    if s.worker_kind == "dask":
        g = plan.settings.group_of(s.name)
        return f"{s.workers} remote" + (f" × {g} batches/task" if g > 1 else "")
    return f"{s.workers} local" + (" processes" if s.worker_kind == "process" else "")


def offload_lines(off) -> list[str]:
    """The cluster option of a stream plan in words: remote workers per stage, predicted rates, network load."""
    label = "described" if off.source == "described" else "measured"
    out = [f"cluster {off.cluster} ({label}, {off.threads} threads): "
           + ("the plan runs stages there" if off.chosen else "this machine's workers are kept")]
    for s in off.stages:
        out.append(f"  {s.name}: {s.remote_workers} remote task{'s' if s.remote_workers != 1 else ''} in flight"
                   f" of {s.group} batch{'es' if s.group != 1 else ''}, {s.bytes_per_batch:,} bytes per batch, "
                   f"{s.predicted_batches_per_s:,.1f} batches/s predicted ({s.bound}-bound)")
    measured = (f", measured {off.measured_samples_per_s:,.1f}" if off.measured_samples_per_s is not None else "")
    here = (f", measured {off.local_measured_samples_per_s:,.1f}" if off.local_measured_samples_per_s is not None
            else "")
    out.append(f"with the cluster: {off.predicted_samples_per_s:,.1f} samples/s predicted{measured}; this "
               f"machine's workers only: {off.local_predicted_samples_per_s:,.1f} predicted{here}")
    out.append(f"network: {off.network_bytes_per_s / 1e6:,.1f} MB/s of {off.bandwidth_bytes_per_s / 1e6:,.0f} MB/s "
               f"({off.network_share:.1%} of the link)")
    return out


def print_stream_plan(plan) -> None:
    from rich.console import Console
    from rich.table import Table

    from placer.stream.reasons import target_label

    c = Console()
    on = f" on {target_label(plan.target)}" if plan.target else ""
    t = Table(title=f"stream {plan.source} -> {plan.step}: {plan.predicted_samples_per_s:,.1f} samples/s "
                    f"predicted{on} ({plan.objective.replace('_', ' ')}); bottleneck {plan.bottleneck}")
    for col in ["stage", "device", "workers", "s per batch", "batches/s", "why"]:
        t.add_column(col, overflow="fold")
    for s in plan.stages:
        t.add_row(s.name, s.device, _workers_cell(plan, s), f"{s.seconds_per_batch:.4g}", f"{s.batches_per_s:.4g}",
                  s.reason)
    c.print(t)
    if plan.offload is not None:
        for line in offload_lines(plan.offload):
            c.print(f"  {line}", highlight=False)
    s = plan.settings
    c.print(f"  settings: prefetch {s.prefetch}, pin_memory {s.pin_memory}, cache {s.cache or 'none'}"
            + (f", torch threads {s.torch_threads}" if s.torch_threads else ""))
    if plan.target_sentence:
        c.print(f"  {plan.target_sentence}")
    for r in plan.reasons:
        c.print(f"  {r}")
    for b in plan.baselines:
        c.print(f"  baseline {b.name}: {b.predicted_samples_per_s:,.1f} samples/s" + (" predicted" if on else "")
                + (f" (the plan: {b.speedup:.2f}x)" if b.speedup else ""))
    for w in plan.what_if:
        rate = f"{w.predicted_samples_per_s:,.0f} samples/s, " if plan.target else ""
        c.print(f"  what if {w.name}: {rate}{w.speedup:.2f}x {w.change}" if w.speedup else f"  what if {w.name}")
    for v in plan.verified:
        c.print(f"  measured {v.name}: {v.measured_samples_per_s:,.1f} samples/s "
                f"(predicted {v.predicted_samples_per_s:,.1f}) over {v.batches} batches")
    for n in plan.notes:
        c.print(f"  note: {n}")
