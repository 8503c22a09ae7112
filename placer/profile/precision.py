"""Checking a lower precision's accuracy here, before it can be chosen.

May import: numpy, placer.data, placer.devices, placer.executor, placer.pipeline, placer.precision,
placer.costmodel.counts (counting a stage's work under autocast); torch inside functions.

For every stage with allowed lower precisions (:meth:`placer.pipeline.Pipeline.allowed_precisions`),
:func:`check_precisions` runs the pipeline once in fp32 on this machine's CPU (every stage seeded
alike), then runs the stage again on the same inputs in each allowed precision and compares:

- ``bf16``, ``fp16``: ``torch.autocast`` on the CPU, which is real (the products run in the lower type)
  and is timed like any other option, with CUDA's fp32 list (:func:`placer.precision.cuda_fp32_list`:
  layer norm, softmax, sums... in fp32, as a GPU's autocast runs them; CPU autocast alone runs them
  in bf16). A CPU without native bf16 (or fp16) products runs them a
  hundred times slower than fp32 (this machine's 256³ product is timed in both first, :func:`cpu_slowdown`):
  there the products are computed by fp32 kernels from the same lower-precision inputs and rounded
  back (:func:`placer.precision.emulated_autocast`, the numbers a tensor core gives), and the
  stage's time in that precision is charged as its fp32 time times the measured slowdown;
- ``tf32``: a CPU has no TF32, so it is emulated (:func:`placer.precision.emulated_tf32`: the fp32
  inputs of every matrix product, convolution and attention rounded to TF32's 10-bit mantissa, as
  tensor cores read them, backward passes included). The emulation is the measurement; the bf16
  run (7-bit mantissa) is a stricter bound when both are allowed.

For ``bf16`` and ``fp16`` a one-shot stage's work is also counted once in fp32 and once under
autocast (:func:`counted_under`) on the same input, and the check keeps the ratios of bytes moved,
kernels launched and calls dispatched (:func:`work_ratios`): autocast makes the products' outputs,
and the elementwise ops that consume them, two-byte, keeps its fp32-list ops (layer norm, softmax,
losses, sums) and the master weights in fp32, and adds casts. A GPU's roofline prices the
precision with those counts (:func:`placer.costmodel.precision.under`). CPU autocast's op lists
are CUDA's but for a few ops (see ``docs/precision.md``).

The difference is the largest relative difference by norm over the output's floating-point
values (``outputs``); for a stage whose output has a ``loss`` or ``losses`` entry (a training
step's), that entry alone (``loss``). A one-shot stage is called on the fp32 run's inputs (the
least time of a few calls is kept); a stage of a stream runs with its stream (the whole pipeline
again, once per precision). A precision whose difference exceeds the stage's tolerance
(``Stage.tolerance``, default :data:`placer.precision.DEFAULT_TOLERANCE`) is never chosen.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from placer.data.measures import PrecisionCheck
from placer.pipeline import Impl, Pipeline, Stage
from placer.precision import AUTO, DEFAULT_TOLERANCE, emulated_autocast, emulated_tf32

log = logging.getLogger("placer")

#: calls of a one-shot stage timed per precision (the least is kept)
TIMED_CALLS = 3
#: seconds a stage's timed calls may take in all before the repeats stop (one call is always made)
REPEAT_BUDGET_S = 0.5
#: a difference that cannot be measured (shapes, types or non-finite values differ)
UNMEASURABLE = 1e9
#: output entries that hold a training stage's loss
LOSS_KEYS = ("loss", "losses")

#: a lower precision's 256³ product this many times slower than fp32 means the CPU has no native one
SLOW = 3.0

METHODS = {
    "tf32": "emulated here: the fp32 inputs of matrix products, convolutions and attention rounded to "
            "TF32's 10-bit mantissa",
    "bf16": "torch.autocast(bfloat16) on this CPU",
    "fp16": "torch.autocast(float16) on this CPU",
}
EMULATED = ("torch.autocast({}) on this CPU, its products computed by fp32 kernels from the same {} inputs "
            "(this CPU has no fast {} products: a 256³ product takes {:.0f}x fp32's time, which its time here is "
            "charged)")


def allowed(pipeline: Pipeline, auto: bool = False) -> dict[str, tuple[str, ...]]:
    """Stage → the lower precisions it may run in (with ``auto``: :data:`placer.precision.AUTO` on
    every stage that declares none and has a torch implementation)."""
    out = {}
    for n, st in pipeline.stages.items():
        own = pipeline.allowed_precisions(n)
        if not own and auto and st.precision is None and _torch_stage(st):
            own = AUTO
        if own:
            out[n] = tuple(own)
    return out


def _torch_stage(st: Stage) -> bool:
    return st.role != "source" and any(i is not None and i.api == "torch" for i in (st.fn, st.cpu, st.gpu))


def check_precisions(pipeline: Pipeline, precisions: Mapping[str, tuple[str, ...]] | None = None, *,
                     auto: bool = False) -> dict[str, list[PrecisionCheck]]:
    """Run each stage's allowed lower precisions here and compare them with fp32 (see the module).

    Parameters
    ----------
    pipeline : Pipeline
        Built at the size to check (the profiled input).
    precisions : mapping, optional
        Stage → precisions to check (default: :func:`allowed`).
    auto : bool
        With no ``precisions``: as ``--precision auto`` (see :func:`allowed`).

    Returns
    -------
    dict
        Stage → one :class:`~placer.data.measures.PrecisionCheck` per precision.
    """
    from placer.executor import call_stage, execute
    from placer.devices import discover

    p = pipeline.validate()
    todo = dict(precisions) if precisions is not None else allowed(p, auto)
    todo = {n: v for n, v in todo.items() if v}
    if not todo:
        return {}
    cpu = discover().get("cpu")
    with seeded():
        ref = execute(p, "all=cpu")
    out: dict[str, list[PrecisionCheck]] = {}
    for name, precs in todo.items():
        st = p.stages[name]
        tol = st.tolerance or DEFAULT_TOLERANCE
        checks = []
        if st.role == "once":
            ins = {a: ref.outputs[src] for a, src in st.inputs.items()}
            base, base_s = _timed(lambda s=st: call_stage(s, cpu, ins, workers=cpu.workers))
            base_work = None
            for prec in precs:
                variant = _variant(st, prec)
                got, secs = _timed(lambda s=variant: call_stage(s, cpu, ins, workers=cpu.workers))
                c = measured_check(prec, base, got, tol, secs, base_s, p.size)
                if prec in ("bf16", "fp16"):
                    if base_work is None:
                        base_work = counted_under(lambda: call_stage(st, cpu, ins), "fp32")
                    c = c.model_copy(update=work_ratios(base_work, counted_under(lambda: call_stage(st, cpu, ins),
                                                                                 prec), p.size))
                checks.append(c)
        else:
            base, base_s = _stream_output(ref, name), ref.stage(name).seconds
            for prec in precs:
                variant_p = _with_stage(p, _variant(p.stages[name], prec))
                with seeded():
                    run = execute(variant_p, "all=cpu")
                checks.append(measured_check(prec, base, _stream_output(run, name), tol, run.stage(name).seconds,
                                             base_s, p.size))
        for c in checks:
            log.info("stage %r in %s: %s (%s)", name, c.precision, c.words(), c.method)
        out[name] = checks
    return out


def counted_under(call, prec: str):
    """The work of ``call()`` counted (:func:`placer.costmodel.counts.count_work`, one run) in ``prec``:
    ``fp32`` as it is; ``bf16``, ``fp16`` under ``torch.autocast`` on the CPU (emulated when this CPU has
    no native products in that type: the counter sees the same ops and types either way, since it sits
    above the emulation), so each op's tensors have the type autocast gives them."""
    from placer.costmodel.counts import count_work

    with seeded(), as_on_gpu(prec):
        return count_work(call, repeats=1)[1]


