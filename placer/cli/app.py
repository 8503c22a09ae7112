"""The typer application every ``placer`` command registers on.

May import: typer, rich. Command modules import the library lazily inside the
command, so that ``placer --help`` stays fast.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="placer",
    help="Decide where each pipeline stage should run (CPU or GPU), prove it, run it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit non-zero."""
    print(f"placer: error: {message}", file=sys.stderr)
    raise typer.Exit(code)
