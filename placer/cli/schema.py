"""``placer schema NAME``: the JSON Schema of one of the files placer writes and reads.

May import: typer, placer.cli.app; placer.data.documents inside the command.
"""

from __future__ import annotations

import json

import typer

from placer.cli.app import app, fail


@app.command("schema")
def schema_command(
    name: str = typer.Argument(..., help="profile, costs, plan, run, report or stream-plan."),
) -> None:
    """Print the JSON Schema of a placer file (from its pydantic model); see docs/schemas.md."""
    from placer.data.documents import json_schema

    try:
        doc = json_schema(name)
    except KeyError as exc:
        fail(str(exc).strip("'\""), 2)
    print(json.dumps(doc, indent=2, sort_keys=False))
