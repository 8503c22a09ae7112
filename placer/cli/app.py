"""The typer application every ``placer`` command registers on.

May import: typer, rich; placer.executor.stream.runner and placer.executor.engine only through
``sys.modules`` (to stop running streams and stages on Ctrl-C). Command modules import
the library lazily inside the command, so that ``placer --help`` stays fast.

Errors: :func:`fail` prints one ``placer: error:`` line and exits 1 (a failure) or, through
:func:`usage`, 2 (a bad option value); with ``--traceback`` it also prints the traceback,
the user's own frames included.

Global options (``--traceback``, ``-v``/``-vv``, ``-q``) are accepted before the command
(``placer -v run PIPE``) and after it (``placer run PIPE -v``): :func:`with_global_options`
adds them to every command. Option values and output paths are checked
by the callbacks here (:func:`positive_int`, :func:`positive_seconds`,
:func:`output_path`, :func:`output_folder`) before any work starts.

Ctrl-C: while a command runs, the first SIGINT stops every running stream (its
workers leave, its worker processes are killed) and every stage running on any lane
(:func:`placer.executor.engine.interrupt`), prints one line on stderr naming the
stages that were running, and ends the command with exit status 130 (128 + SIGINT),
unwinding normally so that threads and child processes are cleaned up; a second
SIGINT ends the process at once.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import traceback

import typer

app = typer.Typer(
    name="placer",
    help="Decide where each pipeline stage should run (CPU or GPU), prove it, run it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: exit statuses (documented in the README): success, a failure, a usage error, Ctrl-C
OK, FAILED, USAGE = 0, 1, 2
#: the exit status of a command stopped by Ctrl-C
INTERRUPTED = 128 + signal.SIGINT


class _Options:
    """Options of every command (``placer --traceback COMMAND`` or ``placer COMMAND --traceback``)."""

    traceback = False
    verbose = 0
    quiet = False

    def reset(self, *, traceback: bool, verbose: int, quiet: bool) -> None:
        self.traceback, self.verbose, self.quiet = traceback, verbose, quiet
        self.apply()

    def apply(self) -> None:
        """Set the log level from ``-v``/``-q`` as given so far."""
        from placer.log import configure

        configure(-1 if self.quiet else self.verbose)


options = _Options()


def fail(message: str, code: int = FAILED) -> None:
    """Print one line to stderr and exit non-zero.

    With ``--traceback``, the traceback of the exception being handled (the user's own
    code's frames included, through the chain of causes) comes first.
    """
    exc = sys.exc_info()[1]
    if options.traceback and exc is not None:
        traceback.print_exc(file=sys.stderr)
    elif _from_user_code(exc):
        message += " (rerun with --traceback to see your code's traceback)"
    print(f"placer: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _from_user_code(exc: BaseException | None) -> bool:
    """Whether ``exc`` wraps an exception raised outside placer (a stage's, a pipeline file's)."""
    from placer.errors import PlacerError

    cause = getattr(exc, "__cause__", None)
    return cause is not None and not isinstance(cause, (PlacerError, SystemExit, typer.Exit))


def usage(message: str) -> None:
    """A bad option value: one line, exit status 2."""
    fail(message, USAGE)


def error_line(exc: BaseException) -> str:
    """One line for an exception: its message's first line (pydantic errors: every field, in one line)."""
    from placer.errors import validation_line

    line = validation_line(exc)
    if line is not None:
        return line
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


# -- option checks (``callback=`` of typer options): each refuses in one line, exit 2 ----------------
def _name(param) -> str:
    return max(getattr(param, "opts", None) or [f"--{getattr(param, 'name', 'value')}"], key=len)


def positive_int(ctx: typer.Context, param, value):
    """A size or count: a whole number > 0 (or not given)."""
    if value is not None and value <= 0:
        usage(f"{_name(param)} must be a positive whole number, got {value}; leave it out for the default")
    return value


def positive_seconds(ctx: typer.Context, param, value):
    """Seconds: a finite number > 0 (or not given); refuses nan and inf."""
    if value is not None and not (math.isfinite(value) and value > 0):
        usage(f"{_name(param)} must be a finite number of seconds > 0, got {value:g}")
    return value


def _checked_path(param, value, check_name: str):
    """``value`` checked by ``placer.files.<check_name>`` (a refusal is a usage error)."""
    if value is not None:
        from placer import files
        from placer.errors import OutputPathError

        try:
            getattr(files, check_name)(value, _name(param))
        except OutputPathError as exc:
            usage(str(exc))
    return value


def output_path(ctx: typer.Context, param, value):
    """An output file: checked before any work starts (see :func:`placer.files.check_output`)."""
    return _checked_path(param, value, "check_output")


def output_folder(ctx: typer.Context, param, value):
    """An output folder: a directory, or one that can be made, checked before any work starts."""
    return _checked_path(param, value, "check_output_folder")


def scheduler_address(value: str | None) -> str | None:
    """``--scheduler``: checked before the command starts; a malformed address is a usage error (exit 2)."""
    if value is None:
        return None
    from placer.executor.distributed import SchedulerAddressError, check_address

    try:
        return check_address(value)
    except SchedulerAddressError as exc:
        usage(str(exc))


def stage_timeout_option():
    """``--stage-timeout SECONDS``: a stage that runs longer is stopped and the command fails naming it."""
    return typer.Option(None, "--stage-timeout", callback=positive_seconds, metavar="SECONDS",
                        help="Fail naming a stage (one batch, for a stream) that runs longer than this; finished "
                             "stages' outputs are kept. A stage in a worker process (--processes) is killed; one in "
                             "a thread is stopped when it runs Python code, else placer stops waiting for it "
                             "(docs/timeouts.md). Default: none; profiling bounds each stage call by twice "
                             "--budget-s, at least 30 s.")


class Interrupted(SystemExit):
    """Ctrl-C: the command unwinds and the process exits with status 130.

    A SystemExit rather than a KeyboardInterrupt, which click would turn into
    "Aborted!" and status 1.
    """

    def __init__(self) -> None:
        super().__init__(INTERRUPTED)


def _on_interrupt(signum, frame) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process at once
    runner = sys.modules.get("placer.executor.stream.runner")
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


def _version(value: bool) -> None:
    if value:
        from placer import __version__

        print(f"placer {__version__}")
        raise typer.Exit()


@app.callback()
def _every_command(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print placer's version and exit."),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True,
                                help="Log what each step does on stderr (-vv: debug detail)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only errors on stderr: no log, no placer warnings."),
    show_traceback: bool = typer.Option(
        False, "--traceback", help="On an error, also print its full traceback, your own code's frames included."),
) -> None:
    """Set the log level; handle Ctrl-C while the command runs (the previous handler is back afterwards)."""
    options.reset(traceback=show_traceback, verbose=verbose, quiet=quiet)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGINT, _on_interrupt)
    ctx.call_on_close(lambda: signal.signal(signal.SIGINT, previous))


