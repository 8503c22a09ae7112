"""Counting a call's work: floating-point operations, bytes moved, operations issued, host time.

May import: placer.data.measures; torch only inside the functions (they run code, so they are
used by the profiler, the CPU calibration and the description script, never while planning).

One ``TorchDispatchMode`` sees every aten op a call issues: the forward pass, the
backward pass (autograd's engine issues its ops through the same dispatcher) and an
optimizer's update. Floating-point operations come from the formulas of
``torch.utils.flop_counter`` (matrix products, convolutions, attention), plus one operation per floating-point
element each op writes (elementwise work, which that counter leaves out); the first part is kept apart as
``tensor_flops``, the work a GPU's tensor cores take in a lower precision (and those ops' bytes as
``tensor_bytes``). Bytes moved is the sum over
every aten op of the bytes of its tensor arguments and results: the traffic of a
device that keeps nothing in cache between kernels, which is how a GPU runs a
chain of small kernels. Operations issued counts the kernels aten ops launch (one
each, several for the sorts and scans of :data:`LAUNCHES`); synchronisations counts
the ops whose result the host must wait for on a GPU (:data:`SYNCING`: ``.item()``,
data-dependent shapes such as a boolean-mask compaction).

The host side of a GPU run is measured, not inferred from CPU times: the time the
call spends outside torch ops (:func:`count_work`'s ``outside_s``: Python, numpy, a
DataLoader; this thread's CPU time, torch's own work and the counter's kept out of
it), and the
framework's cost of issuing one op (:func:`dispatch_s`, tiny tensors), which the
cost model charges per op issued.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from placer.data.measures import Work

#: the version of what :func:`count_work` measures; counted work of another version is counted again
VERSION = "7"

_PREC = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def count_work(fn: Callable[[], Any], *, repeats: int = 7, budget_s: float = 0.5) -> tuple[Any, Work]:
    """Run ``fn`` (on CPU torch tensors) and count its work.

    ``fn`` runs once, and again (up to ``repeats`` times) while the runs fit in
    ``budget_s`` (twice when the first run took less than ``budget_s``): the counts are
    one run's, the time outside torch ops read from all the runs' gaps between ops
    (:func:`outside_of_gaps`; a small stage's seven runs cost milliseconds). The result
    is the last run's. It runs at one
    intra-op thread: a thread pool sharing busy cores with the caller slows the
    caller's own work between ops, and the profile's thread count must not change
    what the host of a GPU pays.

    Every aten op ``fn`` issues is seen, those of a backward pass and an optimizer
    step included (autograd runs them through the same dispatcher). The time outside
    torch ops (``outside_s``) is this thread's CPU time between ops, less the counter's
    own overhead: a stall, another process or torch's intra-op threads add nothing to
    it. The counter's overhead is measured where it is paid: after each op, a tiny op
    goes through the counter and its time outside the handler is taken off (this also
    refills the caches the op evicted, as a GPU's work never does). Freeing a large
    tensor (returning its pages to the system) is torch's work that a GPU's caching
    allocator does not repeat: the counter keeps each large output's storage until
    the first op after everyone else let go of it, so it is freed inside that op's
    time, not outside. Python's garbage collector is off during a counted run: a
    collection the counter's own objects set off is no host time of the stage's.

    Returns
    -------
    (result, Work)
        ``fn``'s result and the counts. Work done outside torch (numpy, numba)
        is not counted as work (see :func:`tensor_bytes_work` for those); its
        time is kept as ``outside_s``, host time a GPU run pays too.
    """
    def runs():
        t0 = time.perf_counter()
        gaps: list[list[tuple[str, str, float]]] = [[]]
        result, work = _count_once(fn, gaps=gaps[-1])
        outside = [work.outside_s]
        while len(outside) < repeats and (len(outside) < 2 and time.perf_counter() - t0 <= budget_s
                                          or (time.perf_counter() - t0) * (len(outside) + 1) / len(outside) <= budget_s):
            gaps.append([])
            result, again = _count_once(fn, gaps=gaps[-1])
            outside.append(again.outside_s)
        read = outside_of_gaps(gaps) if all(gaps) else None
        return result, work.model_copy(update={"outside_s": outside_of(outside) if read is None else read})

    return _one_thread(runs)


def outside_of(readings: list[float]) -> float:
    """The time outside torch ops of several counted runs: their median.

    Each reading is a difference, the thread's CPU time less the time inside ops and
    the counter's measured overhead, so noise moves it either way: on a busy 2-core
    machine a mnist CNN evaluation (20 calls) read 0.21-0.72 ms over fifteen runs, most
    within 0.30-0.35 ms, and one run read nothing (its overhead probes read high). The
    least reading, which a time alone would call the cleanest, is then the one most off.
    """
    return float(statistics.median(readings)) if readings else 0.0


#: two readings of one gap between ops that differ by more than this: the higher one stalled
LUMP_S = 50e-6


def outside_of_gaps(runs: list[list[tuple[str, str, float]]]) -> float | None:
    """The time outside torch ops of several counted runs, from their gaps between ops.

    Each run's gaps are ``(op before, op after, seconds)``: the thread's CPU time between
    two ops less the counter's measured overhead there (a gap's share of the run's
    outside time). Noise (a preemption's cache refill, a late page fault, the counter's
    own first calls) lands in a few gaps of one run, a stage's own Python in the same gaps
    of every run. With three runs or more of the same gaps, each gap is the median over
    the runs; with two, their mean, or the less where they differ by more than
    :data:`LUMP_S` (a stall in one of them); with one, or when the runs' gaps differ (a
    data-dependent loop), each kind of gap (the ops on either side) is the median of its
    occurrences, times how often one run has it. Never below zero; None without gaps.
    """
    runs = [r for r in runs if r]
    if not runs:
        return None
    same = all([g[:2] for g in r] == [g[:2] for g in runs[0]] for r in runs)
    if len(runs) >= 3 and same:
        total = sum(statistics.median(r[i][2] for r in runs) for i in range(len(runs[0])))
    elif len(runs) == 2 and same:
        total = sum(min(a[2], b[2]) if abs(a[2] - b[2]) > LUMP_S else (a[2] + b[2]) / 2 for a, b in zip(*runs))
    else:
        kinds: dict[tuple[str, str], list[float]] = {}
        for r in runs:
            for before, after, sec in r:
                kinds.setdefault((before, after), []).append(sec)
        total = sum(statistics.median(v) * len(v) / len(runs) for v in kinds.values())
    return max(float(total), 0.0)


def _count_once(fn: Callable[[], Any], gaps: list[tuple[str, str, float]] | None = None) -> tuple[Any, Work]:
    """One counted run of ``fn`` (see :func:`count_work`); each gap between ops is appended to
    ``gaps`` as ``(op before, op after, seconds outside ops)`` (see :func:`outside_of_gaps`)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    tally = {"bytes": 0, "tensor_bytes": 0, "irregular_bytes": 0, "ops": 0, "syncs": 0, "elems": 0, "flops": 0, "prec": {}, "inside": 0.0, "calls": 0,
             "probes": 0.0}
    # the gap being read: the op before it, where it began, the counter's overhead to take off
    gap = {"op": "<start>", "t": 0.0, "probe": 0.0}
    gaps = [] if gaps is None else gaps
    probe = {"on": False, "in": 0.0, "out": 0.0, "x": torch.zeros(1)}
    held: dict[int, Any] = {}  # storages of large outputs, by address: freed inside an op's time
    use_count = torch._C._storage_Use_Count
    clock = time.thread_time

    def release() -> None:
        for key in [k for k, s in held.items() if use_count(s._cdata) <= 1]:
            del held[key]

    class _Counter(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # no compiler wrapper around each call: less overhead
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if probe["on"]:
                probe["in"] = clock()
                out = func(*args, **(kwargs or {}))
                probe["out"] = clock()
                return out
            t0 = clock()
            name = str(func)
            gaps.append((gap["op"], name, t0 - gap["t"] - gap["probe"]))
            try:
                release()
                out = self._count(func, args, kwargs or {})
                gap["probe"] = self._probe()
                return out
            finally:
                gap["op"] = name
                gap["t"] = clock()
                tally["inside"] += gap["t"] - t0
                tally["calls"] += 1

        def _probe(self):
            """A tiny op through the counter, in the caches this op left: the counter's own
            cost outside a handler, measured where the stage's next op will pay it."""
            probe["on"] = True
            try:
                with self:
                    p0 = clock()
                    probe["x"].add(0)
                    p1 = clock()
            finally:
                probe["on"] = False
            tally["probes"] += (probe["in"] - p0) + (p1 - probe["out"])
            return (probe["in"] - p0) + (p1 - probe["out"])

        def _count(self, func, args, kwargs):
            out = func(*args, **kwargs)
            name = func.__name__.split(".")[0]
            outs = tree_flatten(out)[0]
            for t in outs:
                if isinstance(t, torch.Tensor) and t.nelement() * t.element_size() >= HOLD_BYTES:
                    try:
                        s = t.untyped_storage()
                    except (RuntimeError, NotImplementedError):  # a tensor without storage
                        continue
                    held.setdefault(s.data_ptr(), s)
            if func.namespace != "aten" or name in _FREE:
                return out
            leaves = tree_flatten((args, kwargs))[0] + outs
            formula = flop_registry.get(func._overloadpacket)
            irregular = name in IRREGULAR
            for t in leaves:
                if isinstance(t, torch.Tensor):
                    nb = t.nelement() * t.element_size()
                    tally["bytes"] += nb
                    if formula is not None:
                        tally["tensor_bytes"] += nb
                    if irregular:
                        tally["irregular_bytes"] += nb
                    if t.is_floating_point():
                        p = _PREC.get(str(t.dtype).replace("torch.", ""), "fp32")
                        tally["prec"][p] = tally["prec"].get(p, 0) + nb
            tally["ops"] += LAUNCHES.get(name, 1)
            tally["syncs"] += _syncs(name, leaves)
            if formula is not None:
                tally["flops"] += formula(*args, **kwargs, out_val=out)
            for t in outs:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    tally["elems"] += t.nelement()
            return out

    collecting = gc.isenabled()
    gc.disable()
    try:
        with _Counter():
            t_start = gap["t"] = clock()
            result = fn()
            t_end = clock()
            total = t_end - t_start
    finally:
        held.clear()
        if collecting:
            gc.enable()
    gaps.append((gap["op"], "<end>", t_end - gap["t"] - gap["probe"]))
    prec = max(tally["prec"], key=tally["prec"].get) if tally["prec"] else "fp32"
    work = Work(
        flops=float(tally["flops"]) + float(tally["elems"]),
        tensor_flops=float(tally["flops"]),
        bytes=float(tally["bytes"]),
        tensor_bytes=float(tally["tensor_bytes"]),
        irregular_bytes=float(tally["irregular_bytes"]),
        ops=max(1, tally["ops"]),
        syncs=tally["syncs"],
        calls=tally["calls"],
        outside_s=max(total - tally["inside"] - tally["probes"], 0.0),
        precision=prec,
        source="counted",
    )
    return result, work


#: outputs of at least this many bytes are held until an op runs after their last user let go
#: (their free, which returns pages to the system, is then torch's time, not the stage's own)
HOLD_BYTES = 1 << 16


def _tiny_ops() -> Callable[[], None]:
    """One round of a mix of tiny torch ops (elementwise, reduction, matrix product,
    convolution, pooling, a view): what a stage's ops look like to the dispatcher."""
    import torch
    import torch.nn.functional as F

    x, y, a = torch.ones(4), torch.ones(4), torch.ones(4, 4)
    img, w = torch.ones(1, 1, 4, 4), torch.ones(1, 1, 3, 3)

    def mix():
        x.add(y)
        torch.relu(x)
        x.sum()
        torch.addmm(y, a, a)
        F.conv2d(img, w)
        F.max_pool2d(img, 2)
        a.view(16)

    return mix


#: ops (calls) in one round of :func:`_tiny_ops`
_MIX_CALLS = 7


def _one_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` at one intra-op thread: a tiny op's time is then all this thread's own (a
    thread pool waiting for a busy core spins on the caller's CPU time)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def dispatch_s(*, rounds: int = 5, per_round: int = 40) -> float:
    """Seconds of this thread's CPU time a tiny torch op costs from Python: the framework's
    own cost of issuing an op (the call, argument parsing, dispatch, allocation, a
    near-empty kernel).

    Measured at one thread on rounds of a mix of tiny ops (:func:`_tiny_ops`), the
    fastest of ``rounds`` (noise only adds time); a few
    milliseconds. :func:`placer.target.calibrate.this_cpu` keeps it per machine.
    """
    mix = _tiny_ops()

    def best() -> float:
        mix()
        times = []
        for _ in range(rounds):
            t0 = time.thread_time()
            for _ in range(per_round):
                mix()
            times.append(time.thread_time() - t0)
        return min(times)

    return _one_thread(best) / (per_round * _MIX_CALLS)


#: aten ops that launch several kernels on a GPU (radix sorts, scans, compactions): launches each
LAUNCHES = {"sort": 6, "argsort": 6, "topk": 4, "unique": 6, "_unique": 6, "_unique2": 6, "unique_consecutive": 4,
            "nonzero": 3, "cumsum": 2, "cumprod": 2}

#: aten ops that reach memory through an index, a mask or a sort: a boolean-mask compaction
#: (``x[mask]`` is ``index`` after ``nonzero``), gathers and scatters by an index tensor,
#: scatter-adds (a group-by's sums: atomics on a GPU), sorts and ``unique``. On a GPU they
#: run far below streaming bandwidth (the reference H200: a 1M-row compaction at ~0.25 TB/s,
#: a sort at ~0.1-0.2, an ``index_add_`` into 1000 groups at ~0.4, against 2.3 for
#: elementwise work), so their bytes are kept apart (``Work.irregular_bytes``). ``embedding``
#: is not among them: it gathers whole rows, which a GPU reads at streaming speed.
IRREGULAR = {
    "index", "index_put", "index_put_", "_index_put_impl_", "nonzero", "nonzero_static", "masked_select",
    "masked_scatter", "masked_scatter_", "index_select", "gather", "scatter", "scatter_", "scatter_add",
    "scatter_add_", "scatter_reduce", "scatter_reduce_", "index_add", "index_add_", "index_reduce",
    "index_reduce_", "index_copy", "index_copy_", "take", "put_", "sort", "argsort", "topk", "kthvalue",
    "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "bincount", "histc",
}

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


class _Layer:
    """A stand-in for the Python a model runs between ops: a call through a small object
    graph, attribute reads, a keyword call, a list built and summed."""

    def __init__(self, depth: int):
        self.child = _Layer(depth - 1) if depth else None
        self.scale, self.hooks = 1.0, []

    def __call__(self, x: float, *, training: bool = True) -> float:
        for hook in self.hooks:
            x = hook(x)
        y = x * self.scale + (1.0 if training else 0.0)
        return self.child(y, training=training) if self.child is not None else sum([y, x, 1.0])


def python_s(*, rounds: int = 5, per_round: int = 2000) -> float:
    """Seconds of this thread's CPU time one pass of a fixed piece of plain Python takes
    (:class:`_Layer`: calls through eight small objects): how fast this CPU runs the
    Python between torch ops, which the cost model scales by it from one CPU to another
    (:meth:`placer.target.CpuScale.host_seconds`). The fastest of ``rounds``; a few
    milliseconds in all."""
    layer = _Layer(8)
    layer(1.0)
    times = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(per_round):
            layer(1.0)
        times.append(time.thread_time() - t0)
    return min(times) / per_round

