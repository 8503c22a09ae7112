"""``gpu-sim``: the simulated test device, only under ``PLACER_TEST_DEVICES=1``.

May import: placer.devices.{kinds,device,cpu}; numpy and torch only inside functions.

It runs a stage's GPU implementation on the CPU, so that routing, transfers and
concurrency can be tested without a GPU. Its data lives in host memory but at a
location of its own, so moving data there or back is a real copy. It is never
reported as a GPU (its label says it is a simulated test device, not a GPU), but while
it is enabled it is an accelerator like any other: it is profiled, the planner may
choose it (its measured times are the CPU's, plus real copies), and runs and reports
name it as what it is.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from placer.devices.cpu import host_memory_bytes
from placer.devices.device import Device
from placer.devices.kinds import CopyState, DeviceKind
from placer.devices.values import is_module, is_tensor

SIM = "gpu-sim"


def test_devices_enabled() -> bool:
    """Whether the simulated test device is enabled (``PLACER_TEST_DEVICES=1``)."""
    return os.environ.get("PLACER_TEST_DEVICES") == "1"


class SimKind(DeviceKind):
    """``gpu-sim``: GPU implementations on the CPU, data as CPU torch tensors."""

    name = "sim"
    forms = (SIM,)
    title = "simulated test device"
    simulated = True

    def parse(self, key: str) -> str | None:
        return SIM if key == SIM else None

    def enabled(self) -> bool:
        return test_devices_enabled()

    def disabled_reason(self, name: str) -> str:
        return (f"device {SIM!r} is a simulated test device; it exists only when "
                "PLACER_TEST_DEVICES=1 is set")

    def copy_in(self, leaf: Any, device: Device, state: CopyState) -> Any:
        import numpy as np

        if isinstance(leaf, np.ndarray):
            import torch

            return torch.from_numpy(leaf.copy())
        if is_tensor(leaf):
            return leaf.detach().clone()
        if is_module(leaf):
            return copy.deepcopy(leaf)
        return leaf

    def cluster_devices(self, found: list[tuple[str, list[Device]]]) -> list[Device]:
        """One ``gpu-sim`` for the cluster: any GPU worker with the simulated device runs its tasks."""
        n = len(found)
        return [Device(name=SIM, kind=self.name, memory_bytes=None, backends=["torch", "numba.cuda (simulator)"],
                       label=f"simulated test device on {n} GPU worker{'s' if n != 1 else ''} "
                             "(runs GPU implementations on the CPU; not a GPU)")]

    def discover(self, host: dict[str, Any]) -> tuple[list[Device], dict[str, str]]:
        if not self.enabled():
            return [], {}
        return [Device(name=SIM, kind="sim", memory_bytes=host_memory_bytes(),
                       label="simulated test device (runs GPU implementations on the CPU; not a GPU)",
                       backends=["torch", "numba.cuda (simulator)"])], {}
