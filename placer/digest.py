"""A stable digest of a run's final outputs, equal across placements.

May import: numpy, hashlib; torch only through duck typing.

Tolerance (documented contract): two runs get the same digest when their final
outputs have the same structure, shapes and dtypes, integer and boolean arrays are
identical, and floating-point arrays agree in these aggregates to the rounding
below: the sum of absolute values to 4 significant digits, and — relative to that
scale — the sum, the root of the sum of squares, the minimum and maximum (4
decimals), and the share of absolute mass in each of 8 consecutive chunks (3
decimals). Digesting aggregates rather than every rounded element keeps two
results that differ only in the last bits (another summation order on another
device) from landing on different sides of a rounding boundary. Tests compare
elementwise with ``rtol=1e-4, atol=1e-5`` (:data:`RTOL`, :data:`ATOL`).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

RTOL = 1e-4
ATOL = 1e-5


def to_numpy(value: Any) -> Any:
    """Host numpy view of an array-like (torch tensor, numba device array, numpy)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    if hasattr(value, "copy_to_host"):
        return np.asarray(value.copy_to_host())
    return value


def _sig(x: float, digits: int = 4) -> float:
    if x == 0 or not math.isfinite(x):
        return x if math.isfinite(x) else float(repr(x) == "nan" or x)
    return float(f"{x:.{digits - 1}e}")


def _r(x: float, decimals: int) -> float:
    v = round(float(x), decimals)
    return 0.0 if v == 0 else v  # fold -0.0


def _array_token(a: np.ndarray) -> str:
    head = f"{a.dtype.kind}{list(a.shape)}"
    if a.dtype.kind in "biuSUO" or a.size == 0:
        if a.dtype.kind == "O":
            return head + repr(a.tolist())
        return head + hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    x = a.astype(np.float64, copy=False).ravel()
    finite = np.isfinite(x)
    nonfinite = int(x.size - finite.sum())
    x = x[finite]
    if x.size == 0:
        return head + f"nonfinite={nonfinite}"
    ax = np.abs(x)
    scale = float(ax.sum())
    s = scale if scale > 0 else 1.0
    chunks = [float(c.sum()) / s for c in np.array_split(ax, 8)]
    parts = [
        _sig(scale),
        _r(x.sum() / s, 4),
        _r(math.sqrt(float((x * x).sum())) / s, 4),
        _r(x.min() / max(float(ax.max()), 1e-300), 4),
        _r(x.max() / max(float(ax.max()), 1e-300), 4),
        [_r(c, 3) for c in chunks],
        nonfinite,
    ]
    return head + repr(parts)


def _token(value: Any) -> str:
    value = to_numpy(value)
    if isinstance(value, np.ndarray):
        return _array_token(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_token(v)}" for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_token(v) for v in value) + "]"
    if isinstance(value, float):
        return _array_token(np.asarray([value]))
    if isinstance(value, (int, str, bool, type(None))):
        return repr(value)
    if hasattr(value, "state_dict"):  # a torch module: its parameters
        return _token({k: v for k, v in value.state_dict().items()})
    if hasattr(value, "to_numpy"):  # pandas
        return _token(value.to_numpy())
    return type(value).__name__


def outputs_digest(outputs: dict[str, Any]) -> str:
    """Digest of named outputs (a run's sink outputs), stable across placements."""
    h = hashlib.sha256()
    for name in sorted(outputs):
        h.update(name.encode())
        h.update(_token(outputs[name]).encode())
    return h.hexdigest()[:16]


def assert_outputs_close(a: dict[str, Any], b: dict[str, Any], rtol: float = RTOL, atol: float = ATOL) -> None:
    """Raise AssertionError naming the output where two output sets differ."""
    assert sorted(a) == sorted(b), f"different outputs: {sorted(a)} vs {sorted(b)}"
    for k in a:
        _close(a[k], b[k], rtol, atol, k)


def _close(x: Any, y: Any, rtol: float, atol: float, where: str) -> None:
    x, y = to_numpy(x), to_numpy(y)
    if isinstance(x, dict):
        assert isinstance(y, dict) and sorted(x) == sorted(y), f"{where}: keys differ"
        for k in x:
            _close(x[k], y[k], rtol, atol, f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), f"{where}: lengths differ"
        for i, (u, v) in enumerate(zip(x, y)):
            _close(u, v, rtol, atol, f"{where}[{i}]")
    elif isinstance(x, (np.ndarray, float, int)) and not isinstance(x, bool):
        xa, ya = np.asarray(x), np.asarray(y)
        assert xa.shape == ya.shape, f"{where}: shapes {xa.shape} vs {ya.shape}"
        if xa.dtype.kind in "fc":
            np.testing.assert_allclose(xa, ya, rtol=rtol, atol=atol, err_msg=where, equal_nan=True)
        else:
            np.testing.assert_array_equal(xa, ya, err_msg=where)
    elif hasattr(x, "state_dict"):
        _close(dict(x.state_dict()), dict(y.state_dict()), rtol, atol, where)
    else:
        assert x == y, f"{where}: {x!r} != {y!r}"