def work_ratios(fp32: Any, low: Any, size: int | None = None) -> dict[str, Any]:
    """``bytes_ratio``, ``ops_ratio``, ``calls_ratio`` of work counted in a lower precision over fp32's, and
    the counts themselves at ``size`` (``counted``, when a size is given)."""
    def r(a: float, b: float) -> float | None:
        return float(a) / float(b) if a > 0 and b > 0 else None

    out: dict[str, Any] = {"bytes_ratio": r(low.bytes, fp32.bytes), "ops_ratio": r(low.ops, fp32.ops),
                           "calls_ratio": r(low.calls, fp32.calls)}
    if size is not None:
        out["counted"] = [counts_at(size, fp32, low)]
    return out


def counts_at(size: float, fp32: Any, low: Any) -> dict[str, float]:
    """One entry of :attr:`PrecisionCheck.counted`."""
    return {"size": float(size), "bytes": fp32.bytes, "low_bytes": low.bytes, "ops": float(fp32.ops),
            "low_ops": float(low.ops), "calls": float(fp32.calls), "low_calls": float(low.calls)}


def count_precisions(pipeline: Pipeline, todo: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, dict]]:
    """Stage → precision → the counts (:func:`counts_at`) of each one-shot stage in ``todo`` in fp32 and under
    autocast (bf16, fp16 only), on the pipeline as built (its own size): a second size for the checks'
    counts (:func:`placer.site.attach_precision_checks`)."""
    from placer.devices import discover
    from placer.executor import call_stage, execute

    p = pipeline.validate()
    cpu = discover().get("cpu")
    todo = {n: [q for q in v if q in ("bf16", "fp16")] for n, v in todo.items()
            if n in p.stages and p.stages[n].role == "once"}
    todo = {n: v for n, v in todo.items() if v}
    if not todo:
        return {}
    with seeded():
        ref = execute(p, "all=cpu")
    out: dict[str, dict[str, dict]] = {}
    for name, precs in todo.items():
        st = p.stages[name]
        ins = {a: ref.outputs[src] for a, src in st.inputs.items()}
        base = counted_under(lambda: call_stage(st, cpu, ins), "fp32")
        out[name] = {q: counts_at(p.size or 0, base, counted_under(lambda: call_stage(st, cpu, ins), q))
                     for q in precs}
    return out


