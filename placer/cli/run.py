"""``placer run``: execute a pipeline under a placement and print its timeline."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from placer.cli.app import app, error_line, fail, output_path, positive_int, scheduler_address, stage_timeout_option, usage
from placer.cli.options import build_param_option, trace_option, write_trace_file


@app.command("run")
@build_param_option
def run(
    pipeline: str = typer.Argument(..., help="A .py file exposing build(size=None, **params), or module:function."),
    size: int = typer.Option(None, "--size", callback=positive_int, help="Scale of the pipeline (rows, batch, ...)."),
    placement: str = typer.Option(None, "--placement", help="all=cpu, all=gpu, or stage=device,... (default: the plan; "
                                  "for a stream: its planned devices, workers, prefetch and cache)."),
    executor: str = typer.Option("auto", "--executor", help="auto, inline or threads."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_path,
                                help="Also save the run record as JSON here (a failed run's too)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    scheduler: str = typer.Option(
        None, "--scheduler", callback=scheduler_address,
        help="Run on the dask.distributed cluster at this address (tcp://HOST:PORT); GPU stages "
             "go to workers started with --resources GPU=1.",
    ),
    workers: int = typer.Option(None, "--workers", min=0,
                                help="Streams: parallel workers per CPU stage; 0 runs each batch through every "
                                     "stage in turn (the sequential reference)."),
    prefetch: int = typer.Option(None, "--prefetch", min=1, help="Streams: batches each queue holds (default 2)."),
    cache: str = typer.Option(None, "--cache", help="Streams: keep this deterministic stage's output in memory "
                                                    "after the first epoch."),
    processes: str = typer.Option(None, "--processes", help="Streams: CPU stages (comma-separated) whose workers "
                                                            "are processes, for pure-Python code that holds the GIL."),
    trace: Path = trace_option(),
    stage_timeout_s: float = stage_timeout_option(),
    precision: str = typer.Option(None, "--precision", help="STAGE=PRECISION,... runs those stages in fp32, tf32, "
                                  "bf16 or fp16 (like --placement); auto: without --placement, the plan may choose tf32 or bf16 "
                                  "for any torch stage whose accuracy holds here. Default: the plan's choice among "
                                  "what stages declare, else fp32: nothing changes numerics."),
) -> None:
    """Run PIPELINE with each stage on its device; print what ran where and how long."""
    from placer.advisor import best_placement
    from placer.errors import PlacementError, PlacerError, StageFailedError
    from placer.executor import execute, stage_timeout
    from placer.files import write_text_atomic
    from placer.loader import load_pipeline
    from placer.site import open_site

    if precision and placement is not None and "auto" in [x.strip().lower() for x in precision.split(",")]:
        usage("--precision auto lets the plan choose precisions, and --placement skips the plan; drop "
              "--placement, or fix stages with --precision STAGE=PRECISION")
    try:
        with stage_timeout(stage_timeout_s):
            p = load_pipeline(pipeline, size)
            why = planned = None
            spec = placement
            chosen_precision: dict[str, str] = {}
            if spec is None:
                with open_site(scheduler) as site:
                    chosen = best_placement(p, p.size, site, reference=pipeline, precision=precision)
                spec, why = chosen
                planned = chosen.stream
                chosen_precision = dict(chosen.precision)
            stream = _stream_config(workers, prefetch, cache, planned, processes)
            result = execute(p, spec, executor=executor, size=p.size, scheduler=scheduler, stream=stream,
                             stage_timeout=stage_timeout_s,
                             precision={**chosen_precision, **(_fixed_precisions(precision, p) or {})})
    except StageFailedError as exc:
        write_trace_file(trace, getattr(exc, "run", None))  # a failed run's timeline up to the failure
        saved = _save_failed(exc, output)
        fail(error_line(exc) + saved)
    except PlacementError as exc:  # --placement that cannot be read or does not fit: a usage error
        usage(error_line(exc))
    except PlacerError as exc:
        fail(error_line(exc))
    except (ValueError, TypeError) as exc:
        fail(f"{pipeline}: {error_line(exc)}")
    doc = result.summary()
    write_trace_file(trace, result)
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
    span = "total time" if result.streams else "makespan"  # a run with streams speaks of throughput and total time
    t = Table(title=f"{result.pipeline}: {span} {result.makespan_s:.4f} s ({result.executor})")
    lower = any(s.precision != "fp32" for s in result.stages)
    cols = ["stage", "device"] + (["precision"] if lower else []) + ["lane", "start s", "seconds"] + (
        ["worker"] if scheduler else [])
    for col in cols:
        t.add_column(col)
    for s in result.stages:
        t.add_row(s.name, s.device, *([s.precision] if lower else []), s.lane, f"{s.start_s:.4f}", f"{s.seconds:.4f}",
                  *([s.worker or "?"] if scheduler else []))
    c.print(t)
    for tr in result.transfers:
        c.print(f"transfer {tr.data}: {tr.src} -> {tr.dst} {tr.bytes:,} B in {tr.seconds * 1e3:.2f} ms"
                + (" (pinned)" if tr.pinned else ""))
    for s in result.streams:
        c.print(f"stream {s.source} -> {s.step}: {s.batches} batches, {s.samples_per_s:,.1f} samples/s; "
                f"the step waited for data {s.consumer_idle_fraction:.0%} of the time")
    c.print(f"outputs digest: {result.outputs_digest}")


def _fixed_precisions(text: str | None, pipeline) -> dict[str, str] | None:
    """``--precision``'s fixed stages (``auto`` is the plan's: see :func:`placer.advisor.best_placement`)."""
    if not text:
        return None
    from placer.precision import parse_precision_option

    return parse_precision_option(text, pipeline.stages)[1]


def _save_failed(exc, output: Path | None) -> str:
    """Write a failed run's record (its error, failed stage and partial timeline) to ``-o``; say so."""
    from placer.files import write_text_atomic

    if output is None or getattr(exc, "run", None) is None:
        return ""
    try:
        write_text_atomic(output, json.dumps(exc.run.summary(), indent=2))
    except OSError as err:
        return f" (the failed run's record could not be saved to {output}: {err.strerror or err})"
    return f" (the failed run's record is saved in {output})"


def _stream_config(workers: int | None, prefetch: int | None, cache: str | None, planned=None,
                   processes: str | None = None):
    """The stream settings: the plan's (when planned), with what the command line gives on top.

    ``--workers`` given with a plan replaces the plan's workers of every stage;
    ``--processes`` makes the named stages' workers processes.
    """
    from placer.stream import StreamConfig

    given = {k: v for k, v in {"workers": workers, "prefetch": prefetch, "cache": cache}.items() if v is not None}
    if processes:
        kinds = dict(planned.worker_kind) if planned is not None else {}
        given["worker_kind"] = {**kinds, **{n.strip(): "process" for n in processes.split(",") if n.strip()}}
    if planned is not None:
        if workers is not None:
            given["stage_workers"] = {}
        return planned.model_copy(update=given) if given else planned
    return StreamConfig(**given) if given else None
