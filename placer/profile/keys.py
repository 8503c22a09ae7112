"""What a cached measurement depends on: the code a stage runs and the data it is given.

May import: numpy, placer.pipeline, placer.attrs. No measuring or device code; torch values are
recognised by their attributes, never imported.

A stage's cache key (:func:`stage_fingerprint`) covers

- the code of each implementation and, recursively, of every function, class and
  module of the user's own code that it references (through globals, closures and
  defaults), together with the source text of the modules they live in, so that
  editing a helper the stage calls re-measures the stage;
- the signature of the data it is given without running anything: its parameters,
  the values its closures capture and the data globals it reads (type, shape, dtype,
  bytes and, for arrays up to :data:`HASH_BYTES`, a hash of their content; a file
  path's size and modification time);
- the stage's own declaration (name, inputs, parameters, role).

User code is any module whose file lies outside the standard library, the
interpreter's site-packages and placer itself. :func:`source_id` names where a
pipeline comes from (the full path of its file), so two ``pipe.py`` files in
different folders never share cache entries.

Examples
--------
>>> from placer.pipeline import Pipeline
>>> p = Pipeline("demo")
>>> @p.stage()
... def load(device):
...     return [1, 2, 3]
>>> len(stage_fingerprint(p.stages["load"]))
16
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from placer.attrs import attribute_values

#: arrays up to this many bytes are hashed by content; larger ones by shape, dtype, bytes
#: and a strided sample
HASH_BYTES = 64 << 20
#: how deep references are followed from a stage's function
MAX_DEPTH = 8

_PLACER_DIR = str(Path(__file__).resolve().parents[1])


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
    return tuple(str(Path(d).resolve()) for d in dirs if d)


_LIBS = _library_dirs()


def is_user_file(path: str | None) -> bool:
    """Whether ``path`` is the user's code (not the standard library, an installed package or placer)."""
    if not path or path.startswith("<"):
        return False
    try:
        p = str(Path(path).resolve())
    except (OSError, RuntimeError):
        return False
    return not p.startswith(_PLACER_DIR) and not any(p.startswith(d) for d in _LIBS)


def _module_file(obj: Any) -> str | None:
    mod = obj if isinstance(obj, types.ModuleType) else sys.modules.get(getattr(obj, "__module__", None) or "")
    return getattr(mod, "__file__", None)


# -- data signatures -------------------------------------------------------------------------
def data_signature(value: Any, depth: int = 0) -> str:
    """A short description of ``value`` that changes when its type, shape, dtype, bytes or content do.

    >>> import numpy as np
    >>> data_signature(np.zeros(3)) == data_signature(np.zeros(3))
    True
    >>> data_signature(np.zeros(3)) == data_signature(np.ones(3))
    False
    """
    t = type(value)
    name = f"{t.__module__}.{t.__qualname__}"
    if value is None or isinstance(value, (bool, int, float, complex)):
        return f"{name}:{value!r}"
    if isinstance(value, (str, bytes)):
        if isinstance(value, str) and len(value) < 4096 and os.path.isfile(value):
            st = os.stat(value)
            return f"file:{value}:{st.st_size}:{st.st_mtime_ns}"
        return f"{name}:{hashlib.sha256(value if isinstance(value, bytes) else value.encode()).hexdigest()[:16]}"
    if isinstance(value, os.PathLike):
        return data_signature(os.fspath(value), depth)
    if depth > 4:
        return name
    arr = _as_array(value)
    if arr is not None:
        return f"{name}:{arr.shape}:{arr.dtype}:{arr.nbytes}:{_content(arr)}"
    if isinstance(value, dict):
        items = list(value.items())[:256]
        return name + "{" + ",".join(f"{k!r}={data_signature(v, depth + 1)}" for k, v in items) + f"}}#{len(value)}"
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        head = list(seq)[:256]
        return name + "[" + ",".join(data_signature(v, depth + 1) for v in head) + f"]#{len(value)}"
    frame = _frame_values(value)
    if frame is not None:
        return f"{name}:{frame}"
    return name


