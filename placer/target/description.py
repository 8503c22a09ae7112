"""A target: the whole machine you plan for (host CPU, each GPU, their link), as plain data.

May import: json, pathlib, importlib.resources, pydantic, placer.errors, placer.files, placer.costmodel.roofline
(the GPU description it holds). Never torch: reading a target must stay cheap.

A :class:`TargetDescription` is what ``--target`` names: the shipped ``h200`` (an
NVIDIA H200 with its 16-core Xeon host, from reference measurements) or a JSON file
``placer describe`` wrote on a real machine. Its :class:`CpuDescription` gives the
host CPU's model, cores, per-op dispatch cost, thread scaling and measured op rows;
each GPU is a :class:`~placer.costmodel.roofline.DeviceDescription`, whose
``transfer`` is its host link. The format is documented in ``docs/targets.md``.

Examples
--------
>>> t = load_target("h200")
>>> t.cpu.cores, t.gpus[0].name
(16, 'NVIDIA H200')
>>> t.cpu.seconds("mlp_infer", 8) < 1e-3
True
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from placer.costmodel.roofline import DeviceDescription
from placer.errors import PlacerError

SCHEMA = "placer.target/1"


class TargetError(PlacerError):
    """A target description that cannot be read or is invalid (the message names the field)."""


class OpRow(BaseModel):
    """One measured op on a CPU: the seconds of ``op`` at ``size`` (see :mod:`placer.target.ops`).

    ``threads`` is the intra-op threads it was measured with, ``threads_used`` the
    measurement's CPU time over its wall time (1 at one thread; about ``threads`` for
    an op split over every thread), ``ops``
    and ``bytes`` the operations the op issues and the bytes it moves (counted;
    :func:`placer.costmodel.counts.count_work`). They tell what kind of work a row
    is (:class:`placer.target.scale.CpuScale`); left out, the row is taken as one
    core's work of unknown kind.
    """

    model_config = ConfigDict(extra="forbid")

    op: str = Field(min_length=1)
    size: float = Field(gt=0)
    seconds: float = Field(gt=0)
    threads: int | None = Field(None, ge=1)
    threads_used: float | None = Field(None, gt=0)
    ops: int | None = Field(None, ge=1)
    bytes: float | None = Field(None, gt=0)


class CpuDescription(BaseModel):
    """A host CPU.

    Attributes
    ----------
    model : str
        The CPU's name (``Intel(R) Xeon(R) Processor``).
    cores : int
        Logical cores; CPU stages run ``cores`` at a time on it.
    threads : int
        Intra-op threads the op rows were measured with (default: ``cores``).
    dispatch_s : float
        Seconds of one tiny op (the fixed cost of a call into torch).
    python_s : float
        Seconds of a fixed loop of plain Python calls and attribute reads
        (:func:`placer.costmodel.counts.python_s`): how fast the CPU runs the Python
        between torch ops (None where not measured).
    thread_scaling : dict
        Speed-up of a parallel op at ``n`` threads over one (``{"1": 1.0, "16": 9.5}``),
        where measured; empty when unknown.
    ops : list of OpRow
        Measured op rows (the reference ops of :mod:`placer.target.ops`).
    source : str
        Where the numbers come from.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    cores: int = Field(ge=1)
    threads: int | None = Field(None, ge=1)
    dispatch_s: float | None = Field(None, gt=0)
    python_s: float | None = Field(None, gt=0)
    thread_scaling: dict[int, float] = Field(default_factory=dict)
    ops: list[OpRow] = Field(default_factory=list)
    source: str = ""

    def seconds(self, op: str, size: float) -> float | None:
        """The measured seconds of ``op`` at ``size`` (None when not measured)."""
        return next((r.seconds for r in self.ops if r.op == op and r.size == size), None)

    def speedup(self, threads: int | None = None) -> float | None:
        """Measured parallel speed-up at ``threads`` (default: all cores), or None when unknown."""
        n = threads or self.threads or self.cores
        if not self.thread_scaling:
            return None
        if n in self.thread_scaling:
            return self.thread_scaling[n]
        below = [k for k in self.thread_scaling if k <= n]
        return self.thread_scaling[max(below)] if below else None

    def device_entry(self) -> dict:
        """This CPU as the ``cpu`` entry of the optimizer's ``devices`` table."""
        return {"kind": "cpu", "workers": self.cores, "label": f"{self.model} ({self.cores} cores, described)"}


class TargetDescription(BaseModel):
    """The machine to plan for: its host CPU, its GPUs and their links.

    ``cpu`` may be left out (an older GPU-only description): the CPU side of its
    predictions then comes from the machine the profile was measured on.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["placer.target/1"] = Field(SCHEMA, alias="schema")
    name: str = Field(min_length=1)
    source: str = ""
    cpu: CpuDescription | None = None
    gpus: list[DeviceDescription] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_gpus_with_links(self) -> TargetDescription:
        for i, g in enumerate(self.gpus):
            if g.transfer is None:
                raise ValueError(f"gpus.{i}.transfer: GPU {g.name!r} has no host link; measure or describe its copies")
        return self

    def save(self, path: str | Path) -> Path:
        """Write the description as JSON, atomically."""
        from placer.files import write_text_atomic

        return write_text_atomic(path, self.model_dump_json(by_alias=True, indent=1, exclude_none=True) + "\n")


def load_target(name_or_path: str | Path | TargetDescription) -> TargetDescription:
    """A shipped target (``"h200"``) or one from a JSON file (``placer describe -o box.json``).

    A file holding one GPU's description (the older format) is read as a target with
    that GPU and no CPU description.

    Raises
    ------
    TargetError
        No such shipped target or file, not JSON, or an invalid field (named).
    """
    if isinstance(name_or_path, TargetDescription):
        return name_or_path
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        try:
            text = p.read_text()
        except OSError as exc:
            raise TargetError(f"cannot read target {str(p)!r}: {exc.strerror}; give a file `placer describe` "
                              "wrote, or a shipped target (h200)") from None
        where = str(p)
    else:
        key = str(name_or_path).lower().replace("nvidia-", "").replace("nvidia ", "")
        try:
            text = _data().joinpath(f"{key}.json").read_text()
        except FileNotFoundError:
            have = sorted(f.name[:-5] for f in _data().iterdir() if f.name.endswith(".json"))
            raise TargetError(f"unknown target {str(name_or_path)!r}; shipped targets: {', '.join(have)}, "
                              "or give a JSON file `placer describe -o FILE` wrote") from None
        where = f"shipped target {key!r}"
    return parse_target(text, where=where)


def parse_target(text: str, *, where: str = "target") -> TargetDescription:
    """A :class:`TargetDescription` from JSON text; errors name the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TargetError(f"{where}: not valid JSON ({exc}); fix the syntax") from None
    if isinstance(data, dict) and "schema" not in data and "peak_flops" in data:
        data = {"schema": SCHEMA, "name": data.get("name", "GPU"), "gpus": [data]}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise TargetError(f"{where}: not a placer target (expected \"schema\": {SCHEMA!r}); "
                          "write one with `placer describe -o FILE`")
    try:
        return TargetDescription.model_validate(data)
    except ValidationError as exc:
        raise TargetError(f"{where}: {_fields(exc)}") from None


def _fields(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"field {loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def _data():
    return resources.files("placer").joinpath("data")
