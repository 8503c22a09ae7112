"""``placer describe``: write a description of this machine (CPU, GPUs, links) to plan for it anywhere."""

from __future__ import annotations

from pathlib import Path

import typer

from placer.cli.app import app, fail


@app.command("describe")
def describe_command(
    output: Path = typer.Option(..., "-o", "--output", help="Write the description (JSON) here."),
    budget_s: float = typer.Option(30.0, "--budget-s", help="Seconds the calibration may take (about)."),
    name: str = typer.Option(None, "--name", help="What to call the machine (default: its host name and CPU)."),
) -> None:
    """Measure this machine briefly (a few ops on the CPU and each GPU, copies) and write its description.

    Plan for it from any machine with ``--target FILE`` (``placer plan``, ``advise``, ``profile``).
    """
    from placer.errors import PlacerError
    from placer.target.calibrate import describe_machine

    if budget_s <= 0:
        fail(f"--budget-s must be positive, got {budget_s:g}")
    try:
        target = describe_machine(budget_s=budget_s, name=name)
        target.save(output)
    except PlacerError as exc:
        fail(str(exc).splitlines()[0])
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}")
    cpu = target.cpu
    print(f"wrote {output}: {target.name}; CPU {cpu.model}, {cpu.cores} cores, {len(cpu.ops)} ops timed; "
          f"{len(target.gpus)} GPU{'s' if len(target.gpus) != 1 else ''}")