def measured_check(prec: str, base: Any, got: Any, tol: float, secs: float, base_s: float,
                   size: int | None) -> PrecisionCheck:
    """The one accuracy check of a lower precision: ``got`` (a run in ``prec``) against ``base`` (fp32's).

    The difference is :func:`relative_difference` (the loss when ``base`` has one); the time is the run's
    own ``secs``, except where this CPU has no native products in ``prec`` (:func:`cpu_slowdown`): there the
    run was emulated, so the time charged is fp32's ``base_s`` times the measured slowdown and the method
    says so. Every check of a stage, of a stream's step and of a plain script's step is made here.
    """
    metric, diff = relative_difference(got, base)
    slow = cpu_slowdown(prec)
    method = METHODS[prec] if slow is None else EMULATED.format(
        "bfloat16" if prec == "bf16" else "float16", prec, prec, slow)
    return PrecisionCheck(precision=prec, metric=metric, rel_error=diff, tolerance=tol, method=method,
                          seconds=base_s * slow if slow is not None else secs, fp32_seconds=base_s, size=size)


def _variant(st: Stage, prec: str) -> Stage:
    """``st`` as a GPU runs it in ``prec``, here: CPU autocast with CUDA's fp32 list
    (:func:`placer.precision.cuda_fp32_list`) on a CPU with native products in that type, else
    emulated (:func:`placer.precision.emulated_autocast`; TF32 always emulated), around each call."""
    upd = {slot: Impl(fn=emulating(impl.fn, prec), api=impl.api) for slot in ("fn", "cpu", "gpu")
           if (impl := getattr(st, slot)) is not None}
    return st.model_copy(update=upd)


@contextlib.contextmanager
def native_autocast(prec: str):
    """CPU autocast in ``prec`` with CUDA's fp32 list (:func:`placer.precision.cuda_fp32_list`), for a
    CPU with native products in that type."""
    from placer.precision import cuda_fp32_list, running_in

    with running_in(prec, "cpu"), cuda_fp32_list():
        yield


