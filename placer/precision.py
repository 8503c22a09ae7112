"""Precisions a stage may run in, and running a block of code in one.

May import: placer.errors, placer.devices (its registry reads a device's name); torch inside functions
(planning and validation never load it).

A stage runs in ``fp32`` (torch's default: nothing changes numerics) unless its
declaration allows a lower precision (``precision=("tf32", "bf16")`` on the stage,
or the pipeline's default) or the user fixes one (``--precision train=bf16``):

- ``tf32``: matrix products and convolutions of fp32 tensors round their inputs to a
  10-bit mantissa on tensor cores (``torch.set_float32_matmul_precision("high")`` and
  cuDNN's ``allow_tf32``); a CPU has no TF32, so there the stage's numbers and time
  do not change.
- ``bf16``, ``fp16``: ``torch.autocast`` on the stage's device type (real on the CPU
  for ``bf16``): matrix products, convolutions and attention run in the lower type,
  reductions and losses stay in fp32.

:func:`running_in` sets one for a block and restores every setting it changed when
the block ends, also on an error.

Examples
--------
>>> check_precision("BF16", stage="train")
'bf16'
>>> parse_precision_option("train=bf16,eval=tf32", ["train", "eval"])
(False, {'train': 'bf16', 'eval': 'tf32'})
>>> parse_precision_option("auto", ["train"])
(True, {})
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from placer.errors import PipelineError, PlacementError

#: every precision a stage may run in; ``fp32`` is torch's default (nothing changed)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
#: the lower ones, which change numerics and must be allowed
LOWER = ("tf32", "bf16", "fp16")
#: what ``--precision auto`` allows on every stage (fp16 needs a gradient scaler in a
#: training loop, which placer cannot add to a user's step: it is allowed only when declared)
AUTO = ("tf32", "bf16")
#: a lower precision is chosen only when the relative difference of the stage's outputs
#: (its loss, for a training stage) from fp32 stays within this (settable per stage)
DEFAULT_TOLERANCE = 0.01


def check_precision(value: str, *, stage: str | None = None, field: str = "precision") -> str:
    """``value`` as a known precision name (lower case), or a :class:`PipelineError` naming the stage and the fix."""
    v = str(value).strip().lower()
    if v not in PRECISIONS:
        where = f"stage {stage!r}: " if stage else ""
        raise PipelineError(f"{where}unknown {field} {value!r}; use one of {', '.join(PRECISIONS)}", stage=stage)
    return v


def check_allowed(values: Iterable[str] | str | None, *, stage: str | None = None) -> tuple[str, ...] | None:
    """A declared ``precision=`` as a tuple of known names (a single name is one), fp32 dropped."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out = []
    for v in values:
        p = check_precision(v, stage=stage)
        if p != "fp32" and p not in out:
            out.append(p)
    return tuple(out)


def parse_precision_option(text: str | None, stages: Iterable[str]) -> tuple[bool, dict[str, str]]:
    """Read ``--precision``: ``auto`` (every stage may take :data:`AUTO`, checked for accuracy) and/or
    ``STAGE=PRECISION`` pairs (each fixes one stage), comma-separated.

    Returns ``(auto, fixed)``. Raises :class:`~placer.errors.PlacementError` (a usage error)
    naming an unknown stage or precision and the fix.
    """
    names = list(stages)
    auto, fixed = False, {}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        if part.lower() == "auto":
            auto = True
            continue
        stage, sep, value = part.partition("=")
        stage, value = stage.strip(), value.strip()
        if not sep or not stage or not value:
            raise PlacementError(f"--precision: cannot read {part!r}; give auto or STAGE=PRECISION "
                                 f"(e.g. train=bf16), comma-separated")
        if stage not in names:
            raise PlacementError(f"--precision: no stage {stage!r} in the pipeline; stages: {', '.join(names)}")
        try:
            fixed[stage] = check_precision(value, stage=stage)
        except PipelineError as exc:
            raise PlacementError(f"--precision: {exc}") from None
    return auto, fixed


