"""placer's logger, and how the command line turns it up or down.

May import: logging, sys, warnings; placer.warnings.

The library never prints: it logs to ``logging.getLogger("placer")`` (children such
as ``placer.profile`` propagate to it) and warns with the categories of
:mod:`placer.warnings`. Like any library it leaves configuration to the
application: without a handler nothing is shown below WARNING. In a notebook or a
script::

    import logging
    logging.basicConfig()
    logging.getLogger("placer").setLevel(logging.INFO)   # what each step does and how long it took

The ``placer`` command configures it with :func:`configure` from ``-v``/``-q``.
"""

from __future__ import annotations

import logging
import sys
import warnings

#: the logger every placer module logs to (or a child of it)
logger = logging.getLogger("placer")

#: ``-q`` → errors only; default → warnings; ``-v`` → info; ``-vv`` → debug
LEVELS = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}

_HANDLER_NAME = "placer-cli"


def get_logger(name: str) -> logging.Logger:
    """The logger of a placer module: ``get_logger(__name__)`` gives ``placer.<module>``.

    Parameters
    ----------
    name : str
        A module's ``__name__``; names outside ``placer`` get a child of it.

    Examples
    --------
    >>> get_logger("placer.advisor").name, get_logger("mine").name
    ('placer.advisor', 'placer.mine')
    """
    return logging.getLogger(name if name == "placer" or name.startswith("placer.") else f"placer.{name}")


def quiet() -> bool:
    """True when only errors are to be shown (``placer -q``): progress displays stay off too."""
    return logger.getEffectiveLevel() >= logging.ERROR


def configure(verbosity: int = 0, stream=None) -> logging.Logger:
    """Show placer's log on ``stream`` (default stderr) at the level ``verbosity`` selects.

    Parameters
    ----------
    verbosity : int
        ``-1`` (``-q``): errors only, and placer's warnings are not shown; ``0``:
        warnings; ``1`` (``-v``): info; ``2`` or more (``-vv``): debug.
    stream : file, optional
        Where the lines go (default ``sys.stderr``).

    Returns
    -------
    logging.Logger
        The ``placer`` logger, with one handler of its own (replaced on a second call).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> log = configure(1, out)
    >>> get_logger("placer.demo").info("planned in %.1f s", 0.25)
    >>> out.getvalue()
    'placer: planned in 0.2 s\\n'
    >>> log.removeHandler(log.handlers[-1]); log.setLevel(logging.NOTSET)  # as it was
    """
    level = LEVELS[max(-1, min(verbosity, 2))]
    for h in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("placer: %(message)s" if level > logging.DEBUG
                                           else "placer: %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    if verbosity < 0:
        from placer.warnings import PlacerWarning

        warnings.simplefilter("ignore", PlacerWarning)
    return logger


logger.addHandler(logging.NullHandler())
