"""``placer report``: write a placement report, from a pipeline or from saved JSON.

May import: typer, placer.cli.app; the library lazily, inside the command.
"""

from __future__ import annotations

from pathlib import Path

import typer

from placer.cli.app import app, error_line, fail, output_path, positive_int, positive_seconds, usage


def parse_baselines(items: list[str] | None) -> dict[str, Path]:
    """``all_cpu=run-cpu.json`` items into a mapping; raise ValueError naming a bad item."""
    out = {}
    for item in items or []:
        key, sep, path = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in ("all_cpu", "all_gpu", "rule_of_thumb"):
            raise ValueError(f"--baseline {item!r}: use all_cpu=FILE, all_gpu=FILE or rule_of_thumb=FILE")
        out[key] = Path(path)
    return out


@app.command("report")
def report_command(
    pipeline: str = typer.Argument(None, help="A .py file exposing build(size=None, **params), or module:function."),
    output: Path = typer.Option(..., "-o", "--output", callback=output_path, help="Report file (.html, .md or .json)."),
    size: int = typer.Option(None, "--size", callback=positive_int, help="Size to plan and run at (rows, batch, ...)."),
    fmt: str = typer.Option(None, "--format", help="html, md or json (default: from the file's suffix)."),
    budget_s: float = typer.Option(30.0, "--budget-s", callback=positive_seconds, help="Profiling time budget in seconds."),
    target: str = typer.Option("auto", "--target", help="h200, none, or auto (h200 when this machine has no GPU)."),
    plan: Path = typer.Option(None, "--plan", help="Report on this saved plan (JSON) instead of planning."),
    run: Path = typer.Option(None, "--run", help="Report on this saved run (JSON)."),
    baseline: list[str] = typer.Option(None, "--baseline", help="A saved baseline run: all_cpu=FILE (repeatable)."),
    costs: Path = typer.Option(None, "--costs", help="A saved cost table (JSON), for bytes and other devices' times."),
    facts: Path = typer.Option(None, "--from", help="Render a saved report JSON again (e.g. as HTML)."),
    pictures: bool = typer.Option(False, "--pictures", help="Markdown: also write the pictures as SVG files."),
) -> None:
    """Write a report: what runs where, why, how long, and what to change.

    Give PIPELINE to profile, plan and run it now; or --plan/--run (and --baseline)
    to report on saved results; or --from to re-render a saved report. Saved files
    must be of one pipeline, and --run the run of --plan's placement (other runs go
    in --baseline); a malformed file or a mismatch is refused in one line naming the
    files, and nothing is written.
    """
    from placer.errors import PlacerError
    from placer.report import infer_format, load_facts, report, write_report

    saved = any(x is not None for x in (plan, run, costs)) or bool(baseline)
    if sum([pipeline is not None, saved, facts is not None]) != 1:
        usage("give exactly one of: a PIPELINE, saved results (--plan/--run/--baseline/--costs), or --from REPORT.json")
    try:
        kind = infer_format(output, fmt)
        if facts is not None:
            write_report(load_facts(facts), output, kind, pictures_dir=pictures)
        elif saved:
            report(output, plan=plan, run=run, baselines=parse_baselines(baseline), costs=costs,
                   format=kind, pictures=pictures)
        else:
            from placer.advisor import advise

            advised = advise(pipeline, size=size, budget_s=budget_s, target=target)
            write_report(advised.facts, output, kind, pictures_dir=pictures)
    except PlacerError as exc:
        fail(error_line(exc))
    except (ValueError, KeyError) as exc:
        fail(error_line(exc).strip("'\""))
    print(f"report written to {output}")