def emulating(fn, prec: str):
    """``fn`` wrapped to run as a GPU runs it in ``prec``, here (TF32 emulated; bf16 and fp16 by
    :func:`native_autocast`, or :func:`placer.precision.emulated_autocast` on a CPU without native products)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with as_on_gpu(prec):
            return fn(*args, **kwargs)

    return run


def as_on_gpu(prec: str) -> contextlib.AbstractContextManager:
    """The block run here as a GPU runs it in ``prec``, the one choice of how: ``fp32`` as it is; ``tf32``
    emulated (:func:`placer.precision.emulated_tf32`); ``bf16`` and ``fp16`` by :func:`native_autocast`, or
    :func:`placer.precision.emulated_autocast` on a CPU without native products in that type
    (:func:`cpu_slowdown`)."""
    if prec == "fp32":
        return contextlib.nullcontext()
    if prec == "tf32":
        return emulated_tf32()
    return emulated_autocast(prec) if cpu_slowdown(prec) is not None else native_autocast(prec)


@functools.lru_cache(maxsize=None)
def cpu_slowdown(prec: str) -> float | None:
    """How many times slower this CPU's ``prec`` (``bf16``, ``fp16``) 256³ product is than fp32's (the
    least of three runs each, at one thread), when it is more than :data:`SLOW` (no native products);
    else None.
    Measured once per process (a few tenths of a second on a CPU without native bf16)."""
    import torch

    if prec == "tf32":
        return None
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    low = torch.bfloat16 if prec == "bf16" else torch.float16

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    def lower():
        with torch.autocast("cpu", dtype=low):
            return a @ b

    old = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread's rates: a pool waiting for busy cores hides the difference
    try:
        ratio = best(lower) / max(best(lambda: a @ b), 1e-9)
    finally:
        torch.set_num_threads(old)
    return ratio if ratio > SLOW else None


def _with_stage(p: Pipeline, st: Stage) -> Pipeline:
    q = p.with_precision({})
    q.graph.nodes[st.name]["stage"] = st
    return q


def _stream_output(run: Any, name: str) -> Any:
    """A stream stage's output: its own when the run kept it, else the run's final outputs."""
    return run.outputs[name] if name in run.outputs else dict(run.final_outputs)


def _timed(call) -> tuple[Any, float]:
    """The call's output and the least of up to :data:`TIMED_CALLS` timings (calls after the first only
    while they stay within :data:`REPEAT_BUDGET_S` in all)."""
    best, out, spent = float("inf"), None, 0.0
    for _ in range(TIMED_CALLS):
        with seeded():
            t0 = time.perf_counter()
            out = call()
            took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent + took > REPEAT_BUDGET_S:
            break
    return out, best


@contextlib.contextmanager
def seeded(seed: int = 0):
    """Every run starts from the same random state (a model's initial weights alike), restored after."""
    import torch

    state, np_state = torch.random.get_rng_state(), np.random.get_state()
    torch.manual_seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)
        np.random.set_state(np_state)


def relative_difference(got: Any, ref: Any) -> tuple[str, float]:
    """``(metric, difference)`` of ``got`` from ``ref``: ``loss`` when ``ref`` has a loss entry (that entry
    compared), else ``outputs``; the largest relative difference by norm over their floating-point
    parts (integers and other values: the share that differ). Shapes or non-finite values that differ
    give :data:`UNMEASURABLE`."""
    metric = "outputs"
    if isinstance(ref, Mapping):
        key = next((k for k in LOSS_KEYS if k in ref), None)
        if key is not None and isinstance(got, Mapping) and key in got:
            got, ref, metric = got[key], ref[key], "loss"
    a, b = _leaves(got), _leaves(ref)
    if len(a) != len(b):
        return metric, UNMEASURABLE
    worst = 0.0
    for x, y in zip(a, b):
        worst = max(worst, _leaf_difference(x, y))
    return metric, float(min(worst, UNMEASURABLE))


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, Mapping):
        return [v for k in sorted(obj, key=str) for v in _leaves(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [v for x in obj for v in _leaves(x)]
    if hasattr(obj, "state_dict") and callable(obj.state_dict):  # a model, an optimizer
        try:
            return _leaves(dict(obj.state_dict()))
        except Exception:  # noqa: BLE001 - an object whose state_dict needs arguments
            return [obj]
    return [obj]


def _as_array(x: Any) -> np.ndarray | None:
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.double()
        return x.numpy()
    if isinstance(x, (np.ndarray, np.generic, int, float, bool)):
        return np.asarray(x)
    if hasattr(x, "to_numpy"):  # pandas
        try:
            return np.asarray(x.to_numpy())
        except Exception:  # noqa: BLE001
            return None
    return None


def _leaf_difference(x: Any, y: Any) -> float:
    a, b = _as_array(x), _as_array(y)
    if a is None or b is None:
        return 0.0 if _same(x, y) else 1.0
    if a.shape != b.shape:
        return UNMEASURABLE
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        a, b = a.astype(np.float64), b.astype(np.float64)
        fa, fb = np.isfinite(a), np.isfinite(b)
        if not np.array_equal(fa, fb):
            return UNMEASURABLE
        if not fa.all() and not np.array_equal(a[~fa], b[~fb]):
            return UNMEASURABLE
        a, b = a[fa], b[fb]
        scale = float(np.linalg.norm(b))
        diff = float(np.linalg.norm(a - b))
        if scale == 0.0:
            return 0.0 if diff == 0.0 else UNMEASURABLE
        return diff / scale
    return float(np.mean(a != b)) if a.size else 0.0


def _same(x: Any, y: Any) -> bool:
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - values that do not compare
        return True
