"""A stable digest of a run's final outputs, equal across placements, and the check behind it.

May import: numpy, hashlib, dataclasses, math, re, placer.attrs; torch, pandas and pydantic only through duck
typing.

Tolerance (documented contract): two runs get the same digest when their final
outputs have the same structure, types, shapes and dtypes (``float16`` is not
``float64``), every non-float value is identical (integers, booleans, strings,
bytes, numpy scalars, integer and boolean arrays), and floating-point arrays agree
in these aggregates to the rounding below: the sum of absolute values to 4
significant digits, and — relative to that scale — the sum, the root of the sum of
squares, the minimum and maximum (4 decimals), and the share of absolute mass in
each of 8 consecutive chunks (3 decimals). Complex arrays are digested as their
real and imaginary parts. Digesting aggregates rather than every rounded element
keeps two results that differ only in the last bits (another summation order on
another device) from landing on different sides of a rounding boundary.
:func:`compare_outputs` checks the same outputs elementwise with ``rtol=1e-4,
atol=1e-5`` (:data:`RTOL`, :data:`ATOL`) and names the first that differs.

What each kind of output contributes:

- arrays (numpy, torch tensors, numba device arrays): dtype, shape and content;
- numpy scalars: as 0-d arrays of their dtype; Python ``int``, ``bool``, ``str``,
  ``None``: their value; ``float`` and ``complex``: as float64/complex128 arrays;
- ``bytes``, ``bytearray``, ``memoryview``: their bytes;
- ``dict``: its items, whatever the insertion order; ``list`` and ``tuple``: their
  items in order; ``set`` and ``frozenset``: their items, whatever the order;
- dataclasses, pydantic models, pandas objects (columns, index, values), torch
  modules (their ``state_dict``), dask collections (their computed result), other
  array-likes (``__array__``);
- any other object: its class and its attributes' values in the order they were set
  (read without building its ``__dict__``: see :mod:`placer.attrs`), or its
  ``__dict__`` or ``__slots__`` where it has no managed attributes, else its ``repr``
  with memory addresses removed. Nothing is pickled.

Containers nested deeper than :data:`MAX_DEPTH` (or that contain themselves)
contribute a marker instead of their content below that depth.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Any

import numpy as np

from placer.attrs import attribute_values

RTOL = 1e-4
ATOL = 1e-5
#: containers nested deeper than this are digested as a marker below that depth
MAX_DEPTH = 100

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def to_numpy(value: Any) -> Any:
    """Host numpy view of an array-like (torch tensor, numba device array, numpy); else the value."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu") and hasattr(value, "numpy"):
        t = value.detach().cpu()
        try:
            return t.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks: widen to float32
            return t.float().numpy()
    if hasattr(value, "copy_to_host"):
        return np.asarray(value.copy_to_host())
    return value


def _sig(x: float, digits: int = 4) -> float:
    return x if x == 0 else float(f"{x:.{digits - 1}e}")


def _r(x: float, decimals: int) -> float:
    v = round(float(x), decimals)
    return 0.0 if v == 0 else v  # fold -0.0


def _float_parts(x: np.ndarray) -> list:
    """The rounded aggregates of a float array (see the module's tolerance)."""
    x = x.astype(np.float64, copy=False).ravel()
    finite = np.isfinite(x)
    nonfinite = [int(np.isnan(x).sum()), int(np.isposinf(x).sum()), int(np.isneginf(x).sum())]
    x = x[finite]
    if x.size == 0:
        return ["nonfinite", nonfinite]
    ax = np.abs(x)
    scale = float(ax.sum())
    s = scale if scale > 0 else 1.0
    top = max(float(ax.max()), 1e-300)
    return [
        _sig(scale),
        _r(x.sum() / s, 4),
        _r(math.sqrt(float((x * x).sum())) / s, 4),
        _r(x.min() / top, 4),
        _r(x.max() / top, 4),
        [_r(float(c.sum()) / s, 3) for c in np.array_split(ax, 8)],
        nonfinite,
    ]


