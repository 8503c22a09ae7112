"""CUDA GPUs: ``gpu:N`` (``gpu`` means ``gpu:0``), through torch and numba.cuda.

May import: placer.devices.{kinds,device,values}; numpy, torch and numba only inside
functions.

Host→GPU copies are staged through pinned (page-locked) memory when the copy's
rule says so (:attr:`CopyState.stage <placer.devices.kinds.CopyState>`, which the
executor sets from :func:`placer.data.measures.copy_mode`: at least
:data:`PIN_THRESHOLD` bytes); the reference measurements show pinned copies up to
7× faster than pageable ones.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from placer.devices.device import Device
from placer.devices.kinds import CopyState, DeviceKind
from placer.devices.values import is_cuda_array, is_module, is_tensor, numba_cuda_simulated

if TYPE_CHECKING:
    from placer.devices.device import Inventory

#: host→device copies of at least this many bytes go through pinned memory (the value of
#: placer.data.measures.PIN_THRESHOLD; the kind measures fresh copies below it)
PIN_THRESHOLD = 1 << 20

_NAME = re.compile(r"gpu(?::(\d+))?")


class CudaKind(DeviceKind):
    """``gpu:N``: the N-th CUDA GPU torch sees; its data lives in its own memory."""

    name = "gpu"
    forms = ("gpu", "gpu:N")
    title = "GPU"
    real_gpu = True

    def parse(self, key: str) -> str | None:
        m = _NAME.fullmatch(key)
        if m is None:
            return None
        return key if m.group(1) is not None else "gpu:0"

    def missing_reason(self, spec: str, inventory: Inventory) -> str:
        why = inventory.unavailable.get("torch.cuda", "no CUDA GPU was found")
        n = len(inventory.gpus)
        return (f"no GPU is available for {spec!r} ({why}; this machine has {n} GPU"
                f"{'s' if n != 1 else ''}); place the stage on cpu")

    def torch_device(self, device: Device) -> Any:
        import torch

        return torch.device("cuda", device.index)

    def torch_name(self, torch_type: str, index: int | None) -> str | None:
        return f"gpu:{index or 0}" if torch_type == "cuda" else None

    def start(self, device: Device) -> None:
        """The CUDA context, cuBLAS's handle and the caching allocator, by one small product."""
        import torch

        a = torch.ones(64, 64, device=self.torch_device(device))
        (a @ a).sum().item()
        torch.cuda.synchronize(device.index)

    def synchronize(self, device: Device, api: str | None = None) -> None:
        import torch

        torch.cuda.synchronize(device.index)
        if api == "numba.cuda":
            from numba import cuda

            cuda.synchronize()

    @contextlib.contextmanager
    def work_stream(self, device: Device) -> Iterator[None]:
        import torch

        stream = torch.cuda.Stream(device=device.index)
        with torch.cuda.stream(stream):
            yield
        stream.synchronize()

    def memory_probe(self, device: Device) -> _CudaPeak:
        return _CudaPeak(device.index)

    # -- copies ----------------------------------------------------------------------------
    def holds(self, leaf: Any) -> bool:
        if is_tensor(leaf):
            return leaf.device.type == "cuda"
        if is_module(leaf):
            p = next(leaf.parameters(), None)
            return p is not None and p.device.type == "cuda"
        return is_cuda_array(leaf)

    def copy_in(self, leaf: Any, device: Device, state: CopyState) -> Any:
        import numpy as np
        import torch

        dev = device.torch_device()
        if isinstance(leaf, np.ndarray):
            leaf = torch.from_numpy(np.ascontiguousarray(leaf))
        if is_cuda_array(leaf):
            return torch.as_tensor(leaf, device=dev)
        if is_tensor(leaf):
            if leaf.device == dev:
                return leaf
            if leaf.device.type == "cpu" and state.stage(leaf.nelement() * leaf.element_size()):
                state.pinned = True
                with torch.cuda.stream(state.stream) if state.stream is not None else contextlib.nullcontext():
                    return leaf.pin_memory().to(dev, non_blocking=True)
            return leaf.to(dev)
        if is_module(leaf):
            return copy.deepcopy(leaf).to(dev)
        return leaf

    def finish_copy_in(self, device: Device, state: CopyState) -> None:
        import torch

        (state.stream or torch.cuda.current_stream(device.index)).synchronize()

    def copy_out(self, leaf: Any) -> Any:
        if is_tensor(leaf):
            return leaf.detach().to("cpu")
        if is_module(leaf):
            return copy.deepcopy(leaf).to("cpu")
        return leaf.copy_to_host()

    # -- profiling and discovery --------------------------------------------------------
    def extra_copies(self, device: Device, host: Any, on_device: Any) -> list[tuple[str, str, Callable[[], Any]]]:
        """Pinned and pageable copies both ways, and (below the pinning threshold) fresh ones."""
        import torch

        src = torch.from_numpy(host)
        pinned = src.pin_memory()
        dst = torch.empty_like(on_device)
        out = [("h2d", "pinned", lambda: dst.copy_(pinned, non_blocking=True)),
               ("h2d", "pageable", lambda: dst.copy_(src))]
        if host.nbytes < PIN_THRESHOLD:
            out.append(("h2d", "fresh", lambda: src.to(device.torch_device())))
        out += [("d2h", "pinned", lambda: pinned.copy_(on_device, non_blocking=True)),
                ("d2h", "pageable", lambda: src.copy_(on_device))]
        return out

    def discover(self, host: dict[str, Any]) -> tuple[list[Device], dict[str, str]]:
        import torch

        unavailable: dict[str, str] = {}
        if not torch.backends.cuda.is_built():
            unavailable["torch.cuda"] = f"torch {torch.__version__} was built without CUDA"
        elif not torch.cuda.is_available():
            unavailable["torch.cuda"] = "torch found no CUDA driver or GPU"
        backends = ["torch"]
        n_gpu = torch.cuda.device_count() if "torch.cuda" not in unavailable else 0
        if n_gpu:
            why = numba_cuda_status()
            if why is None:
                backends.append("numba.cuda")
            else:
                unavailable["numba.cuda"] = why
        else:
            unavailable["numba.cuda"] = "no CUDA GPU"
        devices = []
        for i in range(n_gpu):
            props = torch.cuda.get_device_properties(i)
            devices.append(Device(name=f"gpu:{i}", kind="gpu", index=i, label=props.name,
                                  memory_bytes=int(props.total_memory), backends=list(backends)))
        return devices, unavailable

    def cluster_devices(self, found: list[tuple[str, list[Device]]]) -> list[Device]:
        """``gpu:N``: the first GPU of the N-th GPU worker (each GPU worker runs one GPU's tasks)."""
        return [Device(name=f"gpu:{i}", kind=self.name, index=i, label=f"{devices[0].label} on {address}",
                       memory_bytes=devices[0].memory_bytes or None, backends=["torch"])
                for i, (address, devices) in enumerate(found)]


class _CudaPeak:
    """Peak memory torch allocated on one GPU during a block, above what it held before."""

    def __init__(self, index: int | None):
        self.index = index
        self._base = 0

    def start(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)
        self._base = torch.cuda.memory_allocated(self.index)

    def peak_bytes(self) -> float:
        import torch

        return float(torch.cuda.max_memory_allocated(self.index) - self._base)


def numba_cuda_status() -> str | None:
    """None when numba.cuda kernels can run on a real GPU, else the reason they cannot."""
    if numba_cuda_simulated():
        return "NUMBA_ENABLE_CUDASIM=1: numba.cuda runs in its simulator, not on a GPU"
    try:
        from numba import cuda
    except Exception as exc:  # e.g. numba-cuda against a too-new numpy
        return f"numba.cuda failed to import: {type(exc).__name__}: {exc}"
    try:
        if not cuda.is_available():
            return "numba.cuda found no CUDA driver or GPU"
    except Exception as exc:
        return f"numba.cuda failed: {type(exc).__name__}: {exc}"
    return None