def device_type(device: object) -> str:
    """The torch device type (``cpu``, ``cuda``) of a placer device, a torch device or a name.

    A name is read by the device registry, placer's (``gpu:1``) or torch's (``cuda:1``): a real GPU's
    type is ``cuda``; every other device (the CPU, the simulated test device) computes on the CPU."""
    dt = getattr(device, "type", None)
    if isinstance(dt, str):
        return dt
    torch_device = getattr(device, "torch_device", None)
    if callable(torch_device):
        try:
            return torch_device().type
        except Exception:  # noqa: BLE001 - a device kind without a torch device
            return "cpu"
    from placer.devices import is_real_gpu, torch_device_name

    name = str(device).strip().lower()
    return "cuda" if is_real_gpu(torch_device_name(name) or name) else "cpu"


@contextlib.contextmanager
def running_in(precision: str, device: object = "cpu") -> Iterator[None]:
    """Run the block in ``precision`` on ``device``'s type; every setting changed is restored after it.

    ``fp32`` changes nothing on a CPU (torch is not even imported); on a CUDA device it
    turns TF32 off for the block (cuDNN's ``allow_tf32``, which torch leaves on by
    default for convolutions, and the fp32 matrix-product precision ``"highest"``), so
    a stage placed on the GPU computes in the fp32 its accuracy was judged in and its
    outputs match the CPU's within fp32 rounding: TF32 is a precision a stage must be
    allowed, like bf16 (``--precision STAGE=tf32`` or ``auto``). ``tf32`` sets the fp32
    matrix-product precision to ``"high"`` and cuDNN's ``allow_tf32``; ``bf16`` and
    ``fp16`` enter ``torch.autocast`` on the device's type (fp16 on a CPU too, where
    torch supports it). A training loop in fp16 needs a ``torch.amp.GradScaler``
    around its backward pass and optimizer step: placer cannot add one to a user's
    step, which is why ``auto`` never allows fp16 (declare it on a step that scales
    its own loss).

    Autocast's cast cache is off (``cache_enabled=False``): a stage's whole training loop
    runs inside the one region, and the cache would keep the first lower-precision copy of
    each weight for all of it, so every step after the first would compute with the
    initial weights. Each use casts the weight as it is now, as a GPU step under autocast
    around its forward pass does.
    """
    p = check_precision(precision)
    if p == "fp32" and device_type(device) != "cuda":
        yield
        return
    import torch

    if p in ("fp32", "tf32"):
        old_matmul = torch.get_float32_matmul_precision()
        old_cudnn = torch.backends.cudnn.allow_tf32
        old_cuda = torch.backends.cuda.matmul.allow_tf32
        torch.set_float32_matmul_precision("high" if p == "tf32" else "highest")
        torch.backends.cudnn.allow_tf32 = p == "tf32"
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(old_matmul)
            torch.backends.cudnn.allow_tf32 = old_cudnn
            torch.backends.cuda.matmul.allow_tf32 = old_cuda
        return
    dtype = torch.bfloat16 if p == "bf16" else torch.float16
    with torch.autocast(device_type=device_type(device), dtype=dtype, cache_enabled=False):
        yield


def state() -> dict[str, object]:
    """torch's precision settings now (for checks that :func:`running_in` restored them)."""
    import torch

    return {
        "matmul": torch.get_float32_matmul_precision(),
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "autocast_cuda": torch.is_autocast_enabled("cuda"),
    }


#: fp32 mantissa bits TF32 drops (23 kept by fp32, 10 by TF32)
_TF32_DROPPED = 13
#: aten ops whose fp32 inputs tensor cores round to TF32 (matrix products, convolutions, attention)
TF32_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "dot", "vdot", "mv", "addmv", "linear",
    "convolution", "convolution_backward", "_convolution", "conv1d", "conv2d", "conv3d",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
})


def round_to_tf32(t):
    """An fp32 tensor rounded to TF32's 10-bit mantissa (to nearest; infinities and NaNs kept), as a
    GPU's tensor cores read it; any other tensor as it is."""
    import torch

    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    bits = t.detach().contiguous().view(torch.int32)
    half, mask = 1 << (_TF32_DROPPED - 1), ~((1 << _TF32_DROPPED) - 1)
    rounded = ((bits + half) & mask).view(torch.float32).reshape(t.shape)
    return torch.where(torch.isfinite(t), rounded, t)


