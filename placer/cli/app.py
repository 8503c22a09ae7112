"""The typer application every ``placer`` command registers on.

May import: typer, rich; placer.stream.runner and placer.executor.engine only through
``sys.modules`` (to stop running streams and stages on Ctrl-C). Command modules import
the library lazily inside the command, so that ``placer --help`` stays fast.

Ctrl-C: while a command runs, the first SIGINT stops every running stream (its
workers leave, its worker processes are killed) and every stage running on any lane
(:func:`placer.executor.engine.interrupt`), prints one line on stderr naming the
stages that were running, and ends the command with exit status 130 (128 + SIGINT),
unwinding normally so that threads and child processes are cleaned up; a second
SIGINT ends the process at once.
"""

from __future__ import annotations

import signal
import sys
import threading

import typer

app = typer.Typer(
    name="placer",
    help="Decide where each pipeline stage should run (CPU or GPU), prove it, run it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: the exit status of a command stopped by Ctrl-C
INTERRUPTED = 128 + signal.SIGINT


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit non-zero."""
    print(f"placer: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def scheduler_address(value: str | None) -> str | None:
    """``--scheduler``: checked before the command starts; a malformed address is a usage error (exit 2)."""
    if value is None:
        return None
    from placer.executor.distributed import SchedulerAddressError, check_address

    try:
        return check_address(value)
    except SchedulerAddressError as exc:
        fail(str(exc), code=2)


def _positive_seconds(value: float | None) -> float | None:
    if value is not None and not (0 < value < float("inf")):
        fail(f"--stage-timeout must be a positive number of seconds, got {value}", code=2)
    return value


def stage_timeout_option():
    """``--stage-timeout SECONDS``: a stage that runs longer is stopped and the command fails naming it."""
    return typer.Option(None, "--stage-timeout", callback=_positive_seconds, metavar="SECONDS",
                        help="Stop a stage that runs longer than this and fail naming it; finished stages' "
                             "outputs are kept (default: none; profiling bounds each stage by the budget).")


class Interrupted(SystemExit):
    """Ctrl-C: the command unwinds and the process exits with status 130.

    A SystemExit rather than a KeyboardInterrupt, which click would turn into
    "Aborted!" and status 1.
    """

    def __init__(self) -> None:
        super().__init__(INTERRUPTED)


def _on_interrupt(signum, frame) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process at once
    runner = sys.modules.get("placer.stream.runner")
    if runner is not None:
        runner.interrupt()
    engine = sys.modules.get("placer.executor.engine")
    running = engine.interrupt() if engine is not None else []
    said = "placer: interrupted"
    if running:
        said += (f" while stage{'s' if len(running) > 1 else ''} {', '.join(map(repr, running))} "
                 f"{'were' if len(running) > 1 else 'was'} running (stopped; finished stages' outputs are kept)")
    try:
        print(said, file=sys.stderr, flush=True)
    except (OSError, RuntimeError):
        pass  # stderr closed, or busy in this very thread
    raise Interrupted()


@app.callback()
def _every_command(ctx: typer.Context) -> None:
    """Handle Ctrl-C while the command runs; the previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGINT, _on_interrupt)
    ctx.call_on_close(lambda: signal.signal(signal.SIGINT, previous))
