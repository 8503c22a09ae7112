"""Sending a pipeline's code to dask workers: its modules as source, its stages by reference.

May import: placer.errors, placer.pipeline; cloudpickle and distributed inside functions.

A stage function lives in a module. When that module comes with Python or an
installed distribution, every worker can import it, and cloudpickle pickles the
function by reference. A pipeline file (imported by :mod:`placer.loader` under a
generated name such as ``placer_user_requests_…``), a test module or a helper module
next to it is not installed. Pickling such a module's functions *by value* copies
their globals into every pickle, which breaks on what a module ordinarily holds: a
``threading.Lock`` guarding a cache, a ``functools.lru_cache`` wrapper (pickled by
reference to a module the worker cannot import), a numba dispatcher.

So placer sends each such module's *source* to the workers instead, once, as a
worker plugin (:func:`ship_modules`): every worker, including one that joins or
restarts later, executes the source under the module's own name before it runs a
task, the way ``placer run`` imported the file here. The stages then pickle by
reference, and each worker has its own locks, caches and compiled kernels, as the
local run does. Which modules go: those of the stage functions (and of their
parameters' types), with every module they import that is not installed either
(read from their ``import`` statements and their globals), parents first. A
``__main__`` script's own functions stay pickled by value (a worker has a
``__main__`` of its own); the modules it imports are sent as source.

A stage that still cannot be pickled (a lock in a closure, an open file among its
parameters) is refused before anything runs, by :func:`dumps_stage`, naming the
stage, the object and what to do (:class:`ShippingError`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import sys
import sysconfig
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placer.errors import DeviceError
from placer.pipeline import Pipeline, Stage

#: how deep :func:`find_unpicklable` looks into functions, containers and objects
_DEPTH = 6


class ShippingError(DeviceError):
    """A stage (or a module of the pipeline) cannot be sent to the dask workers."""


# -- which modules are not installed ------------------------------------------------------
def installed(module_name: str) -> bool:
    """Whether a module comes with Python or an installed distribution (pickled by name)."""
    top = module_name.split(".")[0]
    if top in ("placer", "builtins") or top in sys.builtin_module_names:
        return True
    mod = sys.modules.get(module_name)
    file = getattr(mod, "__file__", None)
    if not file:
        return True  # namespace or built-in: nothing to ship
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    path = Path(file).resolve()
    return any(path.is_relative_to(Path(r).resolve()) for r in roots)


@dataclass(frozen=True)
class ModuleSource:
    """One module as it travels to the workers."""

    name: str
    path: str
    source: str
    package: bool

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()[:16]


def _source_of(mod: types.ModuleType) -> str | None:
    loader = getattr(mod, "__loader__", None)
    with contextlib.suppress(Exception):
        src = loader.get_source(mod.__name__) if loader is not None else None
        if src is not None:
            return src
    file = getattr(mod, "__file__", None)
    if file and file.endswith(".py"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            return Path(file).read_text(encoding="utf-8")
    return None


def _imported_names(mod: types.ModuleType, source: str | None) -> list[str]:
    """Modules ``mod`` imports (its import statements, at any depth) and the modules of its globals."""
    names: list[str] = []
    if source is not None:
        with contextlib.suppress(SyntaxError, ValueError):
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    names += [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        pkg = (mod.__package__ or "").split(".")
                        parts = pkg[: len(pkg) - node.level + 1] if node.level > 1 else pkg
                        base = ".".join(p for p in [*parts, base] if p)
                    names.append(base)
                    names += [f"{base}.{a.name}" for a in node.names]
    for value in list(vars(mod).values()):
        if isinstance(value, types.ModuleType):
            names.append(value.__name__)
        else:
            m = getattr(value, "__module__", None)
            if isinstance(m, str):
                names.append(m)
    return [n for n in dict.fromkeys(names) if n in sys.modules]


def modules_to_ship(objects: Iterable[Any]) -> list[ModuleSource]:
    """The modules of ``objects`` that workers cannot import, with what they import, parents first."""
    order: list[ModuleSource] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        mod = sys.modules.get(name)
        if mod is None or (name != "__main__" and installed(name)):
            return
        if "." in name and name != "__main__":
            visit(name.rpartition(".")[0])
        source = _source_of(mod)
        for dep in _imported_names(mod, source):
            visit(dep)
        if name != "__main__" and source is not None:
            order.append(ModuleSource(name=name, path=str(getattr(mod, "__file__", None) or f"<{name}>"),
                                      source=source, package=hasattr(mod, "__path__")))

    for obj in objects:
        for name in _module_names(obj):
            visit(name)
    return order


def _module_names(obj: Any) -> list[str]:
    """The modules an object's code comes from (a function's, a partial's, an instance's class)."""
    fn = obj
    while isinstance(fn, functools.partial):
        fn = fn.func
    names = [getattr(fn, "__module__", None), getattr(type(fn), "__module__", None)]
    return [n for n in names if isinstance(n, str)]


def stage_objects(stages: Iterable[Stage]) -> list[Any]:
    """What of the stages travels: each implementation's function, and its parameters."""
    out: list[Any] = []
    for st in stages:
        out += [impl.fn for impl in (st.fn, st.cpu, st.gpu) if impl is not None]
        out += list((st.params or {}).values())
    return out


