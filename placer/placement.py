"""Parsing placement specifications and resolving them against a pipeline.

May import: placer.pipeline, placer.devices, placer.errors.

A placement maps every stage to a device name. The text form used by the CLI is
``all=cpu``, ``all=gpu``, or comma-separated ``stage=device`` items, applied left to
right (``all=cpu,train=gpu``). Device names are read by :mod:`placer.devices`:
``cpu``, ``gpu`` (the first GPU), ``gpu:N``, ``gpu-sim`` under
``PLACER_TEST_DEVICES=1``, and those of any registered kind. A stage's ``pin`` wins
over an ``all=`` item; an explicit ``stage=device`` item that contradicts a pin is
an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from placer.devices import Device, Inventory, same_device
from placer.errors import DeviceUnavailableError, PlacementError
from placer.pipeline import Pipeline


def parse_spec(spec: str, stages: list[str]) -> dict[str, str]:
    """Parse a text placement into ``{stage: device}`` (names not yet resolved)."""
    out: dict[str, str] = {}
    explicit: set[str] = set()
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise PlacementError("empty placement; use all=cpu, all=gpu or stage=device,...")
    for item in items:
        if "=" not in item:
            raise PlacementError(
                f"placement item {item!r} is not stage=device; use all=cpu, all=gpu or stage=device,..."
            )
        key, dev = (s.strip() for s in item.split("=", 1))
        if not dev:
            raise PlacementError(f"placement item {item!r} names no device")
        if key == "all":
            for s in stages:
                out[s] = dev
        elif key in stages:
            if key in explicit and out[key] != dev:
                raise PlacementError(
                    f"placement names stage {key!r} twice ({out[key]} and {dev}); give each stage one device",
                    stage=key,
                )
            out[key] = dev
            explicit.add(key)
        else:
            raise PlacementError(
                f"placement names stage {key!r}, which the pipeline does not have "
                f"(stages: {', '.join(stages)})",
                stage=key,
            )
    out["__explicit__"] = ",".join(sorted(explicit))  # consumed by resolve()
    return out


def resolve(
    pipeline: Pipeline, placement: Any, inventory: Inventory
) -> dict[str, Device]:
    """Turn a placement (text, mapping, or an object with ``.placement``) into Devices.

    Stages missing from a mapping default to ``cpu``. Pins are applied; every
    device must exist on this machine and every stage must have an implementation
    for its device.
    """
    names = pipeline.order()
    explicit: set[str]
    if placement is None:
        raw: dict[str, str] = {}
        explicit = set()
    elif isinstance(placement, str):
        raw = parse_spec(placement, names)
        explicit = set(filter(None, raw.pop("__explicit__").split(",")))
    elif isinstance(placement, Mapping):
        raw = {str(k): str(v) for k, v in placement.items()}
        explicit = set(raw)
        for k in raw:
            if k not in pipeline.graph:
                raise PlacementError(
                    f"placement names stage {k!r}, which the pipeline does not have", stage=k
                )
    elif hasattr(placement, "placement"):
        return resolve(pipeline, dict(placement.placement), inventory)
    else:
        raise PlacementError(
            f"a placement must be text like 'all=cpu', a mapping or a Plan, got {type(placement).__name__}"
        )
    stages = pipeline.stages
    names_out: dict[str, str] = {}
    for n in names:
        dev = raw.get(n, "cpu")
        pin = stages[n].pin
        if pin is not None and not same_device(pin.strip().lower(), dev.strip().lower()):
            if n in explicit:
                raise PlacementError(
                    f"stage {n!r} is pinned to {pin} but the placement puts it on {dev}; "
                    f"drop {n}={dev} or the pin",
                    stage=n,
                )
            dev = pin
        names_out[n] = dev
    devices = {n: inventory.resolve(d, stage=n) for n, d in names_out.items()}
    pipeline.check_placement({n: d.name for n, d in devices.items()})
    return devices


def check_pins(pipeline: Pipeline, inventory: Inventory) -> None:
    """Raise when a stage is pinned to a device this machine does not have."""
    for n, st in pipeline.stages.items():
        if st.pin is not None:
            try:
                inventory.resolve(st.pin, stage=n)
            except DeviceUnavailableError as exc:
                raise DeviceUnavailableError(
                    f"stage {n!r} is pinned to {st.pin}, which this machine does not have: {exc}",
                    stage=n,
                ) from None