@contextlib.contextmanager
def emulated_tf32() -> Iterator[None]:
    """Run the block on the CPU as TF32 would run it on a GPU: the fp32 inputs of every matrix
    product, convolution and attention (:data:`TF32_OPS`, backward passes included) rounded to a
    10-bit mantissa, products accumulated in fp32. An emulation, not a bound: cuBLAS may split
    sums differently, which moves results by fp32 rounding only."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    class _TF32(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "aten" and func.__name__.split(".")[0] in TF32_OPS:
                args, kwargs = tree_map(round_to_tf32, (args, kwargs))
            return func(*args, **kwargs)

    with _TF32():
        yield


#: ops CUDA's autocast runs in fp32 that CPU autocast runs in the input's type (torch 2.x op lists: on
#: CUDA these are on the fp32 list; on the CPU they follow their inputs). The losses, ``cdist``,
#: ``prod`` and the other ops on both fp32 lists need nothing: CPU autocast already upcasts them.
CUDA_ONLY_FP32 = frozenset({
    "layer_norm", "group_norm", "softmax", "log_softmax", "softmin", "sum", "norm", "normalize", "cumsum",
    "cumprod", "exp", "expm1", "log", "log10", "log1p", "log2", "pow", "reciprocal", "rsqrt", "softplus",
    "acos", "asin", "cosh", "sinh", "tan", "erfinv", "dist", "renorm", "cosine_similarity", "pdist",
})


@contextlib.contextmanager
def cuda_fp32_list() -> Iterator[None]:
    """Within CPU autocast, run the ops CUDA's autocast keeps in fp32 (:data:`CUDA_ONLY_FP32`: layer
    and group norm, softmax, sums, exponentials and logarithms...) in fp32, as on a GPU: their
    lower-precision floating-point inputs are cast to fp32 first, so they and their backward passes
    compute and write fp32. Outside autocast it changes nothing."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    low = (torch.bfloat16, torch.float16)

    def up(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype in low else x

    class _GPULists(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", "") in CUDA_ONLY_FP32 and torch.is_autocast_enabled("cpu"):
                args, kwargs = tree_map(up, (args, kwargs))
            return func(*args, **kwargs)

    with _GPULists():
        yield


#: the products :func:`emulated_autocast` computes in fp32 (attention kernels, whose extra outputs
#: stay fp32, run as autocast gives them)
_PRODUCTS = frozenset(n for n in TF32_OPS if "attention" not in n)


@contextlib.contextmanager
def emulated_autocast(precision: str) -> Iterator[None]:
    """``torch.autocast`` on the CPU in ``precision`` (``bf16``, ``fp16``), with the products computed
    by fp32 kernels: every matrix product, convolution and attention (:data:`TF32_OPS`) whose inputs
    autocast made lower-precision reads them exactly in fp32, accumulates in fp32 and rounds its
    result back to the lower type, as a GPU's tensor cores do. Everything else (casts, elementwise
    work in the lower type, reductions autocast keeps in fp32) is autocast's own. For a CPU whose own
    bf16 products are slow (no native bf16: a hundred times fp32's time), this gives autocast's
    numbers at fp32's speed. The ops CUDA's autocast keeps in fp32 and the CPU's does not run in
    fp32 (:func:`cuda_fp32_list`), so the numbers and the types are a GPU's."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    low = torch.bfloat16 if check_precision(precision) == "bf16" else torch.float16

    def up(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype == low else x

    def down(y):
        return y.to(low) if isinstance(y, torch.Tensor) and y.dtype == torch.float32 else y

    class _Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "aten" and func.__name__.split(".")[0] in _PRODUCTS and any(
                    isinstance(t, torch.Tensor) and t.dtype == low for t in tree_flatten((args, kwargs))[0]):
                return tree_map(down, func(*tree_map(up, args), **tree_map(up, kwargs)))
            return func(*args, **kwargs)

    with torch.autocast(device_type="cpu", dtype=low, cache_enabled=False), _Products(), cuda_fp32_list():
        yield
