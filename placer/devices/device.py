"""A device, and the inventory of a machine's devices.

May import: pydantic, placer.errors, placer.devices.{registry,kinds}. A
:class:`Device` is plain data; what it does depends on its kind, which it asks
through the registry.
"""

from __future__ import annotations

import hashlib
from contextlib import AbstractContextManager
from typing import Any

from pydantic import BaseModel, Field, field_validator

from placer.devices.kinds import HOST, DeviceKind, MemoryProbe
from placer.devices.registry import canonical_name, check_kind, get_kind, kind_for
from placer.errors import DeviceError, DeviceUnavailableError


class Device(BaseModel):
    """One device placer can run stages on; ``kind`` is a registered kind's name.

    Attributes
    ----------
    name : str
        What placements call it: ``cpu``, ``gpu:0``, ``gpu-sim``.
    kind : str
        A registered device kind (:func:`placer.devices.register_kind`): ``cpu``, ``gpu``, ``sim``.
    label : str
        A human description (model, cores, memory).
    index : int, optional
        The accelerator's index among its kind.
    workers : int
        Stages it may run at once (CPU: worker threads; accelerators: 1).
    memory_bytes : int, optional
        Its memory, when known.
    backends : list of str
        The APIs it runs (``torch``, ``numba.cuda``, ...).
    """

    name: str
    kind: str
    label: str
    index: int | None = None
    workers: int = 1
    memory_bytes: int | None = None
    backends: list[str] = Field(default_factory=list)

    @field_validator("kind")
    @classmethod
    def _registered(cls, v: str) -> str:
        return check_kind(v)

    @property
    def driver(self) -> DeviceKind:
        """The kind that copies to, synchronises and probes this device."""
        return get_kind(self.kind)

    @property
    def simulated(self) -> bool:
        """True for a device that stands in for hardware in tests (never a GPU)."""
        return self.driver.simulated

    @property
    def is_gpu(self) -> bool:
        """True only for a real GPU."""
        return self.driver.real_gpu

    @property
    def is_accelerator(self) -> bool:
        """True for every device but the CPU that holds the host's data."""
        return self.driver.accelerator

    @property
    def location(self) -> str:
        """Where this device's data lives: ``host`` for the CPU, else the device name."""
        return self.driver.location(self)

    def torch_device(self) -> Any:
        """The ``torch.device`` a stage's implementation is given on this device."""
        return self.driver.torch_device(self)

    def synchronize(self, api: str | None = None) -> None:
        """Wait until the work queued on this device so far has finished."""
        self.driver.synchronize(self, api)

    def memory_probe(self) -> MemoryProbe | None:
        """A probe of this device's own peak memory (None when its memory is the host's)."""
        return self.driver.memory_probe(self)

    def work_stream(self) -> AbstractContextManager[None]:
        """A context in which this thread's work on the device goes to a queue of its own (a CUDA stream)."""
        return self.driver.work_stream(self)


def host_device() -> Device:
    """The device that stands for host memory (:data:`~placer.devices.kinds.HOST`): this machine's CPU,
    labelled ``host``; where a value is copied to when it leaves an accelerator."""
    return Device(name="cpu", kind="cpu", label=HOST)

class Inventory(BaseModel):
    """The devices of this machine and the reasons any GPU backend is unavailable.

    Attributes
    ----------
    devices : list of Device
        The CPU first, then every accelerator found.
    unavailable : dict of str to str
        Backend → why it cannot be used here (no driver, no GPU, ...).
    host : dict
        The machine, CPU model, core count and library versions (part of the fingerprint).
    """

    devices: list[Device]
    unavailable: dict[str, str] = Field(default_factory=dict)
    host: dict[str, str | int | float | None] = Field(default_factory=dict)

    def get(self, name: str) -> Device | None:
        return next((d for d in self.devices if d.name == name), None)

    @property
    def gpus(self) -> list[Device]:
        """The real GPUs (never the simulated test device)."""
        return [d for d in self.devices if d.is_gpu]

    def fingerprint(self) -> str:
        """A stable hash of the hardware and software that timings depend on."""
        parts = [
            str(self.host.get(k)) for k in ("machine", "cpu_model", "cores", "torch", "numba")
        ] + [f"{d.name}:{d.label}:{d.memory_bytes}" for d in self.devices if not d.simulated]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def resolve(self, spec: str, *, stage: str | None = None) -> Device:
        """Turn a device name from a placement (``cpu``, ``gpu``, ``gpu:N``, ...) into a Device.

        Raises
        ------
        DeviceError
            For a name no kind knows.
        DeviceUnavailableError
            For a known name this machine (or process) does not have.
        """
        who = f"stage {stage!r}: " if stage else ""
        try:
            key = canonical_name(spec)
        except DeviceError as exc:
            raise DeviceError(f"{who}{exc}", stage=stage) from None
        kind = kind_for(key)
        if not kind.enabled():
            raise DeviceUnavailableError(f"{who}{kind.disabled_reason(key)}", stage=stage)
        dev = self.get(key)
        if dev is None:
            raise DeviceUnavailableError(f"{who}{kind.missing_reason(spec, self)}", stage=stage)
        return dev
