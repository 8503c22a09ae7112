"""Devices: the registry of device kinds, device names, and this machine's devices.

May import: pydantic, placer.errors, placer.devices.*; torch and numba only inside
functions, so that importing this package stays cheap (placer.data imports it to
validate device kinds).

Device names: ``cpu``; ``gpu:N`` for the N-th CUDA GPU (``gpu`` means ``gpu:0``);
``gpu-sim`` for the simulated test device, which exists only when the environment
variable ``PLACER_TEST_DEVICES=1`` is set. ``gpu-sim`` runs a stage's GPU
implementation on the CPU so that routing, transfers and concurrency can be tested
without a GPU. It is never reported as a GPU, but while enabled it is an
accelerator like any other: it is profiled, the planner may choose it, and runs and
reports name it as the simulated test device it is.

Each name belongs to a *kind* (:class:`~placer.devices.kinds.DeviceKind`): ``cpu``
(:mod:`~placer.devices.cpu`), ``gpu`` (:mod:`~placer.devices.cuda`) and ``sim``
(:mod:`~placer.devices.sim`) are built in; :func:`register_kind` adds another, whose
devices are then discovered, placed, profiled, planned for and run on like these.

Examples
--------
>>> canonical_name(" GPU ")
'gpu:0'
>>> kind_of("gpu:1"), kind_of("cpu"), kind_of("gpu-sim")
('gpu', 'cpu', 'sim')
>>> is_accelerator("gpu-sim"), is_real_gpu("gpu-sim"), same_device("gpu", "gpu:0")
(True, False, True)
>>> canonical_name("tpu")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
placer.errors.DeviceError: unknown device 'tpu'; use cpu, gpu...
"""

from __future__ import annotations

from placer.devices.kinds import HOST, CopyState, DeviceKind, MemoryProbe
from placer.devices.registry import (
    canonical_name,
    check_kind,
    get_kind,
    implementation_class,
    is_accelerator,
    is_device_name,
    is_real_gpu,
    kind_for,
    kind_of,
    kinds,
    register_kind,
    same_device,
    torch_device_name,
    unregister_kind,
    valid_names,
)
from placer.devices.device import Device, Inventory, host_device  # noqa: E402 - after the registry it validates against
from placer.devices.cpu import CpuKind, cpu_workers  # noqa: E402
from placer.devices.cuda import CudaKind, numba_cuda_status  # noqa: E402
from placer.devices.sim import SIM, SimKind, test_devices_enabled  # noqa: E402
from placer.devices.discovery import discover, refresh  # noqa: E402

for _kind in (CpuKind(), CudaKind(), SimKind()):
    register_kind(_kind)
del _kind

__all__ = [
    "HOST",
    "SIM",
    "CopyState",
    "CpuKind",
    "CudaKind",
    "Device",
    "DeviceKind",
    "Inventory",
    "MemoryProbe",
    "SimKind",
    "canonical_name",
    "check_kind",
    "cpu_workers",
    "discover",
    "get_kind",
    "host_device",
    "implementation_class",
    "is_accelerator",
    "is_device_name",
    "is_real_gpu",
    "kind_for",
    "kind_of",
    "kinds",
    "numba_cuda_status",
    "refresh",
    "register_kind",
    "same_device",
    "test_devices_enabled",
    "torch_device_name",
    "unregister_kind",
    "valid_names",
]
