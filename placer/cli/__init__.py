"""Command-line interface: ``placer COMMAND``. Each command lives in its own module."""

from __future__ import annotations

from placer.cli.app import app

# each import registers its commands on ``app``
from placer.cli import devices as _devices  # noqa: E402,F401
from placer.cli import run as _run  # noqa: E402,F401
from placer.cli import plan as _plan  # noqa: E402,F401
from placer.cli import profile as _profile  # noqa: E402,F401
from placer.cli import report as _report  # noqa: E402,F401
from placer.cli import advise as _advise  # noqa: E402,F401
from placer.cli import schema as _schema  # noqa: E402,F401
from placer.cli import check as _check  # noqa: E402,F401
from placer.cli import describe as _describe  # noqa: E402,F401
from placer.cli import tune as _tune  # noqa: E402,F401
from placer.cli.app import with_global_options  # noqa: E402

for _info in app.registered_commands:  # --traceback, -v and -q after the command as well
    _info.callback = with_global_options(_info.callback)


def main() -> None:
    """The ``placer`` command: exit 0 on success, 1 on a failure, 2 on a usage error, 130 on Ctrl-C.

    An exception no command expected still ends in one line (and exit 1); ``placer
    --traceback ...`` shows where it came from. A command that gave up on a stage stuck
    in a call Python cannot interrupt (a stage timeout) ends the process at once, so
    that threads the stage started (dask's local threads, a thread pool, joined at
    exit) cannot hold it up.
    """
    import sys

    from placer.cli.app import options

    try:
        app()
    except SystemExit as exc:
        _end_now_if_stages_are_stuck(exc.code)
        raise
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a dump
        if options.traceback or "--traceback" in sys.argv[1:]:  # also when parsing never got to it
            import traceback

            traceback.print_exc()
        print(f"placer: error: unexpected {type(exc).__name__}: {' '.join(str(exc).split())}"
              + ("" if options.traceback else "; rerun with --traceback to see where"),
              file=sys.stderr)
        _end_now_if_stages_are_stuck(1)
        sys.exit(1)


def _end_now_if_stages_are_stuck(code) -> None:
    """``os._exit(code)`` (after flushing) when a stage's thread was abandoned and still runs."""
    import os
    import sys

    stagecall = sys.modules.get("placer.executor.stagecall")
    if stagecall is None or not stagecall.abandoned_stages():
        return
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


__all__ = ["app", "main"]
