"""``placer check``: a CI gate on the placement and the stages' speed against a saved baseline.

May import: typer, rich, placer.cli.app, placer.cli.options; placer.check inside the command.

Exit status: 0 the check passed (or ``--update`` wrote the baseline); 1 the best
placement changed or a stage got slower (the diff says which); 2 the check could not
be made (no baseline, bad options).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from placer.cli.app import app, fail
from placer.cli.options import build_param_option

#: exit status when the check finds a regression
REGRESSION = 1


@app.command("check")
@build_param_option
def check_command(
    pipeline: str = typer.Argument(..., help="A .py file exposing build(size=None, **params), or module:function."),
    baseline: Path = typer.Option(..., "--baseline", help="The baseline folder (written by --update or "
                                                          "`placer advise --save`).", file_okay=False),
    update: bool = typer.Option(False, "--update", help="Measure now and write the baseline instead of comparing."),
    size: int = typer.Option(None, "--size", help="Size to plan and run at (default: the baseline's)."),
    budget_s: float = typer.Option(None, "--budget-s", help="Profiling time budget in seconds (default: the "
                                                            "baseline's, else 30)."),
    tolerance: float = typer.Option(0.5, "--tolerance", min=0.0, help="Smallest slow-down that fails the check "
                                                                      "(0.5: 50% slower)."),
    noise_k: float = typer.Option(3.0, "--noise-k", min=0.0, help="A slow-down must also exceed this many times "
                                                                  "the measured noise (IQR/median)."),
    min_seconds: float = typer.Option(1e-3, "--min-seconds", min=0.0,
                                      help="Stages faster than this (both times) are never called slower."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON document."),
) -> None:
    """Re-profile, re-plan and run PIPELINE; fail when the best placement changed or a stage got slower."""
    from placer.check import check
    from placer.errors import PlacerError

    try:
        result = check(pipeline, baseline, size=size, budget_s=budget_s, update=update, tolerance=tolerance,
                       noise_k=noise_k, min_seconds=min_seconds)
    except PlacerError as exc:
        fail(str(exc).splitlines()[0], 2)
    except (ValueError, TypeError) as exc:
        fail(f"{pipeline}: {exc}", 2)
    if as_json:
        print(json.dumps({**result.model_dump(mode="json"), "lines": result.lines()}, indent=1))
    elif update:
        at = "its own size" if result.size is None else f"size {result.size}"
        print(f"baseline written to {baseline}: {result.pipeline} at {at}, "
              f"makespan {result.current_makespan_s:.4g} s")
    else:
        for line in result.lines():
            print(line)
    if not result.passed:
        raise typer.Exit(REGRESSION)
