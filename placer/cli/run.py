"""``placer run``: execute a pipeline under a placement and print its timeline."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from placer.cli.app import app, fail


def default_placement(pipeline, size):
    """The plan's placement when an optimizer and cost model are available, else all-CPU."""
    try:
        from placer.advisor import best_placement
    except ImportError:
        return "all=cpu", "all stages on the CPU (no planner available)"
    return best_placement(pipeline, size)


def cluster_placement(pipeline: str, size, scheduler: str):
    """The plan's placement for the cluster at ``scheduler`` (profiled on its workers), and why.

    When profiling or planning fails, all-CPU with the reason; an unreachable or
    empty cluster is an error (the run could not start either).
    """
    from placer.advisor import RUN_BUDGET_S
    from placer.errors import PlacerError
    from placer.cluster import plan_for_cluster
    from placer.executor.distributed import ClusterError, ClusterProfileError

    try:
        chosen = plan_for_cluster(pipeline, scheduler, size=size, budget_s=RUN_BUDGET_S)
    except ClusterError as exc:
        if not isinstance(exc, ClusterProfileError):
            raise  # the run cannot start either
        why = exc
    except (PlacerError, ValueError, KeyError) as exc:
        why = exc
    else:
        on = sorted(set(chosen.placement.values()))
        return dict(chosen.placement), (
            f"planned for the cluster from a {RUN_BUDGET_S:g} s profile on its workers: predicted "
            f"makespan {chosen.predicted_makespan_s:.4g} s using {', '.join(on)}")
    return "all=cpu", f"all stages on the CPU: planning for the cluster failed ({str(why).splitlines()[0]})"


@app.command("run")
def run(
    pipeline: str = typer.Argument(..., help="A .py file exposing build(size=None, **params), or module:function."),
    size: int = typer.Option(None, "--size", help="Scale of the pipeline (rows, batch, ...)."),
    placement: str = typer.Option(None, "--placement", help="all=cpu, all=gpu, or stage=device,... (default: the plan)."),
    executor: str = typer.Option("auto", "--executor", help="auto, inline or threads."),
    output: Path = typer.Option(None, "-o", "--output", help="Also save the run record as JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    scheduler: str = typer.Option(
        None, "--scheduler",
        help="Run on the dask.distributed cluster at this address (tcp://HOST:PORT); GPU stages "
             "go to workers started with --resources GPU=1.",
    ),
) -> None:
    """Run PIPELINE with each stage on its device; print what ran where and how long."""
    from placer.errors import PlacerError
    from placer.executor import execute
    from placer.loader import load_pipeline
    from placer.files import write_text_atomic

    try:
        p = load_pipeline(pipeline, size)
        why = None
        spec = placement
        if spec is None and scheduler:
            spec, why = cluster_placement(pipeline, p.size, scheduler)
        elif spec is None:
            spec, why = default_placement(p, p.size)
        result = execute(p, spec, executor=executor, size=p.size, scheduler=scheduler)
    except PlacerError as exc:
        fail(str(exc).splitlines()[0])
    except (ValueError, TypeError) as exc:
        fail(f"{pipeline}: {exc}")
    doc = result.summary()
    if output is not None:
        write_text_atomic(output, json.dumps(doc, indent=2))
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    c = Console()
    if why:
        c.print(f"placement: {why}")
    t = Table(title=f"{result.pipeline}: makespan {result.makespan_s:.4f} s ({result.executor})")
    cols = ["stage", "device", "lane", "start s", "seconds"] + (["worker"] if scheduler else [])
    for col in cols:
        t.add_column(col)
    for s in result.stages:
        t.add_row(s.name, s.device, s.lane, f"{s.start_s:.4f}", f"{s.seconds:.4f}",
                  *([s.worker or "?"] if scheduler else []))
    c.print(t)
    for tr in result.transfers:
        c.print(f"transfer {tr.data}: {tr.src} -> {tr.dst} {tr.bytes:,} B in {tr.seconds * 1e3:.2f} ms"
                + (" (pinned)" if tr.pinned else ""))
    c.print(f"outputs digest: {result.outputs_digest}")
