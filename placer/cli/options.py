"""Options several commands share: ``-p/--param key=value`` for ``build()``, and ``--trace FILE``.

May import: typer, placer.cli.app; placer.loader (inside functions).

:func:`build_param_option` adds ``-p/--param`` to a command: each ``key=value`` is
typed from ``build()``'s annotation of ``key`` (or its default's type), checked
against the names ``build()`` takes, and handed to every ``build()`` call the
command makes (profiling builds the pipeline at several sizes: each build gets
them), through :func:`placer.loader.build_params`.
"""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from placer.cli.app import fail, output_path

#: exit status of a usage error (click's)
USAGE = 2

PARAM_HELP = ("Pass KEY=VALUE to the pipeline's build() (repeatable); typed from build()'s annotations, "
              "e.g. -p epochs=5 -p seed=1.")
TRACE_HELP = "Write the measured timeline as a Chrome trace (JSON; open in Perfetto or chrome://tracing)."


def _base_type(annotation: Any, default: Any) -> Any:
    """The type a value converts to: ``int`` for ``int | None``, the default's type when unannotated."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return type(default) if default not in (inspect.Parameter.empty, None) else None
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def convert(text: str, kind: Any) -> Any:
    """``text`` as a value of ``kind`` (int, float, bool, str; anything else: JSON, else the text).

    >>> convert("3", int), convert("0.5", float), convert("no", bool), convert("[1, 2]", None)
    (3, 0.5, False, [1, 2])
    """
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if kind in (int, float, str):
        return kind(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_params(build: Callable[..., Any], items: list[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` as typed keyword arguments of ``build``.

    Raises
    ------
    ValueError
        An item without ``=``, a name ``build`` does not take (the message lists the
        ones it does), or a value that does not convert to its parameter's type.
    """
    if not items:
        return {}
    sig = inspect.signature(build)
    try:
        hints = typing.get_type_hints(build)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to the defaults' types
        hints = {}
    takes = {n: p for n, p in sig.parameters.items()
             if n != "size" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_ended = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"-p {item!r}: write KEY=VALUE, e.g. -p seed=1")
        if key not in takes and not open_ended:
            accepted = ", ".join(takes) or "no parameters besides size"
            raise ValueError(f"build() takes no parameter {key!r}; it accepts: {accepted}")
        p = takes.get(key)
        kind = _base_type(hints.get(key, p.annotation if p else inspect.Parameter.empty),
                          p.default if p else inspect.Parameter.empty)
        try:
            out[key] = convert(text, kind if isinstance(kind, type) else None)
        except ValueError as exc:
            raise ValueError(f"-p {item}: {key} takes {getattr(kind, '__name__', kind)}: {exc}") from None
    return out


def build_param_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``-p/--param KEY=VALUE`` to a typer command whose first argument is ``pipeline``.

    The command runs with the parameters in effect for every ``build()`` call
    (:func:`placer.loader.build_params`). A malformed item, an unknown name or a bad
    value ends the command with exit status 2 and a line naming the parameter.
    """
    sig = inspect.signature(command)
    extra = inspect.Parameter("build_params", inspect.Parameter.KEYWORD_ONLY, annotation=typing.Optional[list[str]],
                              default=typer.Option(None, "-p", "--param", help=PARAM_HELP, metavar="KEY=VALUE"))

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from placer.errors import PlacerError
        from placer.loader import build_params, load_builder

        items = kwargs.pop("build_params", None)
        ref = kwargs.get("pipeline")
        values: dict[str, Any] = {}
        if items:
            if ref is None:
                fail("-p/--param needs a PIPELINE to pass its parameters to", USAGE)
            try:
                values = parse_params(load_builder(ref), items)
            except PlacerError as exc:
                fail(str(exc).splitlines()[0])
            except ValueError as exc:
                fail(f"{ref}: {exc}", USAGE)
        with build_params(**values):
            return command(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])
    wrapper.__annotations__ = {**command.__annotations__, "build_params": typing.Optional[list[str]]}
    return wrapper


def trace_option() -> Any:
    """The ``--trace FILE`` option of ``placer run`` and ``placer advise`` (checked before any work)."""
    return typer.Option(None, "--trace", help=TRACE_HELP, dir_okay=False, callback=output_path)


def write_trace_file(path: Path | None, runs: Any) -> None:
    """Write the timeline of ``runs`` (a Run, or ``{label: Run}``) to ``path`` as a Chrome trace.

    Nothing when ``path`` is None.
    """
    if path is None or not runs:
        return
    from placer.trace import write_trace

    write_trace(runs, path)
