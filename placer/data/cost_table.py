"""The cost table: what the optimizer knows about a pipeline, as plain data.

May import: networkx, pydantic, placer.errors, placer.files, placer.data.measures (the
copy curve), placer.devices (its name functions, to read device names and check kinds). Never torch, dask or numba.

A cost table lists the devices, the host<->device link, optionally the network
between the machines (workers) the devices are on, and for every stage its
producers, its bytes, and its predicted seconds on each device that can run it.
It is what a cost model produces for one input size, and what a person writes by
hand to plan a pipeline for a machine they do not have (see ``docs/costs.md``).

Examples
--------
>>> t = CostTable.model_validate({
...     "devices": {"cpu": {"kind": "cpu", "workers": 2},
...                 "gpu": {"kind": "gpu", "memory_bytes": 8e10}},
...     "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10},
...              "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10}},
...     "stages": [{"name": "load", "output_bytes": 6.4e8, "seconds": {"cpu": 0.1}},
...                {"name": "clean", "kind": "cleaning", "inputs": ["load"],
...                 "output_bytes": 6.4e8, "seconds": {"cpu": 0.4, "gpu": 0.002}}]})
>>> t.allowed("clean")
['cpu', 'gpu']
>>> round(t.link.h2d.seconds(6.4e8), 6)
0.02561
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import networkx as nx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    BeforeValidator,
    PrivateAttr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from placer.devices import check_kind, get_kind, is_device_name, kind_of, same_device, valid_names
from placer.data.measures import curve_seconds
from placer.errors import CostTableError, PlacerError
from placer.files import parse_json, read_json, write_text_atomic


def _a_number(v: Any) -> Any:
    """Refuse what pydantic would coerce to a number but a person did not mean as one."""
    if isinstance(v, bool):
        raise ValueError(f"{str(v).lower()} is a boolean, not a number; give a number")
    if isinstance(v, str):
        raise ValueError(f"{v!r} is a string, not a number; give the number without quotes")
    return v


#: a finite number (never a boolean or a string)
Number = Annotated[float, BeforeValidator(_a_number), Field(allow_inf_nan=False)]
#: bytes: a finite number >= 0
Bytes = Annotated[float, BeforeValidator(_a_number), Field(ge=0, allow_inf_nan=False)]
#: a whole number (never a boolean)
Count = Annotated[int, BeforeValidator(_a_number)]


class DeviceSpec(BaseModel):
    """One device: the CPU (``workers`` concurrent stages) or an accelerator (one at a time).

    ``kind`` is a registered device kind (:func:`placer.devices.kinds`): ``cpu``,
    ``gpu``, or ``sim``, the simulated test device, which schedules like a GPU but
    is not one. ``price_per_hour`` is used by the ``cost`` objective (for the CPU, the price of
    all its workers together).
    """

    model_config = ConfigDict(extra="forbid")

    kind: str
    workers: Count = Field(1, ge=1)
    memory_bytes: Number | None = Field(None, gt=0)
    price_per_hour: Number = Field(0.0, ge=0)
    label: str = ""

    @field_validator("kind")
    @classmethod
    def _registered(cls, v: str) -> str:
        return check_kind(v)


class Direction(BaseModel):
    """One direction of a link (host<->device, or the network): ``latency_s + bytes / bandwidth_Bps``."""

    model_config = ConfigDict(extra="forbid")

    latency_s: Number = Field(ge=0)
    bandwidth_Bps: Number = Field(gt=0)

    def seconds(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` in this direction."""
        return self.latency_s + nbytes / self.bandwidth_Bps