# -- the global options, accepted after the command too ---------------------------------------------
GLOBAL_PANEL = "Global options (also before the command)"


def _set_traceback(ctx: typer.Context, param, value: bool) -> bool:
    options.traceback = options.traceback or bool(value)
    return value


def _add_verbose(ctx: typer.Context, param, value: int) -> int:
    if value:
        options.verbose += int(value)
        options.apply()
    return value


def _set_quiet(ctx: typer.Context, param, value: bool) -> bool:
    if value:
        options.quiet = True
        options.apply()
    return value


#: name -> the parameter every command gets (processed before the command's own options)
_GLOBAL_PARAMS = {
    "global_verbose": (int, typer.Option(0, "-v", "--verbose", count=True, callback=_add_verbose, is_eager=True,
                                         rich_help_panel=GLOBAL_PANEL,
                                         help="Log what each step does on stderr (-vv: debug detail).")),
    "global_quiet": (bool, typer.Option(False, "-q", "--quiet", callback=_set_quiet, is_eager=True,
                                        rich_help_panel=GLOBAL_PANEL,
                                        help="Only errors on stderr: no log, no placer warnings.")),
    "global_traceback": (bool, typer.Option(False, "--traceback", callback=_set_traceback, is_eager=True,
                                            rich_help_panel=GLOBAL_PANEL,
                                            help="On an error, also print its full traceback, your own code's "
                                                 "frames included.")),
}


def with_global_options(command):
    """``command`` taking ``--traceback``, ``-v``/``--verbose`` and ``-q``/``--quiet`` as well.

    They add to what was given before the command (``placer -v run PIPE -v`` is ``-vv``);
    their callbacks set them before the command's own options are checked.
    """
    import functools
    import inspect

    if getattr(command, "_placer_global_options", False):
        return command
    sig = inspect.signature(command)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        for name in _GLOBAL_PARAMS:
            kwargs.pop(name, None)
        return command(*args, **kwargs)

    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=default)
             for name, (kind, default) in _GLOBAL_PARAMS.items()]
    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
    wrapper.__annotations__ = {**getattr(command, "__annotations__", {}),
                               **{name: kind for name, (kind, _) in _GLOBAL_PARAMS.items()}}
    wrapper._placer_global_options = True
    return wrapper
