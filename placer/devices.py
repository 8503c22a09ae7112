"""Discovering the devices of this machine and resolving device names.

May import: pydantic, placer.errors; torch and numba only inside functions, so that
importing this module stays cheap.

Device names: ``cpu``; ``gpu:N`` for the N-th CUDA GPU (``gpu`` means ``gpu:0``);
``gpu-sim`` for the simulated test device, which exists only when the environment
variable ``PLACER_TEST_DEVICES=1`` is set. ``gpu-sim`` runs a stage's GPU
implementation on the CPU so that routing, transfers and concurrency can be tested
without a GPU. It is never a GPU: it is never reported as one, and never chosen
unless a placement names it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from typing import Literal

from pydantic import BaseModel, Field

from placer.errors import DeviceError, DeviceUnavailableError

SIM = "gpu-sim"


def test_devices_enabled() -> bool:
    """Whether the simulated test device is enabled (``PLACER_TEST_DEVICES=1``)."""
    return os.environ.get("PLACER_TEST_DEVICES") == "1"


class Device(BaseModel):
    """One device placer can run stages on."""

    name: str
    kind: Literal["cpu", "gpu", "sim"]
    label: str
    index: int | None = None
    workers: int = 1
    memory_bytes: int | None = None
    backends: list[str] = Field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return self.kind == "sim"

    @property
    def is_gpu(self) -> bool:
        """True only for a real GPU."""
        return self.kind == "gpu"

    @property
    def location(self) -> str:
        """Where this device's data lives: ``host`` for the CPU, else the device name."""
        return "host" if self.kind == "cpu" else self.name

    def torch_device(self):
        import torch

        return torch.device("cuda", self.index) if self.kind == "gpu" else torch.device("cpu")


class Inventory(BaseModel):
    """The devices of this machine and the reasons any GPU backend is unavailable."""

    devices: list[Device]
    unavailable: dict[str, str] = Field(default_factory=dict)
    host: dict[str, str | int | float | None] = Field(default_factory=dict)

    def get(self, name: str) -> Device | None:
        return next((d for d in self.devices if d.name == name), None)

    @property
    def gpus(self) -> list[Device]:
        return [d for d in self.devices if d.kind == "gpu"]

    def fingerprint(self) -> str:
        """A stable hash of the hardware and software that timings depend on."""
        parts = [
            str(self.host.get(k)) for k in ("machine", "cpu_model", "cores", "torch", "numba")
        ] + [f"{d.name}:{d.label}:{d.memory_bytes}" for d in self.devices if d.kind != "sim"]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def resolve(self, spec: str, *, stage: str | None = None) -> Device:
        """Turn a device name from a placement (``cpu``, ``gpu``, ``gpu:N``, ``gpu-sim``) into a Device."""
        key = spec.strip().lower()
        if key == "gpu":
            key = "gpu:0"
        who = f"stage {stage!r}: " if stage else ""
        if key == SIM and not test_devices_enabled():
            raise DeviceUnavailableError(
                f"{who}device 'gpu-sim' is a simulated test device; it exists only when "
                "PLACER_TEST_DEVICES=1 is set",
                stage=stage,
            )
        if not (key in ("cpu", SIM) or (key.startswith("gpu:") and key[4:].isdigit())):
            raise DeviceError(
                f"{who}unknown device {spec!r}; use cpu, gpu, gpu:N"
                + (" or gpu-sim" if test_devices_enabled() else ""),
                stage=stage,
            )
        dev = self.get(key)
        if dev is None:
            why = self.unavailable.get("torch.cuda", "no CUDA GPU was found")
            n = len(self.gpus)
            raise DeviceUnavailableError(
                f"{who}no GPU is available for {spec!r} ({why}; this machine has {n} GPU"
                f"{'s' if n != 1 else ''}); place the stage on cpu",
                stage=stage,
            )
        return dev


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_bytes() -> int | None:
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


def numba_cuda_status() -> str | None:
    """None when numba.cuda kernels can run on a real GPU, else the reason they cannot."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
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


@functools.lru_cache(maxsize=1)
def discover() -> Inventory:
    """Find this machine's devices (cached for the process; see :func:`refresh`)."""
    import torch

    cores = os.cpu_count() or 1
    host = {
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cores": cores,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numba": _version("numba"),
        "hostname": platform.node(),
    }
    devices = [
        Device(
            name="cpu",
            kind="cpu",
            label=f"CPU: {host['cpu_model']} ({cores} cores)",
            workers=cpu_workers(),
            memory_bytes=_mem_bytes(),
            backends=["numpy", "torch", "numba", "dask"],
        )
    ]
    unavailable: dict[str, str] = {}
    if not torch.backends.cuda.is_built():
        unavailable["torch.cuda"] = f"torch {torch.__version__} was built without CUDA"
    elif not torch.cuda.is_available():
        unavailable["torch.cuda"] = "torch found no CUDA driver or GPU"
    gpu_backends = ["torch"]
    n_gpu = torch.cuda.device_count() if "torch.cuda" not in unavailable else 0
    if n_gpu:
        why = numba_cuda_status()
        if why is None:
            gpu_backends.append("numba.cuda")
        else:
            unavailable["numba.cuda"] = why
    else:
        unavailable["numba.cuda"] = "no CUDA GPU"
    for i in range(n_gpu):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            Device(
                name=f"gpu:{i}",
                kind="gpu",
                index=i,
                label=props.name,
                memory_bytes=int(props.total_memory),
                backends=list(gpu_backends),
            )
        )
    if test_devices_enabled():
        devices.append(
            Device(
                name=SIM,
                kind="sim",
                label="simulated test device (runs GPU implementations on the CPU; not a GPU)",
                memory_bytes=_mem_bytes(),
                backends=["torch", "numba.cuda (simulator)"],
            )
        )
    return Inventory(devices=devices, unavailable=unavailable, host=host)


def refresh() -> Inventory:
    """Forget the cached inventory and discover again."""
    discover.cache_clear()
    return discover()


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None
