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


def main() -> None:
    """The ``placer`` command: exit 0 on success, 1 on a failure, 2 on a usage error, 130 on Ctrl-C.

    An exception no command expected still ends in one line (and exit 1); ``placer
    --traceback ...`` shows where it came from.
    """
    import sys

    from placer.cli.app import options

    try:
        app()
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a dump
        if options.traceback or "--traceback" in sys.argv[1:2]:
            import traceback

            traceback.print_exc()
        print(f"placer: error: unexpected {type(exc).__name__}: {' '.join(str(exc).split())}"
              + ("" if options.traceback else "; rerun as `placer --traceback ...` to see where"),
              file=sys.stderr)
        sys.exit(1)


__all__ = ["app", "main"]
