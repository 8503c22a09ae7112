"""Loading a pipeline from a ``.py`` file or a ``module:function`` reference.

May import: importlib, contextvars, placer.pipeline, placer.errors.

Where modules are looked up
---------------------------
A pipeline file is imported with its own folder first on ``sys.path``, so it can
import a helper module next to it (``import helpers``); when that folder is a package
(it has an ``__init__.py``), the folder holding the top package comes next, so a file
of the bundled ``pipelines/`` can import its siblings as ``pipelines.mnist_cnn``
wherever the command runs. A ``module:function``
reference is looked up with the current directory first on ``sys.path``, as
``python -m`` does, so ``pipelines.mine:build`` finds ``./pipelines/mine.py`` even
when another ``pipelines`` package is installed, and the ``placer`` command finds
modules of the directory it runs in.

Either folder is on ``sys.path`` only while the module loads: ``sys.path`` is the
same afterwards, so loading a pipeline never changes which modules the rest of the
process imports. Modules imported during the load stay in ``sys.modules``, so the
stages keep using them, and a stage that imports such a module again at run time
(``import helpers`` inside the stage function) gets the loaded one. A helper module
that a stage imports for the first time at run time is not found there; import it at
the top of the pipeline file.

A folder with an ``__init__.py`` (``placer run mypipe``) is loaded from that file,
under a generated name, so a folder named like a standard-library module (``json``,
``queue``) loads the user's code, not the library's; so does ``module:function`` when
the current directory has ``module.py`` and a module of that name is already imported.
A pipeline file that calls ``sys.exit()`` while it is imported or inside ``build()`` is
an error (it would otherwise end the command with nothing done).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from placer.errors import PlacerError, validation_line
from placer.pipeline import Pipeline, as_pipeline

#: keyword arguments every ``build()`` call gets (``placer run -p seed=1``); see :func:`build_params`
_BUILD_PARAMS: ContextVar[dict[str, Any]] = ContextVar("placer_build_params", default={})


@contextmanager
def build_params(**params: Any) -> Iterator[dict[str, Any]]:
    """Pass ``params`` to every ``build()`` that :func:`load_pipeline` calls inside the block.

    This is how ``placer run|advise|plan|profile -p KEY=VALUE`` reaches the pipeline:
    the profiler builds it at several sizes, and each build gets the parameters.
    Keywords given to :func:`load_pipeline` itself win; blocks nest.

    Parameters
    ----------
    **params
        Keyword arguments for ``build()`` (``size`` is set by the caller).

    Examples
    --------
    >>> with build_params(seed=1) as given:
    ...     given
    {'seed': 1}
    """
    merged = {**_BUILD_PARAMS.get(), **params}
    token = _BUILD_PARAMS.set(merged)
    try:
        yield merged
    finally:
        _BUILD_PARAMS.reset(token)


@contextmanager
def _first_on_path(*folders: str) -> Iterator[None]:
    """``folders`` first on ``sys.path`` (in that order) inside the block, and gone again after it."""
    sys.path[0:0] = folders
    try:
        yield
    finally:
        for folder in folders:
            try:
                sys.path.remove(folder)  # the first occurrence: the one inserted above
            except ValueError:
                pass  # the module removed it itself


def _import_roots(path: Path) -> list[str]:
    """The file's folder, and when that folder is a package, the folder its top package sits in.

    So ``pipelines/cifar_augment.py`` can import ``helpers`` beside it and also
    ``from pipelines.mnist_cnn import cnn``, as under pytest's rootdir rule.
    """
    folder = path.resolve().parent
    roots = [str(folder)]
    top = folder
    while (top / "__init__.py").is_file() and top.parent != top:
        top = top.parent
    if top != folder:
        roots.append(str(top))
    return roots


def _reason(exc: BaseException) -> str:
    """``Type: message`` of a user's exception, a pydantic error in one line naming every field."""
    line = validation_line(exc)
    if line is not None:
        return f"ValidationError: {line}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _exit_error(ref: str, where: str, exc: SystemExit) -> PlacerError:
    code = exc.code
    return PlacerError(
        f"pipeline file {ref!r} called sys.exit({code!r}) {where}; a pipeline file must define "
        "build() and return the pipeline, not exit (move script code under `if __name__ == \"__main__\":`)"
    )


