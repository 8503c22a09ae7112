"""The CPU: the host that holds the pipeline's data and runs CPU implementations.

May import: placer.devices.{kinds,device,values}; psutil and dask inside functions.
"""

from __future__ import annotations

import copy
import os
import platform
from typing import Any

from placer.devices.device import Device
from placer.devices.kinds import CopyState, DeviceKind
from placer.devices.values import is_cuda_array, is_module, is_tensor


class CpuKind(DeviceKind):
    """``cpu``: the host. Its data lives in host memory (location ``host``)."""

    name = "cpu"
    forms = ("cpu",)
    title = "CPU"
    accelerator = False
    implementation = "cpu"

    def parse(self, key: str) -> str | None:
        return "cpu" if key == "cpu" else None

    def torch_name(self, torch_type: str, index: int | None) -> str | None:
        return "cpu" if torch_type == "cpu" else None

    def copy_in(self, leaf: Any, device: Device, state: CopyState) -> Any:
        """A leaf no other kind holds, leaving a device whose memory is host memory: a real copy."""
        if is_tensor(leaf):
            return leaf.clone() if leaf.device.type == "cpu" else leaf.detach().to("cpu")
        if is_cuda_array(leaf):
            return leaf.copy_to_host()
        if is_module(leaf):
            return copy.deepcopy(leaf).to("cpu")
        return leaf

    def discover(self, host: dict[str, Any]) -> tuple[list[Device], dict[str, str]]:
        dev = Device(name="cpu", kind="cpu", label=f"CPU: {host['cpu_model']} ({host['cores']} cores)",
                     workers=cpu_workers(), memory_bytes=host_memory_bytes(),
                     backends=["numpy", "torch", "numba", "dask"])
        return [dev], {}


def cpu_model() -> str:
    """The CPU's model name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_memory_bytes() -> int | None:
    """The host's memory, in bytes (None when it cannot be read)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil is a dask dependency, but stay safe
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None


def cpu_workers() -> int:
    """Worker threads for CPU stages: dask's ``num_workers`` setting, else the core count."""
    n = None
    try:
        import dask

        n = dask.config.get("num_workers", None)
    except Exception:
        n = None
    return int(n or os.cpu_count() or 1)
