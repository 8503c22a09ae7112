"""``placer advise``: profile, plan, run and report in one command, with a progress display.

May import: typer, rich, placer.cli.app; the library lazily, inside the command.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import typer

from placer.cli.app import (app, error_line, fail, output_folder, output_path, positive_int, positive_seconds,
                            scheduler_address, stage_timeout_option, usage)
from placer.cli.options import build_param_option, trace_option, write_trace_file


def progress_steps(show: bool):
    """``step(name)`` context managers that show a rich progress line per step (terminal only)."""
    if not show:
        return (lambda _name: contextlib.nullcontext()), contextlib.nullcontext()
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from placer.progress import columns

    bar = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                   TimeElapsedColumn(), *columns(), console=Console(stderr=True))
    labels = {"profile": "profiling stages on each device", "plan": "planning", "target": "planning for the target GPU",
              "run plan": "running the plan", "repeat options": "running the plan and the baselines again, interleaved",
              "repeat plan and plain loop": "running the plan and one batch at a time again, where their rounds "
                                            "disagree",
              "facts": "gathering the report's facts",
              "measure where it decides": "measuring again where a tie rests on the spread of a stage's time"}

    @contextlib.contextmanager
    def step(name: str):
        task = bar.add_task(labels.get(name, name.replace("run ", "running baseline ")), total=1)
        try:
            yield
        finally:
            bar.update(task, completed=1)

    return step, bar


def summary_document(advised, path: Path | None) -> dict:
    """The JSON summary ``placer advise --json`` prints."""
    f = advised.facts
    placement = (advised.plan.placement if advised.plan is not None
                 else {n: d for sp in advised.stream_plans for n, d in sp.placement.items()})
    doc = {
        "pipeline": f.meta.pipeline,
        "size": f.meta.size,
        "placement": placement,
        "headline": f.summary.headline,
        "options": [o.model_dump(include={"key", "predicted_s", "measured_s", "plan_speedup_predicted",
                                          "plan_speedup_measured", "note"}) for o in f.summary.options],
        "bottleneck": f.bottleneck.model_dump(exclude={"path"}) if f.bottleneck else None,
        "advice": [a.text for a in f.advice],
        "target": f.target.model_dump() if f.target else None,
        "ties": ({"noise": advised.plan.noise, "rule": advised.plan.tie_rule,
                  "placements": [t.model_dump() for t in advised.plan.ties]} if advised.plan is not None else None),
        "report": str(path) if path else None,
        "timings_s": advised.timings,
    }
    if advised.plan is not None and (advised.plan.precision or any(s.precision_s for s in advised.plan.stages)
                                     or advised.plan.precision_notes):
        from placer.advisor import precision_facts

        doc["precision"] = precision_facts(advised.plan, advised.profile)
    if f.streams:
        doc["streams"] = [stream_summary(s, sp) for s, sp in zip(f.streams, advised.stream_plans)]
    return doc


def stream_summary(s, plan) -> dict:
    """One stream of ``placer advise --json``: the plan's settings, predicted and measured samples/s,
    the bottleneck, the usual settings measured, the what-if table, the candidates the verification ran
    (``verified``), and on a cluster (``cluster``) the
    offload option: remote workers and batches per task per stage, predicted and measured samples/s,
    the network share."""
    return {
        "source": s.source, "step": s.step,
        "settings": {"placement": dict(plan.placement), **plan.settings.decisions()},
        "predicted_samples_per_s": s.predicted_samples_per_s,
        "measured_samples_per_s": s.samples_per_s,
        "bottleneck": s.bottleneck, "bottleneck_sentence": s.sentence,
        "consumer_idle_fraction": s.consumer_idle_fraction,
        "options": [o.model_dump(exclude={"speedup"}) for o in s.options],
        "what_if": [o.model_dump(include={"name", "change", "predicted_samples_per_s", "speedup", "bottleneck"})
                    for o in s.what_if],
        # the verification's runs: which candidates ran, predicted and measured, every run (the plan chosen from them)
        "verified": [v.model_dump(mode="json") for v in getattr(plan, "verified", [])],
        **({"target": target_summary(s.target)} if s.target is not None else {}),
        **({"cluster": plan.offload.model_dump()} if getattr(plan, "offload", None) is not None else {}),
    }


def target_summary(t) -> dict:
    """A stream planned for a described machine, in ``placer advise --json``: every number a prediction
    for ``machine`` (its name is on each)."""
    return {
        "machine": t.machine, "label": "predicted",
        "predicted_samples_per_s": t.predicted_samples_per_s,
        "step_predicted_samples_per_s": t.step_samples_per_s,
        "bottleneck": t.bottleneck, "predicted_wait_fraction": t.predicted_wait_fraction,
        "bottleneck_sentence": t.sentence, "settings": t.settings,
        "stages": [{k: v for k, v in st.items() if k != "reason"} for st in t.stages],
        "what_if": [{**o.model_dump(include={"name", "change", "predicted_samples_per_s", "speedup", "bottleneck"}),
                     "machine": t.machine} for o in t.what_if],
        "notes": t.notes,
    }


@app.command("advise")
@build_param_option
def advise_command(
    pipeline: str = typer.Argument(..., help="A .py file exposing build(size=None, **params), or module:function."),
    size: int = typer.Option(None, "--size", callback=positive_int, help="Size to plan and run at (rows, batch, ...)."),
    output: Path = typer.Option(Path("placer-report.html"), "-o", "--output", callback=output_path,
                                help="Report file (.html, .md or .json)."),
    fmt: str = typer.Option(None, "--format", help="html, md or json (default: from the file's suffix)."),
    budget_s: float = typer.Option(30.0, "--budget-s", callback=positive_seconds, help="Profiling time budget in seconds (cached profiles are reused)."),
    target: str = typer.Option("auto", "--target",
                               help="Also plan for another machine: h200 (an H200 and its 16-core host), a JSON "
                                    "file from `placer describe`, none, or auto (h200 when no GPU)."),
    objective: str = typer.Option("makespan", "--objective", help="makespan, throughput or cost."),
    executor: str = typer.Option("auto", "--executor", help="auto, inline or threads."),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines", help="Also run all-CPU, all-GPU, rule of thumb."),
    pictures: bool = typer.Option(False, "--pictures", help="Markdown: also write the pictures as SVG files next to it."),
    save: Path = typer.Option(None, "--save", callback=output_folder,
                              help="Save profile, plan, runs and facts as JSON in this folder (what was "
                                   "made so far, when a run fails)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
    scheduler: str = typer.Option(None, "--scheduler", callback=scheduler_address,
                                  help="Advise for a dask.distributed cluster at this address (tcp://HOST:PORT)."),
    trace: Path = trace_option(),
    stage_timeout_s: float = stage_timeout_option(),
    precision: str = typer.Option(None, "--precision", help="auto: every torch stage may run in tf32 or bf16 when "
                                  "its accuracy holds here; STAGE=PRECISION,... fixes one (fp32, tf32, bf16, fp16). "
                                  "Default: only what stages declare."),
) -> None:
    """Profile PIPELINE, plan it, run the plan and its alternatives, and write a report."""
    from placer.advisor import advise
    from placer.errors import PlacerError
    from placer.executor import stage_timeout
    from placer.report import infer_format, write_report

    try:
        kind = infer_format(output, fmt)
    except ValueError as exc:
        usage(str(exc))
    from placer.log import quiet

    step, display = progress_steps(sys.stderr.isatty() and not as_json and not quiet())
    try:
        with display, stage_timeout(stage_timeout_s):
            advised = advise(pipeline, size=size, budget_s=budget_s, target=target, objective=objective,
                             executor=executor, baselines=baselines, step=step, scheduler=scheduler,
                             progress=display if hasattr(display, "add_task") else None, precision=precision)
            if save is not None:  # before the report: a report that cannot be written loses nothing
                advised.save(save)
            with step(f"writing the report to {output}"):
                write_report(advised.facts, output, kind, pictures_dir=pictures)
            write_trace_file(trace, {"plan": advised.run, **advised.baselines})
    except PlacerError as exc:
        fail(error_line(exc) + _save_partial(exc, save))
    except (ValueError, KeyError) as exc:
        fail(f"{pipeline}: {error_line(exc).strip(chr(39))}")
    except OSError as exc:
        kept = f"; the profile, plan and runs are saved in {save}" if save is not None else ""
        fail(f"cannot write {exc.filename or output}: {exc.strerror or exc}{kept}")
    if as_json:
        print(json.dumps(summary_document(advised, output), indent=2))
        return
    _print(advised, output, save)


def _save_partial(exc, save: Path | None) -> str:
    """On a late failure, save what the flow made before it (profile, plan, the failed run) to ``--save``."""
    partial = getattr(exc, "advised", None)
    if partial is None:
        return ""
    if save is None:
        return "; rerun with --save DIR to keep the profile and plan made before the failure"
    try:
        written = partial.save(save)
    except OSError as err:
        return f"; saving the profile and plan to {save} failed too ({err.strerror or err})"
    return f"; kept {', '.join(sorted(written))} in {save}"


def _print(advised, output: Path, save: Path | None) -> None:
    from rich.console import Console

    from placer.report.render import fmt_seconds, fmt_speedup

    f = advised.facts
    c = Console()
    c.print(f"[bold]{f.summary.headline}[/]", highlight=False)
    for o in f.summary.options:
        extra = "" if o.key == "plan" else f"  plan is {fmt_speedup(o.plan_speedup_measured)} measured"
        c.print(f"  {o.title:<15} predicted {fmt_seconds(o.predicted_s):>9}  measured {fmt_seconds(o.measured_s):>9}"
                f"{extra}  {o.note}", highlight=False, markup=False)
    if f.bottleneck:
        c.print(f.bottleneck.sentence, highlight=False, markup=False)
    for a in f.advice:
        c.print(f"  - {a.text}", highlight=False, markup=False)
    if advised.stream_target_plans:
        from placer.cli.plan import print_stream_plan

        for sp in advised.stream_target_plans:  # asked with --target: what that machine would do
            print_stream_plan(sp)
    for sp in advised.stream_plans:  # with --scheduler: the cluster option, predicted and measured
        if sp.offload is not None:
            from placer.cli.plan import offload_lines

            for line in offload_lines(sp.offload):
                c.print(f"  {line}", highlight=False, markup=False)
    c.print(f"report written to {output}" + (f"; JSON saved in {save}" if save else ""), highlight=False)
