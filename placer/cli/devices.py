"""``placer devices``: what this machine has, and why a GPU backend is unavailable."""

from __future__ import annotations

import json

import typer

from placer.cli.app import app


@app.command("devices")
def devices(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    """Show the devices placer can run stages on."""
    from placer.devices import discover

    inv = discover()
    if as_json:
        print(json.dumps(inv.model_dump(mode="json"), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Devices")
    for col in ("name", "kind", "description", "workers", "memory", "backends"):
        t.add_column(col)
    for d in inv.devices:
        mem = f"{d.memory_bytes / 2**30:.1f} GiB" if d.memory_bytes else "?"
        kind = "simulated (not a GPU)" if d.simulated else d.kind
        t.add_row(d.name, kind, d.label, str(d.workers), mem, ", ".join(d.backends))
    c = Console()
    c.print(t)
    for backend, why in inv.unavailable.items():
        c.print(f"[yellow]{backend} unavailable:[/] {why}")
