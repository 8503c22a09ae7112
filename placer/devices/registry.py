"""The registry of device kinds, and every question about a device name.

May import: placer.errors, placer.devices.kinds. Nothing else: placer.data imports
these functions to validate device kinds and names.

Names are read leniently (surrounding spaces and case are ignored) by
:func:`canonical_name` and :func:`kind_of`; :func:`is_device_name` accepts a name
only as placer writes it. Whether a name's device is *available* (``gpu-sim`` only
under ``PLACER_TEST_DEVICES=1``, ``gpu:1`` only on a machine with two GPUs) is the
inventory's question (:meth:`placer.devices.Inventory.resolve`), not the grammar's.
"""

from __future__ import annotations

import threading

from placer.devices.kinds import DeviceKind
from placer.errors import DeviceError

_KINDS: dict[str, DeviceKind] = {}
_LOCK = threading.Lock()
_generation = 0


def register_kind(kind: DeviceKind) -> DeviceKind:
    """Add a kind of device; its devices are discovered from then on.

    Raises
    ------
    DeviceError
        When the kind has no name or a kind of that name is registered already.
    """
    global _generation
    if not kind.name:
        raise DeviceError(f"{type(kind).__name__} has no name; set its class attribute name")
    with _LOCK:
        if kind.name in _KINDS:
            raise DeviceError(f"a device kind named {kind.name!r} is registered already; "
                              "unregister it first or choose another name")
        _KINDS[kind.name] = kind
        _generation += 1
    return kind


def unregister_kind(name: str) -> None:
    """Remove the kind called ``name``."""
    global _generation
    with _LOCK:
        if name not in _KINDS:
            raise DeviceError(f"no device kind named {name!r} is registered ({', '.join(_KINDS)})")
        del _KINDS[name]
        _generation += 1


def kinds() -> dict[str, DeviceKind]:
    """The registered kinds, by name, in registration order."""
    return dict(_KINDS)


def generation() -> int:
    """A number that changes whenever a kind is registered or unregistered."""
    return _generation


def get_kind(name: str) -> DeviceKind:
    """The registered kind called ``name`` (a :attr:`Device.kind` string)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise DeviceError(f"unknown device kind {name!r}; registered kinds: {', '.join(_KINDS)}") from None


def check_kind(name: str) -> str:
    """``name`` when it is a registered kind; for pydantic validators (raises ValueError)."""
    if name not in _KINDS:
        raise ValueError(f"unknown device kind {name!r}; use one of {', '.join(_KINDS)}")
    return name


def valid_names() -> str:
    """The forms of the device names this process accepts, for messages (``cpu, gpu, gpu:N or gpu-sim``)."""
    forms = [f for k in _KINDS.values() if k.enabled() for f in k.forms]
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"


def _parse(name: str) -> tuple[str, DeviceKind] | None:
    key = name.strip().lower()
    for kind in tuple(_KINDS.values()):
        canon = kind.parse(key)
        if canon is not None:
            return canon, kind
    return None


def canonical_name(spec: str) -> str:
    """The device name ``spec`` means: lower case, aliases resolved (``GPU`` → ``gpu:0``).

    Raises
    ------
    DeviceError
        For a name no registered kind knows, naming the valid ones.
    """
    got = _parse(spec)
    if got is None:
        raise DeviceError(f"unknown device {spec!r}; use {valid_names()}")
    return got[0]


def kind_of(name: str) -> str:
    """The kind of the device called ``name`` (``cpu``, ``gpu``, ``sim``, or a registered kind's own).

    Raises
    ------
    DeviceError
        For a name no registered kind knows.
    """
    got = _parse(name)
    if got is None:
        raise DeviceError(f"unknown device {name!r}; use {valid_names()}")
    return got[1].name


def kind_for(name: str) -> DeviceKind | None:
    """The kind object of the device called ``name``, or None for a name no kind knows."""
    got = _parse(name)
    return None if got is None else got[1]


def is_device_name(name: str) -> bool:
    """Whether ``name`` is a device name as placer writes it (lower case, no spaces; aliases included)."""
    return name == name.strip().lower() and _parse(name) is not None


def is_accelerator(name: str) -> bool:
    """Whether ``name`` names an accelerator (False for the CPU and for unknown names)."""
    kind = kind_for(name)
    return kind is not None and kind.accelerator


def is_real_gpu(name: str) -> bool:
    """Whether ``name`` names a real GPU (never the simulated test device; False for unknown names)."""
    kind = kind_for(name)
    return kind is not None and kind.real_gpu


def same_device(a: str, b: str) -> bool:
    """Whether two names mean the same device (``gpu`` and ``gpu:0`` do); other names must be equal."""
    if a == b:
        return True
    pa, pb = _parse(a), _parse(b)
    return pa is not None and pb is not None and pa[0] == pb[0]


def torch_device_name(spec: object) -> str | None:
    """The device name a ``torch.device`` (or torch's spelling of one, ``cuda:1``) means, or None.

    Each kind is asked (:meth:`~placer.devices.kinds.DeviceKind.torch_name`): ``cuda:1`` is
    ``gpu:1``, ``cpu`` is ``cpu``; a spelling no kind claims (``gpu:0``, placer's own) gives None.
    """
    torch_type, _, index = str(spec).strip().lower().partition(":")
    at = int(index) if index.isdigit() else None
    for kind in tuple(_KINDS.values()):
        name = kind.torch_name(torch_type, at)
        if name is not None:
            return name
    return None


def implementation_class(name: str) -> str:
    """Which of a stage's implementations (``cpu`` or ``gpu``) runs on the device ``name``.

    A name no kind knows gets ``gpu``: everything but the CPU runs the GPU code.
    """
    kind = kind_for(name)
    return "gpu" if kind is None else kind.implementation