def _array_token(a: np.ndarray, depth: int, stack: set[int]) -> str:
    head = f"array:{a.dtype.name}{list(a.shape)}"
    if a.dtype.kind == "O":
        return head + _token(a.ravel().tolist(), depth + 1, stack)
    if a.size == 0:
        return head
    if a.dtype.kind == "f":
        return head + repr(_float_parts(a))
    if a.dtype.kind == "c":
        return head + repr([_float_parts(a.real), _float_parts(a.imag)])
    return head + hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _token(value: Any, depth: int = 0, stack: set[int] | None = None) -> str:
    """A string that stands for ``value``'s content (see the module docstring)."""
    stack = set() if stack is None else stack
    if depth > MAX_DEPTH:
        return "<nested too deep>"
    value = to_numpy(value)
    if value is None or isinstance(value, (bool, int)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, str):
        return "str:" + _hash(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes:" + _hash(bytes(value))
    if isinstance(value, np.ndarray):
        return _array_token(value, depth, stack)
    if isinstance(value, (float, complex, np.generic)):  # np.float64(x) and x digest alike
        return "scalar:" + _array_token(np.asarray(value), depth, stack)
    if id(value) in stack:
        return "<cycle>"
    stack.add(id(value))
    try:
        return _container_token(value, depth + 1, stack)
    finally:
        stack.discard(id(value))


def _container_token(value: Any, depth: int, stack: set[int]) -> str:
    if isinstance(value, dict):
        items = sorted((_token(k, depth, stack), _token(v, depth, stack)) for k, v in value.items())
        return "dict{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "seq[" + ",".join(_token(v, depth, stack) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        return "set{" + ",".join(sorted(_token(v, depth, stack) for v in value)) + "}"
    if hasattr(value, "__dask_graph__") and callable(getattr(value, "compute", None)):  # lazy: its result
        return _token(value.compute(), depth, stack)
    array = _as_array(value)
    if array is not None:  # cupy, jax, xarray, ...: digested as the numpy array they hold
        return _array_token(array, depth, stack)
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    parts = _parts(value)
    if parts is not None:
        return name + _token(parts, depth, stack)
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ still gets a digest
        text = f"<repr failed: {type(exc).__name__}>"
    return name + "repr:" + _hash(_ADDRESS.sub("", text).encode("utf-8", "surrogatepass"))


def _as_array(value: Any) -> np.ndarray | None:
    """A non-pandas array-like (``__array__``) as a numpy array; None for anything else."""
    if isinstance(value, type) or not hasattr(value, "__array__") or (type(value).__module__ or "").startswith("pandas"):
        return None
    try:
        out = np.asarray(value)
    except Exception:  # noqa: BLE001 - an __array__ that fails: digest the object otherwise
        return None
    return out if out.dtype.kind != "O" else None


def _parts(value: Any) -> dict | None:
    """The content of a structured object as a plain dict; None when it has none to show.

    Dataclasses (their fields), pydantic models (``model_dump``), torch modules
    (``state_dict``), pandas objects (columns, index, values), and other objects (their
    attributes' values, see :mod:`placer.attrs`; else ``__dict__`` or ``__slots__``).
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump") and hasattr(type(value), "model_fields"):  # pydantic
        return value.model_dump()
    if hasattr(value, "state_dict") and callable(value.state_dict):  # a torch module: its parameters
        return dict(value.state_dict())
    frame = _pandas_parts(value)
    if frame is not None:
        return frame
    if isinstance(value, type):
        return None
    values = attribute_values(value)  # never builds a plain object's __dict__ (which would slow it)
    if values:
        return {"values": values}
    if values is None:
        attrs = getattr(value, "__dict__", None)
        if callable(value) and attrs is None:
            return None
        if isinstance(attrs, dict) and attrs:
            return dict(attrs)
    slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ()) if hasattr(value, s)]
    return {s: getattr(value, s) for s in slots} if slots else None


def _pandas_parts(value: Any) -> dict | None:
    """A pandas DataFrame, Series or Index as plain parts; None for anything else."""
    module = type(value).__module__ or ""
    if not module.startswith("pandas"):
        return None
    if hasattr(value, "columns") and hasattr(value, "iloc"):  # DataFrame
        return {"columns": [str(c) for c in value.columns], "index": value.index.to_numpy(),
                "values": [value.iloc[:, i].to_numpy() for i in range(value.shape[1])]}
    if hasattr(value, "index") and hasattr(value, "to_numpy"):  # Series
        return {"name": str(value.name), "index": value.index.to_numpy(), "values": value.to_numpy()}
    if hasattr(value, "to_numpy"):  # Index, arrays
        return {"values": value.to_numpy()}
    return None


def outputs_digest(outputs: dict[str, Any]) -> str:
    """Digest of named outputs (a run's sink outputs), stable across placements."""
    h = hashlib.sha256()
    for name in sorted(outputs):
        h.update(name.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
        h.update(_token(outputs[name]).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


# -- comparing outputs -------------------------------------------------------------------------
def compare_outputs(a: dict[str, Any], b: dict[str, Any], rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """None when two output sets agree within the tolerance; else where and how they first differ.

    Floats (arrays and scalars) are compared with ``rtol`` and ``atol`` (NaN equals
    NaN); everything else must be equal. Types, dtypes and shapes must match.

    Examples
    --------
    >>> compare_outputs({"y": np.ones(3)}, {"y": np.ones(3) * (1 + 1e-9)}) is None
    True
    >>> compare_outputs({"y": np.ones(3)}, {"y": np.ones(3, dtype=np.float16)})
    "output 'y': dtypes differ (float64 vs float16)"
    """
    if sorted(a) != sorted(b):
        return f"different outputs: {sorted(a)} vs {sorted(b)}"
    for k in sorted(a):
        why = _difference(a[k], b[k], rtol, atol, 0)
        if why is not None:
            where, what = why
            return f"output {k!r}{where}: {what}"
    return None


def assert_outputs_close(a: dict[str, Any], b: dict[str, Any], rtol: float = RTOL, atol: float = ATOL) -> None:
    """Raise AssertionError naming the output where two output sets differ (see :func:`compare_outputs`)."""
    why = compare_outputs(a, b, rtol, atol)
    assert why is None, why


def _difference(x: Any, y: Any, rtol: float, atol: float, depth: int) -> tuple[str, str] | None:
    """``(where, what)`` of the first difference between ``x`` and ``y``, or None."""
    if depth > MAX_DEPTH:
        return None
    x, y = _host(x), _host(y)
    if isinstance(x, (float, complex, np.ndarray, np.generic)) and not isinstance(x, (str, bytes)):
        return _array_difference(x, y, rtol, atol)
    if type(x) is not type(y) and not (isinstance(x, (list, tuple)) and isinstance(y, (list, tuple))):
        return "", f"types differ ({type(x).__name__} vs {type(y).__name__})"
    if isinstance(x, dict):
        kx, ky = {_token(k): k for k in x}, {_token(k): k for k in y}
        if set(kx) != set(ky):
            return "", f"keys differ ({sorted(map(repr, x))} vs {sorted(map(repr, y))})"
        for t in sorted(kx):
            why = _difference(x[kx[t]], y[ky[t]], rtol, atol, depth + 1)
            if why is not None:
                return f"[{kx[t]!r}]" + why[0], why[1]
        return None
    if isinstance(x, (list, tuple)):
        if len(x) != len(y):
            return "", f"lengths differ ({len(x)} vs {len(y)})"
        for i, (u, v) in enumerate(zip(x, y)):
            why = _difference(u, v, rtol, atol, depth + 1)
            if why is not None:
                return f"[{i}]" + why[0], why[1]
        return None
    px = None if isinstance(x, (set, frozenset, str, bytes, bytearray, int)) else _parts(x)
    if px is not None:
        py = _parts(y)
        if py is not None and x is not y:
            return _difference(px, py, rtol, atol, depth + 1)
    if _token(x) != _token(y):
        return "", f"values differ ({_short(x)} vs {_short(y)})"
    return None


def _host(value: Any) -> Any:
    """``value`` as the digest sees it: host numpy for array-likes, the result of a lazy collection."""
    value = to_numpy(value)
    if hasattr(value, "__dask_graph__") and callable(getattr(value, "compute", None)):
        value = to_numpy(value.compute())
    if isinstance(value, (np.ndarray, np.generic, str, bytes, int, float, complex, dict, list, tuple, set)):
        return value
    array = _as_array(value)
    return value if array is None else array


def _array_difference(x: Any, y: Any, rtol: float, atol: float) -> tuple[str, str] | None:
    if isinstance(y, (bool, int, str, bytes)) or not isinstance(y, (float, complex, np.ndarray, np.generic)):
        return "", f"types differ ({type(x).__name__} vs {type(y).__name__})"
    xa, ya = np.asarray(x), np.asarray(y)
    if xa.dtype != ya.dtype:
        return "", f"dtypes differ ({xa.dtype} vs {ya.dtype})"
    if xa.shape != ya.shape:
        return "", f"shapes differ ({xa.shape} vs {ya.shape})"
    if xa.dtype.kind in "fc":
        close = np.isclose(xa, ya, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            return None
        bad = np.argwhere(~close)[0] if xa.ndim else ()
        at = tuple(int(i) for i in bad)
        return (f"[{', '.join(map(str, at))}]" if at else ""), (
            f"{xa[at]!r} vs {ya[at]!r} (beyond rtol={rtol:g}, atol={atol:g}; "
            f"{int((~close).sum())} of {close.size} values differ)")
    if xa.dtype.kind == "O":
        return _difference(xa.tolist(), ya.tolist(), rtol, atol, 1)
    if not np.array_equal(xa, ya):
        where = np.argwhere(xa != ya) if xa.ndim else []
        at = tuple(int(i) for i in where[0]) if len(where) else ()
        return (f"[{', '.join(map(str, at))}]" if at else ""), f"{xa[at]!r} vs {ya[at]!r}"
    return None


def _short(v: Any) -> str:
    text = _ADDRESS.sub("", repr(v))
    return text if len(text) <= 60 else text[:57] + "..."
