"""Loading a pipeline from a ``.py`` file or a ``module:function`` reference.

May import: importlib, placer.pipeline, placer.errors.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from placer.errors import PlacerError
from placer.pipeline import Pipeline, as_pipeline


def load_builder(ref: str):
    """The ``build`` function a reference names (a path to a .py file, or module:function)."""
    path = Path(ref)
    if ref.endswith(".py") or path.is_file():
        if not path.is_file():
            raise PlacerError(f"pipeline file {ref!r} does not exist")
        # a name stable across processes (numba's on-disk cache looks functions up by module)
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        modname = f"placer_user_{path.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(modname, None)
            raise PlacerError(f"pipeline file {ref!r} failed to import: {type(exc).__name__}: {exc}") from exc
        fn = getattr(module, "build", None)
        if fn is None:
            raise PlacerError(f"pipeline file {ref!r} has no build(size=None, **params) function")
        return fn
    mod, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(mod)
    except Exception as exc:
        raise PlacerError(f"cannot import pipeline module {mod!r}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr or "build", None)
    if fn is None:
        raise PlacerError(f"module {mod!r} has no function {attr or 'build'!r}")
    return fn


def load_pipeline(ref: str, size: int | None = None, **params: Any) -> Pipeline:
    """Build the pipeline a reference names, at ``size``."""
    build = load_builder(ref)
    kwargs = dict(params)
    if "size" in inspect.signature(build).parameters:
        kwargs["size"] = size
    try:
        built = build(**kwargs)
    except PlacerError:
        raise
    except Exception as exc:
        raise PlacerError(
            f"{ref}: build({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    p = as_pipeline(built, name=Path(ref).stem if ref.endswith(".py") else ref)
    if p.size is None:
        p.size = size
    return p