class Curve(Direction):
    """One direction of the host<->device link: the line of :class:`Direction`, or, with
    ``points`` (``[bytes, seconds]`` pairs, as a cost model writes them from the way the
    executor copies), the copy curve through them (:func:`placer.data.measures.curve_seconds`:
    log-log between points)."""

    points: list[tuple[float, float]] = Field(default_factory=list)

    @field_validator("points")
    @classmethod
    def _positive(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        bad = [p for p in v if not (p[0] > 0 and p[1] > 0 and math.isfinite(p[0]) and math.isfinite(p[1]))]
        if bad:
            raise ValueError(f"points: {bad[0]} is not a positive [bytes, seconds] pair; fix or drop it")
        return sorted(v)

    def seconds(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` in this direction."""
        if not self.points:
            return self.latency_s + nbytes / self.bandwidth_Bps
        return curve_seconds(self.points, nbytes, self.latency_s, self.bandwidth_Bps)


class Link(BaseModel):
    """The link between the host and every accelerator (h2d: to the device)."""

    model_config = ConfigDict(extra="forbid")

    h2d: Curve
    d2h: Curve


class StageCost(BaseModel):
    """One stage's costs. A device missing from ``seconds`` cannot run the stage."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    kind: Literal["cleaning", "preprocessing", "training", "inference", "other"] = "other"
    inputs: list[str] = Field(default_factory=list)
    input_bytes: Bytes = 0.0
    output_bytes: Bytes = 0.0
    seconds: dict[str, Annotated[float, BeforeValidator(_a_number)] | None] = Field(default_factory=dict)
    peak_bytes: dict[str, Bytes] = Field(default_factory=dict)
    pin: str | None = None
    #: each step depends on the previous one (sequential work); used in explanations
    loop_carried: StrictBool = False
    #: per device, the relative uncertainty of ``seconds`` beyond the table's ``noise`` (fit forms
    #: that match the measurements as well disagree at this size): a placement whose objective
    #: is within it of the plan's is a tie
    uncertainty: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    #: device → the lower precision ``seconds`` is for there (absent: fp32; see placer.precision)
    precision: dict[str, str] = Field(default_factory=dict)
    #: device → precision → predicted seconds (fp32 and each allowed lower precision): the what-if
    precision_s: dict[str, dict[str, float]] = Field(default_factory=dict)


class CostTable(BaseModel):
    """Devices, link and per-stage costs at one input size (``size``, in ``size_unit``).

    ``network``, when given, says that every device is on its own machine (a dask
    worker): a copy of a stage's output between two different devices also crosses
    the network, once per (data, destination device), at ``latency_s + bytes /
    bandwidth_Bps`` on top of the host<->device copies (``docs/schedule.md``).
    Without it, all devices share one host, as on a single machine.
    """

    model_config = ConfigDict(extra="forbid")

    devices: dict[str, DeviceSpec]
    link: Link | None = None
    network: Direction | None = None
    stages: list[StageCost]
    size: Number | None = Field(None, gt=0)
    size_unit: str = "rows"
    #: relative noise of the times (measurement spread): placements predicted closer than
    #: this are ties (default: :data:`placer.optimize.explain.TIE_NOISE`)
    noise: float | None = Field(None, ge=0, le=1)

    _by_name: dict[str, StageCost] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> CostTable:
        self._by_name = {st.name: st for st in self.stages}
        _check_devices(self)
        _check_graph(self)
        for st in self.stages:
            _check_stage(self, st)
        return self

    # -- reading and writing ---------------------------------------------------------
    @classmethod
    def from_json(cls, text: str, *, source: str = "cost table") -> CostTable:
        """Parse JSON text; raise :class:`CostTableError` with one readable line per problem."""
        try:
            data = parse_json(text, source, "fix the syntax")
        except PlacerError as exc:
            raise CostTableError(str(exc)) from None
        return cls.from_data(data, source=source)

    @classmethod
    def from_data(cls, data: Any, *, source: str = "cost table") -> CostTable:
        """Validate parsed JSON; raise :class:`CostTableError` naming the stage and field, and the fix."""
        if not isinstance(data, dict):
            raise CostTableError(f"{source}: must be a JSON object with devices and stages, "
                                 f"got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise CostTableError(f"{source}: {describe(exc, data)}") from None
        except RecursionError:
            raise CostTableError(f"{source}: nested too deeply to read; fix or regenerate it") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostTable:
        """Read a cost table file (JSON)."""
        p = Path(path)
        try:
            data = read_json(p, f"cost table {str(p)!r}" if not p.is_file() else str(p), "fix the syntax")
        except PlacerError as exc:
            raise CostTableError(str(exc)) from None
        return cls.from_data(data, source=str(p))

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON, atomically (a reader never sees half a file)."""
        write_text_atomic(path, self.model_dump_json(indent=2, exclude_defaults=True))

    # -- views ---------------------------------------------------------------------
    @property
    def cpu(self) -> str:
        """The name of the CPU device."""
        return next(n for n, d in self.devices.items() if d.kind == "cpu")

    @property
    def accelerators(self) -> list[str]:
        """Accelerator names (GPUs and simulated test devices), in table order."""
        return [n for n, d in self.devices.items() if d.kind != "cpu"]

    def stage(self, name: str) -> StageCost:
        """The stage called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no stage named {name!r}") from None

    def seconds(self, stage: str | StageCost, device: str) -> float | None:
        """Predicted seconds of ``stage`` on ``device``; None when it cannot run there."""
        st = self.stage(stage) if isinstance(stage, str) else stage
        return _lookup(st.seconds, device, self.devices[device].kind)

    def memory_need(self, stage: str | StageCost, device: str) -> float:
        """Bytes the stage needs on ``device``: its peak (default: its output) plus its inputs."""
        st = self.stage(stage) if isinstance(stage, str) else stage
        peak = _lookup(st.peak_bytes, device, self.devices[device].kind)
        peak = st.output_bytes if peak is None else peak
        by_name = self._by_name
        return peak + st.input_bytes + sum(by_name[i].output_bytes for i in st.inputs)

    def blocked(self, stage: str | StageCost) -> dict[str, str]:
        """Why the stage cannot run on each device it cannot run on (device -> reason)."""
        st = self.stage(stage) if isinstance(stage, str) else stage
        out = {}
        for dev, spec in self.devices.items():
            if self.seconds(st, dev) is None:
                out[dev] = f"no implementation or time for {dev}"
                continue
            need = self.memory_need(st, dev)
            if spec.memory_bytes is not None and need > spec.memory_bytes:
                out[dev] = (
                    f"needs {fmt_bytes(need)} on {dev}, which has {fmt_bytes(spec.memory_bytes)}"
                )
        return out

    def allowed(self, stage: str | StageCost, *, pins: bool = True) -> list[str]:
        """Devices the stage may run on (implementation, memory and, with ``pins``, its pin)."""
        st = self.stage(stage) if isinstance(stage, str) else stage
        if pins and st.pin is not None:
            return [resolve_pin(self, st)]
        bad = self.blocked(st)
        return [d for d in self.devices if d not in bad]


def _lookup(mapping: dict, device: str, kind: str):
    """A per-device value: the device's own key, else an accelerator kind's own name
    when that is a device name too (``"gpu"`` for any GPU)."""
    if device in mapping:
        return mapping[device]
    if kind in mapping and get_kind(kind).accelerator and is_device_name(kind) and kind_of(kind) == kind:
        return mapping[kind]
    return None


def resolve_pin(table: CostTable, st: StageCost) -> str:
    """The device a stage's pin names (``gpu`` also names ``gpu:0``, and the reverse)."""
    pin = st.pin
    if pin in table.devices:
        return pin
    same = next((d for d in table.devices if same_device(d, pin)), None)
    if same is not None:
        return same
    raise ValueError(
        f"stage {st.name!r} is pinned to {pin!r}, which is not among the devices "
        f"({', '.join(table.devices)}); pin it to one of these or add {pin!r} to devices"
    )


def _check_devices(t: CostTable) -> None:
    cpus = [n for n, d in t.devices.items() if d.kind == "cpu"]
    if len(cpus) != 1:
        raise ValueError(
            f"devices: need exactly one device of kind 'cpu', found {len(cpus)}"
            f"{' (' + ', '.join(cpus) + ')' if cpus else ''}; the CPU holds the host's data"
        )
    for name, d in t.devices.items():
        if not name.strip():
            raise ValueError(f"devices: a device name is empty; name it {valid_names()}")
        if get_kind(d.kind).accelerator and d.workers != 1:
            raise ValueError(
                f"devices.{name}: an accelerator runs one stage at a time; remove 'workers'"
            )
    if t.accelerators and t.link is None:
        raise ValueError(
            "link: missing; give h2d and d2h latency_s and bandwidth_Bps for the accelerators"
        )
    if not t.stages:
        raise ValueError("stages: empty; list at least one stage")


def _check_graph(t: CostTable) -> None:
    names: set[str] = set()
    for st in t.stages:
        if st.name in names:
            raise ValueError(f"stage {st.name!r} appears twice in stages; give each a unique name")
        names.add(st.name)
    g = nx.DiGraph()
    g.add_nodes_from(names)
    for st in t.stages:
        for src in st.inputs:
            if src == st.name:
                raise ValueError(f"stage {st.name!r} lists itself in inputs; remove it")
            if src not in names:
                raise ValueError(
                    f"stage {st.name!r} has unknown input {src!r}; add a stage named {src!r} "
                    "or fix the name in its inputs"
                )
            g.add_edge(src, st.name)
        if len(set(st.inputs)) != len(st.inputs):
            raise ValueError(f"stage {st.name!r} lists an input twice; list each producer once")
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return
    path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
    raise ValueError(f"stages form a cycle ({path}); remove one of these inputs")


def _check_stage(t: CostTable, st: StageCost) -> None:
    for dev, sec in st.seconds.items():
        if dev not in t.devices and not is_device_name(dev):
            raise ValueError(
                f"stage {st.name!r}: seconds names unknown device {dev!r}; "
                f"use one of {', '.join(t.devices)}"
            )
        if sec is not None and not (math.isfinite(sec) and sec >= 0):
            raise ValueError(
                f"stage {st.name!r}: seconds[{dev!r}] is {sec}; give a finite time >= 0 "
                "or leave the device out if the stage cannot run there"
            )
    for dev, b in st.peak_bytes.items():
        if not (math.isfinite(b) and b >= 0):
            raise ValueError(f"stage {st.name!r}: peak_bytes[{dev!r}] is {b}; give bytes >= 0")
    if st.pin is not None:
        dev = resolve_pin(t, st)
        why = t.blocked(st).get(dev)
        if why:
            raise ValueError(
                f"stage {st.name!r} is pinned to {dev} but {why}; unpin it or fix its costs"
            )
        return
    if t.allowed(st):
        return
    blocked = t.blocked(st)
    absent = [d for d, s in st.seconds.items() if s is not None and d not in t.devices]
    detail = "; ".join(blocked.values())
    fix = (
        f"add {', '.join(absent)} to devices or give a time for {t.cpu}"
        if absent
        else f"give a time for {t.cpu} or a device with more memory"
    )
    raise ValueError(f"no device can run stage {st.name!r} ({detail}); {fix}")


def describe(exc: ValidationError, data=None) -> str:
    """One line per pydantic error, naming the stage instead of its list index."""
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        if len(loc) >= 2 and loc[0] == "stages" and isinstance(loc[1], int):
            try:
                loc[1] = repr(data["stages"][loc[1]]["name"])
                loc[0] = "stage"
            except (KeyError, IndexError, TypeError):
                pass
        sep = " " if loc and loc[0] == "stage" else "."
        where = sep.join(str(x) for x in loc[:2]) + "".join(f".{x}" for x in loc[2:])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}" if where else msg)
    return "; ".join(lines)


def fmt_bytes(n: float) -> str:
    """``1.3 GB`` style (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
