"""``placer tune [OPTIONS] -- COMMAND [ARGS...]``: loader advice for a script left as it is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from placer.cli.app import Interrupted, app, fail, output_path, positive_seconds


@app.command("tune", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def tune_command(
    command: list[str] = typer.Argument(None, metavar="-- COMMAND [ARGS...]",
                                        help="Your command, unchanged: placer tune -- python train.py --epochs 3 "
                                             "(or placer tune train.py ARGS)."),
    budget_s: float = typer.Option(120.0, "--budget-s", callback=positive_seconds,
                                   help="Seconds all the script's runs may take (about)."),
    window_s: float = typer.Option(2.0, "--window-s", callback=positive_seconds,
                                   help="Seconds of your loop each run counts at least (at the script's own speed)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_path,
                                help="Save the result (JSON) here; --apply reads it."),
    apply: Path = typer.Option(None, "--apply", metavar="FILE",
                               help="Run the command to its end with the recommendation saved in FILE."),
    allow_reorder: bool = typer.Option(False, "--allow-reorder",
                                       help="Also try in_order=False (batches as the workers finish them: their "
                                            "order then varies from run to run) for the fastest settings."),
    no_cache: bool = typer.Option(False, "--no-cache",
                                  help="Do not look for a cache inside the Dataset (a method whose output the "
                                       "epochs repeat)."),
) -> None:
    """Tune the DataLoader of an unchanged script by running it: workers, prefetch, pinning, torch threads,
    and a cache inside its Dataset.

    The script runs several times, each stopped after enough batches of its loop; PLACER_TUNING=1
    is set in those runs, so a script may skip checkpoints and uploads while it is tuned.
    """
    from placer.tune.runs import TuneError, python_command

    try:
        cmd = python_command(list(command or []))
    except TuneError as exc:
        fail(str(exc))
    if apply is not None:
        _apply(cmd, apply)
        return
    _tune(cmd, budget_s=budget_s, window_s=window_s, as_json=as_json, output=output, cache=not no_cache,
          allow_reorder=allow_reorder)


def _apply(cmd: list[str], saved: Path) -> None:
    from placer.tune.runs import run_script
    from placer.tune.words import recommendation

    try:
        site, settings = recommendation(json.loads(saved.read_text()))
    except OSError as exc:
        fail(f"--apply: cannot read {saved}: {exc.strerror}")
    except ValueError as exc:
        fail(f"--apply: {saved}: {exc}")
    cache = settings.pop("cache", None)
    run = run_script(cmd, {"mode": "apply", "target": site, "settings": settings, "cache": cache}, timeout_s=None,
                     trial=False, capture=False)
    built = [r for r in run.loaders if r["site"] == site]
    if not built:
        print(f"placer tune: the script built no DataLoader at {site}: the saved settings were not applied",
              file=sys.stderr)
    elif cache is not None and not any((r.get("cache") or {}).get("applied") for r in built):
        why = next(((r.get("cache") or {}).get("reason") for r in built if r.get("cache")), None) or "not reached"
        print(f"placer tune: the cache of {cache['method']} was not applied ({why})", file=sys.stderr)
    raise typer.Exit(run.returncode or 0)


def _tune(cmd: list[str], *, budget_s: float, window_s: float, as_json: bool, output: Path | None,
          cache: bool, allow_reorder: bool = False) -> None:
    """Search, then show the result; on Ctrl-C (app's handler: :class:`Interrupted`, exit status 130), the
    running script's process group has been ended by the time it gets here, and what the search measured
    is shown and saved, marked interrupted (:func:`placer.tune.stopping.stopped`)."""
    from placer.tune.runs import TuneError
    from placer.tune.search import TuneState, tune
    from placer.tune.stopping import stopped
    from placer.tune.words import describe, to_json, unmeasured

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    state = TuneState()
    try:
        result = tune(cmd, budget_s=budget_s, window_s=window_s, progress=progress, cache=cache,
                      allow_reorder=allow_reorder, state=state)
    except TuneError as exc:
        fail(str(exc))
    except Interrupted:
        partial = stopped(state)
        lines, data = (describe(partial), to_json(partial)) if partial is not None else unmeasured(state)
        _show(lines, data, as_json=as_json, output=output)
        kept = "" if data["recommended"] is None else " (the settings its completed rounds decided)"
        print(f"placer tune: stopped; what it measured is shown above{kept}"
              + (f" and saved in {output}" if output is not None else ""), file=sys.stderr)
        raise
    _show(describe(result), to_json(result), as_json=as_json, output=output)


def _show(lines: list[str], data: dict, *, as_json: bool, output: Path | None) -> None:
    """Save the result (atomically: a reader never sees half of it) and print it."""
    from placer.files import write_text_atomic

    if output is not None:
        write_text_atomic(output, json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2) if as_json else "\n".join(lines), flush=True)