def _load_file(ref: str):
    """The module of the pipeline file ``ref`` (or package folder), imported under a generated name."""
    path = Path(ref)
    package = path.is_dir() and (path / "__init__.py").is_file()
    if package:
        path = path / "__init__.py"
    elif path.is_dir():
        raise PlacerError(f"{ref!r} is a folder without __init__.py; give the pipeline's .py file")
    if not path.is_file():
        raise PlacerError(f"pipeline file {ref!r} does not exist")
    # a name stable across processes (numba's on-disk cache looks functions up by module)
    stem = path.parent.name if package else path.stem
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    modname = f"placer_user_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(
        modname, path, submodule_search_locations=[str(path.parent)] if package else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    roots = _import_roots(path.parent if package else path)
    try:
        with _first_on_path(*roots):
            spec.loader.exec_module(module)
    except SystemExit as exc:
        sys.modules.pop(modname, None)
        raise _exit_error(ref, "while it was imported", exc) from exc
    except Exception as exc:
        sys.modules.pop(modname, None)
        raise PlacerError(f"pipeline file {ref!r} failed to import: {_reason(exc)}") from exc
    return module


def _shadowed_local(mod: str) -> Path | None:
    """The current directory's file or package for ``mod`` when an already imported module
    of that name (the standard library's ``json``, say) would be found instead."""
    top = mod.partition(".")[0]
    loaded = sys.modules.get(top)
    if loaded is None or "." in mod:
        return None
    here = Path.cwd()
    for candidate in (here / f"{mod}.py", here / mod / "__init__.py"):
        if candidate.is_file():
            where = getattr(loaded, "__file__", None)
            if where is None or Path(where).resolve() != candidate.resolve():
                return candidate if candidate.name != "__init__.py" else candidate.parent
    return None


def _import_module(mod: str):
    """The module ``mod``, looked up with the current directory first on ``sys.path``."""
    try:
        with _first_on_path(os.getcwd()):
            return importlib.import_module(mod)
    except Exception as exc:
        msg = f"cannot import pipeline module {mod!r}: {type(exc).__name__}: {exc}"
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and (mod == missing or mod.startswith(missing + ".")):
            msg += f" (looked in the current directory {os.getcwd()} and on sys.path"
            parent = sys.modules.get(missing.rpartition(".")[0])
            if getattr(parent, "__file__", None):
                msg += f"; {parent.__name__!r} is {parent.__file__}"
            msg += f"); to load a pipeline file, pass its path, e.g. path/to/{mod.rpartition('.')[2]}.py"
        raise PlacerError(msg) from exc


def load_builder(ref: str):
    """The ``build`` function a reference names (a path to a .py file, or module:function)."""
    if ref.endswith(".py") or Path(ref).is_file() or Path(ref).is_dir():
        fn = getattr(_load_file(ref), "build", None)
        if fn is None:
            raise PlacerError(f"pipeline file {ref!r} has no build(size=None, **params) function")
        return fn
    mod, _, attr = ref.partition(":")
    local = _shadowed_local(mod)
    fn = getattr(_load_file(str(local)) if local is not None else _import_module(mod), attr or "build", None)
    if fn is None:
        raise PlacerError(f"module {mod!r} has no function {attr or 'build'!r}")
    return fn


def current_build_params() -> dict[str, Any]:
    """The keyword arguments :func:`build_params` gives every ``build()`` here (a copy)."""
    return dict(_BUILD_PARAMS.get())


def load_pipeline(ref: str, size: int | None = None, **params: Any) -> Pipeline:
    """Build the pipeline a reference names, at ``size``.

    Parameters
    ----------
    ref : str
        A ``.py`` file exposing ``build(size=None, **params)``, or ``module:function``.
    size : int, optional
        Passed as ``size=`` when ``build`` takes it.
    **params
        More keyword arguments for ``build`` (on top of :func:`build_params`'s).
    """
    build = load_builder(ref)
    kwargs = {**_BUILD_PARAMS.get(), **params}
    if "size" in inspect.signature(build).parameters:
        kwargs["size"] = size
    call = f"build({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    try:
        built = build(**kwargs)
    except PlacerError:
        raise
    except SystemExit as exc:
        raise _exit_error(ref, f"inside {call}", exc) from exc
    except Exception as exc:
        raise PlacerError(f"{ref}: {call} failed: {_reason(exc)}") from exc
    p = as_pipeline(built, name=Path(ref).stem if ref.endswith(".py") else ref)
    if p.size is None:
        p.size = size
    return p