def _as_array(value: Any):
    """A numpy view of a numpy array or a CPU torch tensor (None for anything else)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "shape") and hasattr(value, "dtype"):
        try:
            t = value.detach()
            if getattr(t, "is_cuda", False) or getattr(getattr(t, "device", None), "type", "cpu") != "cpu":
                return None
            return t.contiguous().numpy()
        except Exception:  # noqa: BLE001 - an exotic tensor: described by type only
            return None
    return None


def _content(arr) -> str:
    import numpy as np

    a = np.ascontiguousarray(arr)
    if a.dtype == object:
        return hashlib.sha256(repr(a.tolist()[:1000]).encode()).hexdigest()[:16]
    flat = a.reshape(-1).view(np.uint8)
    if a.nbytes > HASH_BYTES:
        step = max(1, flat.size // (HASH_BYTES // 8))
        flat = flat[::step]
    return hashlib.blake2b(memoryview(np.ascontiguousarray(flat)), digest_size=8).hexdigest()


def _frame_values(value: Any) -> str | None:
    """pandas objects: columns, dtypes, shape and a hash of their values."""
    mod = type(value).__module__ or ""
    if not mod.startswith("pandas"):
        return None
    try:
        import pandas as pd

        h = pd.util.hash_pandas_object(value, index=True).to_numpy()
        return f"{getattr(value, 'shape', None)}:{list(getattr(value, 'dtypes', []))!r}:{_content(h)}"
    except Exception:  # noqa: BLE001 - an unhashable frame: described by its shape
        return f"{getattr(value, 'shape', None)}"


# -- code fingerprints -----------------------------------------------------------------------
class _Walker:
    """Hashes code and the user code it reaches, each object once."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.seen: set[int] = set()
        self.files: set[str] = set()

    def add(self, *parts: Any) -> None:
        for p in parts:
            self.h.update(repr(p).encode())
            self.h.update(b"\x00")

    def module_source(self, path: str | None) -> None:
        if not is_user_file(path) or path in self.files:
            return
        self.files.add(path)
        try:
            self.h.update(Path(path).read_bytes())
        except OSError:
            self.add("unreadable", path)

    def code(self, code: types.CodeType, glb: dict, depth: int) -> None:
        self.add(code.co_code, code.co_names, code.co_varnames)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, glb, depth)
            else:
                self.add(c if isinstance(c, (int, float, str, bytes, bool, type(None), tuple)) else type(c))
        for nm in code.co_names:
            if nm in glb:
                self.ref(nm, glb[nm], depth + 1)

    def ref(self, name: str, obj: Any, depth: int) -> None:
        """A global, closure cell or default the code refers to."""
        if depth > MAX_DEPTH or id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            self.add("module", name, obj.__name__)
            self.module_source(getattr(obj, "__file__", None))
            return
        if isinstance(obj, (types.FunctionType, types.MethodType, type)) or callable(obj):
            self.callable(obj, depth)
            return
        self.add("data", name, data_signature(obj))

    def callable(self, obj: Any, depth: int) -> None:
        fn = getattr(obj, "__func__", obj)
        fn = inspect.unwrap(fn) if callable(fn) else fn
        # a compiled wrapper (numba's dispatcher) keeps the Python function as py_func
        fn = getattr(fn, "py_func", fn)
        f = _module_file(fn)
        # a function without a module file was defined in a script, a notebook or shipped by value
        shipped = f is None and isinstance(fn, types.FunctionType)
        if not shipped and not is_user_file(f):
            self.add("lib", getattr(fn, "__module__", None), getattr(fn, "__qualname__", type(fn).__name__))
            return
        self.module_source(f)
        if isinstance(fn, type):
            self.add("class", fn.__qualname__)
            for k, v in sorted(vars(fn).items()):
                if isinstance(v, (types.FunctionType, staticmethod, classmethod, property)):
                    inner = getattr(v, "__func__", None) or getattr(v, "fget", None) or v
                    if isinstance(inner, types.FunctionType):
                        self.function(inner, depth + 1)
            return
        if isinstance(fn, types.FunctionType):
            self.function(fn, depth)
        else:
            values = attribute_values(fn)  # not its __dict__: building that would slow the stage
            self.add("object", type(fn).__qualname__,
                     data_signature(getattr(fn, "__dict__", None) if values is None else values))
            call = getattr(type(fn), "__call__", None)
            if isinstance(call, types.FunctionType):
                self.function(call, depth + 1)

    def function(self, fn: types.FunctionType, depth: int) -> None:
        self.add("fn", fn.__qualname__)
        self.code(fn.__code__, fn.__globals__, depth)
        for i, cell in enumerate(fn.__closure__ or ()):
            try:
                self.ref(f"closure{i}", cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                self.add("empty")
        for i, d in enumerate(fn.__defaults__ or ()):
            self.ref(f"default{i}", d, depth + 1)
        for k, d in sorted((fn.__kwdefaults__ or {}).items()):
            self.ref(f"kwdefault-{k}", d, depth + 1)

    def digest(self) -> str:
        return self.h.hexdigest()[:16]


def stage_fingerprint(stage: Any) -> str:
    """A hash of everything a stage's measurement depends on, short of running it (see the module)."""
    w = _Walker()
    w.add(stage.name, sorted(stage.inputs.items()), stage.data_parallel, stage.role, stage.epochs,
          stage.batch_size, stage.random)
    for label, impl in (("fn", stage.fn), ("cpu", stage.cpu), ("gpu", stage.gpu)):
        if impl is None:
            w.add(label, None)
            continue
        w.add(label, impl.api)
        w.callable(impl.fn, 0)
    for k, v in sorted(stage.params.items()):
        w.add("param", k, data_signature(v))
    if stage.init is not None:
        w.callable(stage.init, 0)
    return w.digest()


def pipeline_fingerprint(stages: Iterable[Any]) -> dict[str, str]:
    """:func:`stage_fingerprint` of each stage, by name."""
    return {st.name: stage_fingerprint(st) for st in stages}


def source_id(pipeline: Any, stages: Iterable[Any] = ()) -> str:
    """Where a pipeline comes from: the full path of its file (of its build function's module,
    or of its stages' modules for a built pipeline), for the cache file's name."""
    if isinstance(pipeline, str):
        ref = pipeline
        path = ref.rpartition(":")[0] if ":" in ref and not os.path.exists(ref) else ref
        if path.endswith(".py") or os.path.exists(path):
            return str(Path(path).resolve())
        f = getattr(sys.modules.get(path), "__file__", None)
        if f is None:
            try:
                import importlib.util

                spec = importlib.util.find_spec(path)
                f = spec.origin if spec is not None else None
            except (ImportError, ValueError):
                f = None
        return str(Path(f).resolve()) if f else ref
    if callable(pipeline) and not hasattr(pipeline, "stages"):
        f = _module_file(getattr(pipeline, "build", pipeline))  # a wrapper keeps the user's build
        return str(Path(f).resolve()) if f else f"<{getattr(pipeline, '__qualname__', '?')}>"
    files = sorted({str(Path(f).resolve()) for st in stages for impl in (st.fn, st.cpu, st.gpu)
                    if impl is not None and (f := _module_file(getattr(impl.fn, 'py_func', impl.fn)))})
    return ";".join(files) or "<built in memory>"