# -- on the workers -------------------------------------------------------------------------
class _SourceLoader:
    """The loader of a module that came as source: tracebacks and ``inspect`` find its lines."""

    def __init__(self, source: str):
        self._source = source

    def get_source(self, name: str) -> str:
        return self._source


def _same_source(mod: types.ModuleType, m: ModuleSource) -> bool:
    if getattr(mod, "__placer_shipped__", None) == m.digest:
        return True
    return _source_of(mod) == m.source


def install(modules: list[ModuleSource]) -> dict[str, str]:
    """Execute each module's source under its name here (skipping those already here, unchanged).

    Returns
    -------
    dict
        Module name -> why it could not be executed, for each that failed.
    """
    import importlib.machinery

    failed: dict[str, str] = {}
    for m in modules:
        old = sys.modules.get(m.name)
        if old is not None and _same_source(old, m):
            continue
        loader = _SourceLoader(m.source)
        mod = types.ModuleType(m.name)
        mod.__spec__ = importlib.machinery.ModuleSpec(m.name, loader, origin=m.path, is_package=m.package)
        mod.__loader__, mod.__file__, mod.__placer_shipped__ = loader, m.path, m.digest
        mod.__package__ = m.name if m.package else m.name.rpartition(".")[0]
        if m.package:
            mod.__path__ = []
        sys.modules[m.name] = mod
        try:
            exec(compile(m.source, m.path, "exec"), mod.__dict__)  # noqa: S102 - the pipeline's own code
        except BaseException as exc:  # noqa: BLE001 - reported to the client, which refuses the run
            if old is not None:
                sys.modules[m.name] = old
            else:
                sys.modules.pop(m.name, None)
            failed[m.name] = f"{type(exc).__name__}: {exc}"
            continue
        parent, _, child = m.name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, mod)
    return failed


#: per plugin name, the modules that failed to install on this worker
_FAILED: dict[str, dict[str, str]] = {}


@functools.cache
def _plugin_class():
    from distributed.diagnostics.plugin import WorkerPlugin

    class ShippedModules(WorkerPlugin):
        """Installs the pipeline's modules on every worker, including those that join later."""

        idempotent = True

        def __init__(self, name: str, modules: list[ModuleSource]):
            self.name, self.modules = name, modules

        def setup(self, worker: Any) -> None:
            _FAILED[self.name] = install(self.modules)

        def __reduce__(self):
            return (shipped_modules, (self.name, self.modules))

    return ShippedModules


def shipped_modules(name: str, modules: list[ModuleSource]) -> Any:
    """The worker plugin that installs ``modules`` (a :class:`distributed.diagnostics.plugin.WorkerPlugin`)."""
    return _plugin_class()(name, modules)


def _failures(name: str) -> dict[str, str]:
    return dict(_FAILED.get(name, {}))


def ship_modules(client: Any, objects: Iterable[Any]) -> list[ModuleSource]:
    """Install the modules of ``objects`` that are not installed on every worker of ``client``'s cluster.

    Raises
    ------
    ShippingError
        When a module's source fails to execute on a worker (naming the module,
        the worker and the error).
    """
    modules = modules_to_ship(objects)
    if not modules:
        return []
    key = hashlib.sha1("".join(f"{m.name}:{m.digest};" for m in modules).encode()).hexdigest()[:12]
    name = f"placer-modules-{key}"
    try:
        client.register_plugin(shipped_modules(name, modules), name=name)
    except Exception as exc:  # noqa: BLE001 - a worker could not even load the plugin
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ShippingError(
            f"the dask workers could not take the pipeline's modules ({', '.join(m.name for m in modules)}): "
            f"{type(exc).__name__}: {first}; the workers need the same placer version as this machine"
        ) from None
    for worker, failed in sorted(client.run(_failures, name).items()):
        if failed:
            mod, why = next(iter(failed.items()))
            path = next(m.path for m in modules if m.name == mod)
            raise ShippingError(
                f"module {mod!r} of the pipeline ({path}) cannot be imported on worker {worker}: {why}; "
                "install what it imports on the workers, or keep that import inside the stage that needs it"
            )
    return modules


# -- pickling a stage ---------------------------------------------------------------------------
@contextlib.contextmanager
def by_reference(modules: Iterable[ModuleSource]) -> Iterator[None]:
    """Inside the block, cloudpickle pickles these modules' functions by reference (not by value)."""
    import cloudpickle

    registered = set(cloudpickle.list_registry_pickle_by_value())
    off = [sys.modules[m.name] for m in modules if m.name in registered and m.name in sys.modules]
    for mod in off:
        cloudpickle.unregister_pickle_by_value(mod)
    try:
        yield
    finally:
        for mod in off:
            cloudpickle.register_pickle_by_value(mod)


