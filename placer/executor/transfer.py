"""Moving data between the host and devices, and adapting it to an implementation.

May import: numpy, placer.devices; torch and numba.cuda inside functions.

Two separate steps:

* :func:`to_location` moves a value to a device's memory (a real copy, counted in
  bytes): host arrays become torch tensors on the GPU, GPU tensors come back as
  host torch tensors. Host→GPU copies of at least :data:`PIN_THRESHOLD` bytes are
  staged through pinned (page-locked) memory, which the reference measurements show
  is up to 7× faster than pageable copies.
* :func:`adapt` converts a value already at the right place to the data format an
  implementation takes (``numpy``, ``torch`` or ``numba.cuda``), without copying
  where possible.

Values may be arrays, tensors, numba device arrays, ``torch.nn.Module`` objects
(copied, never moved in place), and lists/tuples/dicts of these; anything else
passes through unchanged and counts zero bytes.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import numpy as np

from placer.devices import Device

#: host→device copies of at least this many bytes go through pinned memory
PIN_THRESHOLD = 1 << 20


def _torch():
    return sys.modules.get("torch")


def _is_tensor(v: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(v, t.Tensor)


def _is_module(v: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(v, t.nn.Module)


def _is_cuda_array(v: Any) -> bool:
    return hasattr(v, "copy_to_host") and hasattr(v, "shape") and not isinstance(v, np.ndarray)


_SCALARS = (int, float, bool, str, bytes, type(None))


def nbytes(value: Any) -> int:
    """Bytes of array data in a value (tensors, arrays, modules, containers)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, _SCALARS):
        return 0
    if _is_tensor(value):
        return int(value.nelement() * value.element_size())
    if _is_module(value):
        return sum(nbytes(p) for p in value.state_dict().values())
    if _is_cuda_array(value):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0) or 0) if hasattr(value, "dtype") else 0


def _map(value: Any, leaf) -> Any:
    if isinstance(value, dict):
        return {k: _map(v, leaf) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_map(v, leaf) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, leaf) for v in value)
    return leaf(value)


# -- moving -----------------------------------------------------------------------------
def to_location(value: Any, device: Device, *, stream=None) -> tuple[Any, int, bool]:
    """Copy ``value`` into ``device``'s memory.

    Returns
    -------
    (value, nbytes, pinned)
        The moved value, the bytes copied, and whether pinned staging was used.
    """
    moved = [0]
    pinned = [False]

    def leaf(v):
        if device.kind == "cpu":
            out = _to_host_leaf(v)
        elif device.kind == "gpu":
            out = _to_gpu_leaf(v, device, pinned, stream)
        else:
            out = _to_sim_leaf(v)
        if out is not v:
            moved[0] += nbytes(v)
        return out

    out = _map(value, leaf)
    if device.kind == "gpu" and moved[0]:
        import torch

        (stream or torch.cuda.current_stream(device.index)).synchronize()
    return out, moved[0], pinned[0]


def _to_host_leaf(v: Any) -> Any:
    if _is_tensor(v):
        if v.device.type == "cpu":
            return v.clone()  # leaving the simulated device: a real copy
        return v.detach().to("cpu")
    if _is_cuda_array(v):
        return v.copy_to_host()
    if _is_module(v):
        return copy.deepcopy(v).to("cpu")
    return v


def _to_gpu_leaf(v: Any, device: Device, pinned: list, stream) -> Any:
    import torch

    dev = device.torch_device()
    if isinstance(v, np.ndarray):
        v = torch.from_numpy(np.ascontiguousarray(v))
    if _is_cuda_array(v):
        return torch.as_tensor(v, device=dev)
    if _is_tensor(v):
        if v.device == dev:
            return v
        if v.device.type == "cpu" and v.nelement() * v.element_size() >= PIN_THRESHOLD:
            pinned[0] = True
            with torch.cuda.stream(stream) if stream is not None else _null():
                return v.pin_memory().to(dev, non_blocking=True)
        return v.to(dev)
    if _is_module(v):
        return copy.deepcopy(v).to(dev)
    return v


def _to_sim_leaf(v: Any) -> Any:
    """The simulated device keeps data in host memory; moving there is a real copy."""
    import torch

    if isinstance(v, np.ndarray):
        return torch.from_numpy(v.copy())
    if _is_tensor(v):
        return v.detach().clone()
    if _is_cuda_array(v):
        return torch.from_numpy(np.array(v.copy_to_host()))
    if _is_module(v):
        return copy.deepcopy(v)
    return v


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# -- adapting ---------------------------------------------------------------------------
def adapt(value: Any, api: str, device: Device) -> Any:
    """Convert a value at ``device``'s location to the format ``api`` takes (no transfer)."""
    if api == "any" or isinstance(value, _SCALARS) or (api == "numpy" and isinstance(value, np.ndarray)):
        return value
    if api == "numpy":
        return _map(value, _as_numpy)
    if api == "torch":
        return _map(value, _as_torch)
    if api == "numba.cuda":
        return _map(value, lambda v: _as_cuda_array(v, device))
    raise ValueError(f"unknown implementation api {api!r}")


def _as_numpy(v: Any) -> Any:
    if _is_tensor(v):
        if v.device.type != "cpu":
            raise RuntimeError("internal: a device tensor reached a host implementation")
        return v.detach().numpy()
    return v


def _as_torch(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        import torch

        if v.dtype == object:
            return v
        return torch.from_numpy(np.ascontiguousarray(v))
    if _is_cuda_array(v):
        import torch

        if hasattr(v, "__cuda_array_interface__") and not _simulated_cuda():
            return torch.as_tensor(v, device="cuda")
        return torch.from_numpy(np.array(v.copy_to_host()))
    return v


def _as_cuda_array(v: Any, device: Device) -> Any:
    from numba import cuda

    if _simulated_cuda():
        if _is_tensor(v):
            return cuda.to_device(v.detach().numpy())
        if isinstance(v, np.ndarray):
            return cuda.to_device(v)
        return v
    if _is_tensor(v):
        return cuda.as_cuda_array(v.detach())
    if isinstance(v, np.ndarray):
        return cuda.to_device(v)
    return v


def _simulated_cuda() -> bool:
    import os

    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def normalize_output(value: Any, device: Device) -> Any:
    """Bring an implementation's output to the canonical form for its location.

    On a GPU the canonical form is a torch tensor on that GPU (numba device arrays
    are wrapped without copying); on the simulated device a CPU torch tensor.
    """
    if device.kind == "cpu":
        return value

    def leaf(v):
        if _is_cuda_array(v):
            return _as_torch(v)
        return v

    return _map(value, leaf)


def synchronize(device: Device, api: str) -> None:
    """Wait until the device has finished the work queued so far."""
    if device.kind != "gpu":
        return
    import torch

    torch.cuda.synchronize(device.index)
    if api == "numba.cuda":
        from numba import cuda

        cuda.synchronize()
