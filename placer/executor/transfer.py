"""Moving data between the host and devices, and adapting it to an implementation.

May import: numpy, placer.devices, placer.data.measures (the copy-kind rule, :func:`copy_mode`);
torch and numba.cuda inside functions.

Two separate steps:

* :func:`to_location` moves a value to a device's memory (a real copy, counted in
  bytes). The device kinds do the copying (:mod:`placer.devices`): a leaf that a
  kind holds (a CUDA tensor, say) is copied out to the host by that kind, and a
  leaf bound for a device is copied in by the device's kind, staged through pinned
  memory where :func:`placer.data.measures.copy_mode` says so (host→device copies of
  at least :data:`PIN_THRESHOLD` bytes), the rule the cost model prices copies by.
* :func:`adapt` converts a value already at the right place to the data format an
  implementation takes (``numpy``, ``torch`` or ``numba.cuda``), without copying
  where possible.

Values may be arrays, tensors, numba device arrays, ``torch.nn.Module`` objects
(copied, never moved in place), and lists/tuples/dicts of these; anything else
passes through unchanged and counts zero bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placer.data.measures import PIN_THRESHOLD, copy_mode
from placer.devices import CopyState, Device, DeviceKind, kinds
from placer.devices.registry import generation
from placer.devices.values import is_cuda_array as _is_cuda_array
from placer.devices.values import is_module as _is_module
from placer.devices.values import is_tensor as _is_tensor
from placer.devices.values import numba_cuda_simulated as _simulated_cuda

__all__ = ["PIN_THRESHOLD", "adapt", "nbytes", "normalize_output", "synchronize", "to_location"]

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
def to_location(value: Any, device: Device, *, stream=None, pin: bool = True) -> tuple[Any, int, bool]:
    """Copy ``value`` into ``device``'s memory (``pin=False``: never through pinned staging).

    Returns
    -------
    (value, nbytes, pinned)
        The moved value, the bytes copied, and whether pinned staging was used.
    """
    target = device.driver
    holders = _holders()
    state = CopyState(stream, pin, stage=lambda nb: copy_mode("h2d", nb, pin=pin) == "staged")
    moved = [0]

    def leaf(v):
        out = _copy_leaf(v, device, target, holders, state)
        if out is not v:
            moved[0] += nbytes(v)
        return out

    out = _map(value, leaf)
    if moved[0]:
        target.finish_copy_in(device, state)
    return out, moved[0], state.pinned


_holders_of: tuple[int, list[DeviceKind]] = (-1, [])


def _holders() -> list[DeviceKind]:
    """Kinds that hold values of their own, newest first (the most specific kinds ask first)."""
    global _holders_of
    gen = generation()
    if _holders_of[0] != gen:
        _holders_of = (gen, [k for k in reversed(kinds().values()) if type(k).holds is not DeviceKind.holds])
    return _holders_of[1]


def _copy_leaf(v: Any, device: Device, target: DeviceKind, holders: list[DeviceKind], state: CopyState) -> Any:
    """One leaf to ``device``: out of the kind that holds it (if another), then into the target."""
    holder = next((k for k in holders if k.holds(v)), None)
    if holder is not None and holder is not target:
        v = holder.copy_out(v)
        if not target.accelerator:
            return v
    return target.copy_in(v, device, state)


def synchronize(device: Device, api: str) -> None:
    """Wait until the device has finished the work queued so far."""
    device.synchronize(api)


# -- adapting ---------------------------------------------------------------------------
def adapt(value: Any, api: str, device: Device) -> Any:
    """Convert a value at ``device``'s location to the format ``api`` takes (no transfer)."""
    if api == "any" or isinstance(value, _SCALARS) or (api == "numpy" and isinstance(value, np.ndarray)):
        return value
    if api == "numpy":
        conv = _as_numpy
    elif api == "torch":
        conv = lambda v: _as_torch(v, device)  # noqa: E731
    elif api == "numba.cuda":
        conv = lambda v: _as_cuda_array(v, device)  # noqa: E731
    else:
        raise ValueError(f"unknown implementation api {api!r}")
    kind = device.driver
    if type(kind).unwrap is DeviceKind.unwrap:
        return _map(value, conv)
    return _map(value, lambda v: conv(kind.unwrap(v)))


def _as_numpy(v: Any) -> Any:
    if _is_tensor(v):
        if v.device.type != "cpu":
            raise RuntimeError("internal: a device tensor reached a host implementation")
        return v.detach().numpy()
    return v


def _as_torch(v: Any, device: Device) -> Any:
    """``v`` as a torch tensor; a numba device array on ``device`` stays there (its kind's torch device)."""
    if isinstance(v, np.ndarray):
        import torch

        if v.dtype == object:
            return v
        return torch.from_numpy(np.ascontiguousarray(v))
    if _is_cuda_array(v):
        import torch

        if hasattr(v, "__cuda_array_interface__") and not _simulated_cuda():
            return torch.as_tensor(v, device=device.torch_device())
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


def normalize_output(value: Any, device: Device) -> Any:
    """Bring an implementation's output to the canonical form for its location.

    On a GPU the canonical form is a torch tensor on that GPU (numba device arrays
    are wrapped without copying); on the simulated device a CPU torch tensor. A
    device's kind may wrap outputs further (:meth:`~placer.devices.DeviceKind.wrap`).
    """
    kind = device.driver
    if not kind.accelerator:
        return value

    def leaf(v):
        return kind.wrap(_as_torch(v, device) if _is_cuda_array(v) else v)

    return _map(value, leaf)