def dumps_stage(stage: Stage, modules: Iterable[ModuleSource] = ()) -> bytes:
    """``stage`` pickled for the workers (the shipped ``modules`` by reference).

    Raises
    ------
    ShippingError
        Naming the stage and the object that cannot be pickled, with the fix.
    """
    import cloudpickle

    with by_reference(modules):
        try:
            return cloudpickle.dumps(stage)
        except Exception as exc:  # noqa: BLE001 - any pickling error is explained
            raise unpicklable_stage(stage, exc) from None


def unpicklable_stage(stage: Stage, exc: BaseException) -> ShippingError:
    """The error for a stage that cannot be pickled, naming the object that cannot."""
    found = find_unpicklable(stage)
    if found is None:
        what = "it"
    else:
        path, obj = found
        what = f"{path} (a {type(obj).__module__}.{type(obj).__qualname__})"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    in_main = any(getattr(impl.fn, "__module__", None) == "__main__" for impl in (stage.fn, stage.cpu, stage.gpu)
                  if impl is not None)
    where = ("move the stage's functions from the script into a module it imports (modules are sent to the "
             "workers as source; a script's own functions are pickled)" if in_main else
             "keep it in a module-level global of the pipeline's file (that module is imported on each "
             "worker, not pickled)")
    return ShippingError(
        f"stage {stage.name!r} cannot be sent to the dask workers: {what} cannot be pickled ({first}); "
        f"create it inside the stage function, {where}, or pass only picklable params",
        stage=stage.name,
    )


def _picklable(obj: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:  # noqa: BLE001
        return False


def find_unpicklable(stage: Stage) -> tuple[str, Any] | None:
    """``(where, object)`` for the innermost object of ``stage`` that cannot be pickled, or None."""
    for key, value in (stage.params or {}).items():
        found = _innermost(value, f"param {key!r}", _DEPTH, set())
        if found is not None:
            return found
    for impl in (stage.fn, stage.cpu, stage.gpu):
        if impl is not None:
            found = _innermost(impl.fn, getattr(impl.fn, "__qualname__", repr(impl.fn)), _DEPTH, set())
            if found is not None:
                return found
    return None


def _innermost(obj: Any, path: str, depth: int, seen: set[int]) -> tuple[str, Any] | None:
    if id(obj) in seen or _picklable(obj):
        return None
    seen.add(id(obj))
    if depth > 0:
        for label, child in _children(obj):
            found = _innermost(child, f"{path} -> {label}", depth - 1, seen)
            if found is not None:
                return found
    return path, obj


def _children(obj: Any) -> list[tuple[str, Any]]:
    """What pickling ``obj`` pickles in turn, each with a label."""
    if isinstance(obj, types.FunctionType):
        out = [(name, cell.cell_contents) for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ())
               if _has_contents(cell)]
        out += [(f"default {i}", d) for i, d in enumerate(obj.__defaults__ or ())]
        out += [(f"default {k}", d) for k, d in (obj.__kwdefaults__ or {}).items()]
        g = obj.__globals__
        out += [(f"global {n}", g[n]) for n in _global_names(obj.__code__) if n in g]
        return out
    if isinstance(obj, functools.partial):
        return [("func", obj.func), *((f"arg {i}", a) for i, a in enumerate(obj.args)),
                *((f"keyword {k}", v) for k, v in obj.keywords.items())]
    if isinstance(obj, dict):
        return [(repr(k), v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    attrs = getattr(obj, "__dict__", None)
    return [(f".{k}", v) for k, v in attrs.items()] if isinstance(attrs, dict) else []


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
        return True
    except ValueError:
        return False


def _global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return list(dict.fromkeys(names))



# -- a pipeline's stages and modules, for a cluster or a fresh process ----------------------
def ship_by_value(fns: Sequence[Any]) -> None:
    """Have cloudpickle pickle these functions' modules by value when they are not installed.

    For one fresh process that takes the parent's ``sys.path`` (a stream's process
    workers); dask workers get the modules as source instead (:mod:`placer.executor.shipping`).
    """
    import cloudpickle

    registered = set(cloudpickle.list_registry_pickle_by_value())
    for fn in fns:
        name = getattr(fn, "__module__", None)
        if name and name != "__main__" and name not in registered and not installed(name):
            cloudpickle.register_pickle_by_value(sys.modules[name])
            registered.add(name)


def stage_payloads(pipeline: Pipeline, modules: Sequence[ModuleSource] = ()) -> dict[str, bytes]:
    """Each stage, pickled for the workers, which have ``modules`` (see :func:`ship_code`).

    Raises
    ------
    ShippingError
        Naming the stage and the object that cannot be pickled.
    """
    return {n: dumps_stage(st, modules) for n, st in pipeline.stages.items()}


def ship_code(client: Any, pipeline: Pipeline) -> list[ModuleSource]:
    """Install the pipeline's modules that are not installed on the cluster's workers."""
    return ship_modules(client, stage_objects(pipeline.stages.values()))

__all__ = [
    "ModuleSource",
    "ShippingError",
    "dumps_stage",
    "find_unpicklable",
    "install",
    "installed",
    "modules_to_ship",
    "ship_by_value",
    "ship_code",
    "ship_modules",
    "stage_objects",
    "stage_payloads",
    "unpicklable_stage",
]
