"""Counting a call's work: floating-point operations, bytes moved, operations issued.

May import: placer.data.measures; torch only inside :func:`count_work` (it runs code, so it is
used by the profiler and by the description script, never while planning).

Floating-point operations come from ``torch.utils.flop_counter.FlopCounterMode``
(matrix products, convolutions, attention), plus one operation per floating-point
element each op writes (elementwise work, which that counter leaves out). Bytes moved is the sum over
every aten op of the bytes of its tensor arguments and results: the traffic of a
device that keeps nothing in cache between kernels, which is how a GPU runs a
chain of small kernels. Operations issued counts the kernels aten ops launch (one
each, several for the sorts and scans of :data:`LAUNCHES`); synchronisations counts
the ops whose result the host must wait for on a GPU (:data:`SYNCING`: ``.item()``,
data-dependent shapes such as a boolean-mask compaction).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from placer.data.measures import Work

_PREC = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def count_work(fn: Callable[[], Any], *, _bias: float | None = None) -> tuple[Any, Work]:
    """Run ``fn`` once (on CPU torch tensors) and count its work.

    Returns
    -------
    (result, Work)
        ``fn``'s result and the counts. Work done outside torch (numpy, numba)
        is not counted as work (see :func:`tensor_bytes_work` for those); its
        time is kept as ``outside_s``, host time a GPU run pays too.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    bias = mode_overhead_s() if _bias is None else _bias
    tally = {"bytes": 0, "ops": 0, "syncs": 0, "elems": 0, "prec": {}, "inside": 0.0, "calls": 0}

    clock = time.perf_counter

    class _Bytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = clock()
            try:
                return self._count(func, args, kwargs)
            finally:
                tally["inside"] += clock() - t0
                tally["calls"] += 1

        def _count(self, func, args, kwargs):
            out = func(*args, **(kwargs or {}))
            if func.namespace == "aten" and func.__name__.split(".")[0] not in _FREE:
                leaves = tree_flatten((args, kwargs or {}))[0] + tree_flatten(out)[0]
                for t in leaves:
                    if isinstance(t, torch.Tensor):
                        nb = t.nelement() * t.element_size()
                        tally["bytes"] += nb
                        if t.is_floating_point():
                            p = _PREC.get(str(t.dtype).replace("torch.", ""), "fp32")
                            tally["prec"][p] = tally["prec"].get(p, 0) + nb
                tally["ops"] += LAUNCHES.get(func.__name__.split(".")[0], 1)
                tally["syncs"] += _syncs(func.__name__.split(".")[0], leaves)
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        tally["elems"] += t.nelement()
            return out

    flop_mode = FlopCounterMode(display=False)
    with flop_mode, _Bytes():
        t_start = clock()
        result = fn()
        total = clock() - t_start
    flops = float(flop_mode.get_total_flops())
    prec = max(tally["prec"], key=tally["prec"].get) if tally["prec"] else "fp32"
    work = Work(
        flops=flops + float(tally["elems"]),
        bytes=float(tally["bytes"]),
        ops=max(1, tally["ops"]),
        syncs=tally["syncs"],
        outside_s=max(total - tally["inside"] - tally["calls"] * bias, 0.0),
        precision=prec,
        source="counted",
    )
    return result, work


_overhead: list[float] = []


def mode_overhead_s() -> float:
    """Seconds the counting modes add per op outside an op's own handling (Python dispatch
    into them), measured once on 300 tiny ops and taken off the time a call spends outside
    torch ops."""
    if not _overhead:
        import torch

        x = torch.zeros(4)
        count_work(lambda: x + 1, _bias=0.0)  # first use initialises the counters
        runs = [count_work(lambda: [x.add(1) for _ in range(300)], _bias=0.0)[1] for _ in range(3)]
        _overhead.append(min(w.outside_s / w.ops for w in runs))
    return _overhead[0]

#: aten ops that launch several kernels on a GPU (radix sorts, scans, compactions): launches each
LAUNCHES = {"sort": 6, "argsort": 6, "topk": 4, "unique": 6, "_unique": 6, "_unique2": 6, "unique_consecutive": 4,
            "nonzero": 3, "cumsum": 2, "cumprod": 2}

#: aten ops whose result the host waits for on a GPU (a synchronisation each)
SYNCING = {
    "_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "unique", "_unique", "_unique2",
    "unique_consecutive", "unique_dim", "equal", "is_nonzero", "repeat_interleave", "_assert_async",
}

def _syncs(name: str, leaves: list) -> bool:
    """Whether an op makes the host wait for the device: a :data:`SYNCING` op, or indexing
    (or writing) through a boolean mask, whose result's size is only known on the device."""
    if name in SYNCING:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return any(getattr(t, "dtype", None) is not None and str(t.dtype) == "torch.bool" for t in leaves)
    return False


#: aten ops that move no data (views, metadata)
_FREE = {
    "view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "unsqueeze",
    "squeeze", "alias", "detach", "as_strided", "slice", "select", "lift_fresh", "_to_copy_noop",
    "empty", "empty_like", "empty_strided", "sym_size", "sym_stride", "sym_numel", "dim", "size",
    "is_same_size", "_reshape_alias", "split", "chunk", "unbind", "numel",
}


def tensor_bytes_work(input_bytes: float, output_bytes: float, *, flops: float | None = None) -> Work:
    """Work known only from the sizes of inputs and outputs (one pass over each)."""
    return Work(
        flops=float(flops or 0.0),
        bytes=float(input_bytes + output_bytes),
        ops=1,
        source="tensor sizes" if flops is None else "declared",
    )
