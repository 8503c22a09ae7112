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
from placer.cli import describe as _describe  # noqa: E402,F401


def main() -> None:
    app()


__all__ = ["app", "main"]
