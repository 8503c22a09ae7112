"""What a kind of device is: :class:`DeviceKind`, the base of every kind placer knows.

May import: nothing of placer but placer.errors; a subclass imports torch or numba
only inside its methods, so that importing a kind stays cheap.

A kind owns everything about its devices that differs from kind to kind: the
grammar of their names (and aliases such as ``gpu`` for ``gpu:0``), whether they
are accelerators and whether they are real GPUs, where their data lives, the torch
device a stage is given (and which of its names torch's spelling means),
synchronising, a queue of its own for a thread's work (a CUDA stream), peak-memory
probing, copying a value in (host → device) and out (device → host), discovering
the devices of this machine, and listing a cluster's devices from what its workers
discovered. Everything else in placer asks the kind through :mod:`placer.devices`.

A new kind is a subclass registered with :func:`placer.devices.register_kind`::

    class Accel(DeviceKind):
        name = "acc"
        forms = ("acc", "acc:N")
        def parse(self, key): ...
        def copy_in(self, leaf, device, state): ...
        def copy_out(self, leaf): ...
        def holds(self, leaf): ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from placer.devices.device import Device, Inventory


#: where host memory lives: the location of every device that is not an accelerator
HOST = "host"

class CopyState:
    """What one copy of a value (all its leaves) needs and learns.

    Attributes
    ----------
    stream : object or None
        The stream to copy on (a kind may ignore it).
    pin : bool
        Whether the copy may stage large leaves through pinned memory (a stream's
        ``pin_memory`` setting; True elsewhere).
    stage : callable
        ``stage(nbytes) -> bool``: whether to stage a leaf of ``nbytes`` through pinned
        memory. The executor passes the copy-kind rule
        (:func:`placer.data.measures.copy_mode`); without one, nothing is staged.
    pinned : bool
        Set by a kind that staged a leaf through pinned (page-locked) memory.
    """

    def __init__(self, stream: Any = None, pin: bool = True, stage: Callable[[int], bool] | None = None):
        self.stream = stream
        self.pin = pin
        self.stage = stage if stage is not None and pin else (lambda nbytes: False)
        self.pinned = False


class MemoryProbe(Protocol):
    """Peak device memory of a block of work: :meth:`start` before it, :meth:`peak_bytes` after."""

    def start(self) -> None: ...

    def peak_bytes(self) -> float: ...


class DeviceKind:
    """One kind of device. Subclasses set the class attributes and override what differs.

    Attributes
    ----------
    name : str
        The kind as :attr:`placer.devices.Device.kind` says it (``cpu``, ``gpu``, ``sim``).
    forms : tuple of str
        How its device names are written, for messages (``gpu``, ``gpu:N``).
    accelerator : bool
        Whether its devices are accelerators (everything but the CPU that holds the
        host's data); an accelerator runs one stage at a time.
    real_gpu : bool
        Whether its devices are real GPUs (a simulated device never is).
    simulated : bool
        Whether its devices stand in for hardware in tests; they never count as GPUs
        and are left out of the machine's fingerprint.
    implementation : {"cpu", "gpu"}
        Which of a stage's implementations runs on its devices.
    title : str
        How messages call a device of this kind (``CPU``, ``GPU``, ``simulated test device``).
    """

    name: ClassVar[str] = ""
    forms: ClassVar[tuple[str, ...]] = ()
    title: ClassVar[str] = "accelerator"
    accelerator: ClassVar[bool] = True
    real_gpu: ClassVar[bool] = False
    simulated: ClassVar[bool] = False
    implementation: ClassVar[str] = "gpu"

    # -- names ---------------------------------------------------------------------------
    def parse(self, key: str) -> str | None:
        """The canonical name ``key`` (stripped, lower case) means, or None if not this kind's."""
        return None

    def enabled(self) -> bool:
        """Whether devices of this kind may exist in this process."""
        return True

    def disabled_reason(self, name: str) -> str:
        """Why ``name`` cannot be used while the kind is not :meth:`enabled`."""
        return f"device {name!r} is not enabled in this process"

    def missing_reason(self, spec: str, inventory: Inventory) -> str:
        """Why ``spec`` names no device of ``inventory`` (the kind is enabled)."""
        have = [d.name for d in inventory.devices if d.kind == self.name]
        return (f"device {spec!r} is not on this machine (its {self.name} devices: "
                f"{', '.join(have) or 'none'}); place the stage on cpu")

    def start(self, device: Device) -> None:
        """Make the device ready for timed work (a driver context, library handles).

        Profiling calls it before its budget's clock starts, so that a device's one-off
        start (a CUDA context and cuBLAS take seconds on a fresh process) is not spent
        from the budget and does not stop the sizes from growing. Nothing by default.
        """

    # -- where data lives and how work is waited for ----------------------------------------
    def location(self, device: Device) -> str:
        """Where the device's data lives: ``host`` for host memory, else the device's name."""
        return device.name if self.accelerator else HOST

    def torch_device(self, device: Device) -> Any:
        """The ``torch.device`` a stage's implementation is given."""
        import torch

        return torch.device("cpu")

    def torch_name(self, torch_type: str, index: int | None) -> str | None:
        """The name of this kind's device that torch calls ``torch_type[:index]`` (``cuda:1``), or None."""
        return None

    def synchronize(self, device: Device, api: str | None = None) -> None:
        """Wait until the device has finished the work queued so far (``api``: the code's)."""

    @contextlib.contextmanager
    def work_stream(self, device: Device) -> Iterator[None]:
        """Inside it, the calling thread's work on ``device`` goes to a queue of its own.

        A stream's nodes each run in threads of their own; on a device with queues
        (CUDA streams) each node's thread gets one, so that the copy of the next
        batch overlaps the compute of this one. Leaving waits for the queue's work.
        The default (the CPU, the simulated device) runs work as it is called.
        """
        yield

    def memory_probe(self, device: Device) -> MemoryProbe | None:
        """A probe of the device's own peak memory, or None when it has none apart from the host's."""
        return None

    # -- copies ----------------------------------------------------------------------------
    def holds(self, leaf: Any) -> bool:
        """Whether ``leaf`` lives in this kind's memory, so that only :meth:`copy_out` can read it."""
        return False

    def copy_in(self, leaf: Any, device: Device, state: CopyState) -> Any:
        """``leaf`` (in host memory, or already this kind's) copied into ``device``'s memory.

        Returning ``leaf`` itself means nothing was copied (it counts zero bytes).
        """
        return leaf

    def finish_copy_in(self, device: Device, state: CopyState) -> None:
        """Called once after a value's leaves were copied in (e.g. wait for the copy stream)."""

    def copy_out(self, leaf: Any) -> Any:
        """A leaf this kind :meth:`holds`, copied into host memory."""
        return leaf

    def unwrap(self, leaf: Any) -> Any:
        """A leaf in this kind's memory as an implementation takes it (no copy)."""
        return leaf

    def wrap(self, leaf: Any) -> Any:
        """An implementation's output leaf as this kind keeps it (no copy)."""
        return leaf

    # -- profiling and discovery --------------------------------------------------------
    def extra_copies(self, device: Device, host: Any, on_device: Any) -> list[tuple[str, str, Callable[[], Any]]]:
        """Further ways of copying to measure, besides the executor's own: ``(direction, mode, call)``.

        ``host`` is a float32 numpy array and ``on_device`` its copy on the device.
        """
        return []

    def discover(self, host: dict[str, Any]) -> tuple[list[Device], dict[str, str]]:
        """This machine's devices of this kind, and why a backend is unavailable (backend → reason)."""
        return [], {}

    def cluster_devices(self, found: list[tuple[str, list[Device]]]) -> list[Device]:
        """A dask cluster's devices of this kind, from what its accelerator workers discovered.

        ``found`` holds, per worker that declares the accelerator resource and has
        devices of this kind, its address and those devices (as the worker names
        them). A task placed on one of the returned names runs on a worker that
        has a device of that name. The default lists each name once, standing for
        that device on every worker that has it.
        """
        where: dict[str, list[str]] = {}
        first: dict[str, Device] = {}
        for address, devices in found:
            for d in devices:
                first.setdefault(d.name, d)
                where.setdefault(d.name, []).append(address)
        return [d.model_copy(update={"label": f"{d.label} on {', '.join(where[name])}"})
                for name, d in first.items()]

    def __repr__(self) -> str:
        return f"<device kind {self.name!r}: {', '.join(self.forms)}>"
