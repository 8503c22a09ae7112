"""Device descriptions and the roofline model, for devices this machine lacks.

May import: json, importlib.resources, pydantic, placer.costmodel.{bus,counts,fit}, placer.errors.
Never torch.

A :class:`DeviceDescription` gives a device's peak rates (floating-point operations
per second by precision, memory bandwidth), its fixed costs (per operation issued,
per stage) and its host link, plus efficiency factors calibrated from measurements.
:meth:`DeviceDescription.predict` turns a :class:`~placer.costmodel.counts.Work`
into seconds::

    host   = host_factor * host_s + (ops - 1) * op_overhead_s
    device = max(flops / (peak_flops[precision] * compute_eff),
                 (bytes - irregular_bytes) / (mem_bandwidth_Bps * memory_eff)
                 + irregular_bytes / (mem_bandwidth_Bps * irregular_eff))
    t = stage_overhead_s + op_overhead_s + syncs * sync_s
        + max(host, device) + unhidden * min(host, device)

Host and device overlap: a GPU runs asynchronously, so between synchronisations the host's
Python, dispatch and launches run while the device computes the kernels already issued,
and the time is about the larger of the two, not their sum. What cannot overlap is paid on
top: the stage's fixed cost, the first launch (nothing runs on the device before it), each
synchronisation's wait, and ``unhidden`` (0 to 1) of the smaller side: the device cannot
start a kernel before the host issues it, so work issued last (a step's backward pass and
update) runs after the host is done. ``unhidden`` is calibrated with the other constants
(0.5 against the H200 reference rows; 1, the sum, for a description without it). The sum
would make a lower precision look weak exactly where it pays: a matmul-bound step whose
device time shrinks 7-14x in TF32 or bf16 would keep its whole host time on top.

Ops that reach memory through an index, a mask or a sort (``Work.irregular_bytes``: a
boolean-mask compaction, a scatter-add's group sums, a radix sort) run far below the
bandwidth of streaming elementwise work on a GPU; ``irregular_eff`` is their own fraction of
the bandwidth (calibrated from the reference's compaction, sort and group-by; a description
without it prices them as streaming work).

In a lower precision (``precision=`` other than the work's own), the tensor-core part of
the work (``Work.tensor_flops``: matrix products, convolutions, attention) runs at that
precision's peak and the rest at the work's own::

    compute = tensor_flops / (peak_flops[precision] * compute_eff)
              + (flops - tensor_flops) / (peak_flops[work.precision] * compute_eff)
    memory  = (bytes - tensor_bytes / 2) / (mem_bandwidth_Bps * memory_eff)    (bf16, fp16)

In ``bf16`` and ``fp16`` the tensor-core ops' bytes (``Work.tensor_bytes``) are halved (two-byte
elements of fp32 work); TF32 reads fp32 from memory, so its bytes are as counted. Everything
else keeps its bytes (autocast keeps reductions and losses in fp32), so a stage whose memory
traffic outside its products bounds it gains little from a lower precision, as on a GPU.

The host pays its own Python and dispatch (``host_s``) and a launch per kernel while the
device works, and a wait per synchronisation: ``ops`` are the kernel launches the stage
makes per call and ``syncs`` the times it waits for the device (``.item()``, a boolean-mask
compaction), both counted by :func:`~placer.costmodel.counts.count_work`: a loop of many
small steps is never predicted faster than its launches and synchronisations allow. ``host_s`` is the
stage's host time, measured (:meth:`placer.costmodel.model.CostModel.host_seconds`: the
ops it issues times a tiny op's cost, plus its time outside torch ops, scaled to the
target's CPU when the target describes one): a stage whose time is host-side Python
and dispatch pays that on a GPU too.

Every number that comes out of it is labelled ``roofline``: a prediction, not a
measurement.

Examples
--------
>>> h200 = load_description("h200")
>>> h200.name
'NVIDIA H200'
>>> from placer.costmodel.counts import Work
>>> t = h200.predict(Work(flops=2 * 4096**3, bytes=3 * 4096**2 * 4, ops=1))
>>> 1e-3 < t < 1e-2
True
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from placer.costmodel.bus import TransferModel
from placer.costmodel.counts import Work
from placer.costmodel.fit import Prediction
from placer.errors import InputFileError, validation_line


class CalibrationPoint(BaseModel):
    """One measured op the description was checked against."""

    op: str
    size: float
    work: Work
    measured_s: float
    predicted_s: float

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s


class DeviceDescription(BaseModel):
    """A device described by its rates, for predicting where it was never run.

    Attributes
    ----------
    name : str
        Human name, e.g. ``NVIDIA H200``.
    kind : {"gpu", "cpu"}
    source : str
        Where the numbers come from.
    memory_bytes : float
    peak_flops : dict
        Achievable floating-point operations per second by precision (``fp32``,
        ``tf32``, ``bf16``, ``fp16``, ``fp64``).
    mem_bandwidth_Bps : float
        Device-memory bandwidth, bytes read plus written per second.
    op_overhead_s : float
        Host-side cost of issuing one operation (kernel launch).
    sync_s : float
        Cost of one synchronisation with the host (waiting for the device).
    stage_overhead_s : float
        Fixed cost of running a stage there at all (launch plus synchronise).
    host_factor : float
        GPU host-side cost relative to a stage's host time (its Python and dispatch), overlapped
        with the device's work (see the module's docstring).
    unhidden : float
        Share (0 to 1) of the smaller of the host's and the device's time not hidden by the
        larger (1: their sum, as a description calibrated without overlap assumes).
    compute_eff, memory_eff : float
        Fractions of peak reached by real stages (calibrated).
    irregular_eff : float or None
        Fraction of the memory bandwidth reached by ops that address memory through an index,
        a mask or a sort (calibrated); None: as ``memory_eff``.
    first_call_s : float
        Typical one-time cost of a stage's first call there (context, compilation).
    transfer : TransferModel or None
        The host link.
    calibration : list of CalibrationPoint
        Measured ops and the description's predictions of them.
    """

    name: str
    kind: Literal["gpu", "cpu"] = "gpu"
    source: str = ""
    memory_bytes: float | None = None
    peak_flops: dict[str, float]
    mem_bandwidth_Bps: float = Field(gt=0)
    op_overhead_s: float = Field(ge=0)
    sync_s: float = Field(default=0.0, ge=0)
    stage_overhead_s: float = Field(ge=0)
    host_factor: float = Field(default=0.0, ge=0)
    #: share of the smaller of the host's and the device's time that the larger does not hide
    unhidden: float = Field(default=1.0, ge=0, le=1)
    compute_eff: float = Field(gt=0, le=1.5)
    memory_eff: float = Field(gt=0, le=1.5)
    irregular_eff: float | None = Field(default=None, gt=0, le=1.5)
    first_call_s: float = 0.0
    transfer: TransferModel | None = None
    calibration: list[CalibrationPoint] = Field(default_factory=list)
    #: typical ratio spread (predicted/measured) over the calibration ops, as a relative error
    rel_error: float = 1.0

    def peak(self, precision: str) -> float:
        if precision in self.peak_flops:
            return self.peak_flops[precision]
        return self.peak_flops.get("fp32", min(self.peak_flops.values()))

    def predict(self, work: Work, *, precision: str | None = None) -> float:
        """Seconds for ``work`` on this device (steady state, data already there)."""
        prec = precision or work.precision
        nbytes = work.bytes
        if prec != work.precision and work.tensor_flops > 0:
            tensor = min(work.tensor_flops, work.flops)
            compute = (tensor / self.peak(prec) + (work.flops - tensor) / self.peak(work.precision)) / self.compute_eff
            if prec in ("bf16", "fp16") and work.precision in ("fp32", "tf32"):
                nbytes -= min(work.tensor_bytes, work.bytes) / 2
        elif prec != work.precision:  # nothing known to run on tensor cores: the precision changes nothing
            compute = work.flops / (self.peak(work.precision) * self.compute_eff)
        else:
            compute = work.flops / (self.peak(prec) * self.compute_eff)
        irregular = min(work.irregular_bytes, nbytes)
        memory = ((nbytes - irregular) / self.memory_eff
                  + irregular / (self.irregular_eff or self.memory_eff)) / self.mem_bandwidth_Bps
        first = min(work.ops, 1) * self.op_overhead_s
        host = self.host_factor * work.host_s + max(work.ops - 1, 0) * self.op_overhead_s
        device = max(compute, memory)
        return (self.stage_overhead_s + first + work.syncs * self.sync_s
                + max(host, device) + self.unhidden * min(host, device))

    def prediction(self, work: Work, **kw) -> Prediction:
        """:meth:`predict` wrapped with its error and the ``roofline`` label."""
        return Prediction(value=self.predict(work, **kw), rel_error=self.rel_error, label="roofline")

    def device_entry(self) -> dict:
        """This device as an entry of the optimizer's ``devices`` table."""
        return {"kind": self.kind, "memory_bytes": self.memory_bytes, "label": f"{self.name} (described)"}


def load_description(name_or_path: str | Path) -> DeviceDescription:
    """Load a shipped description (``"h200"``) or one from a JSON file (a whole-machine
    target gives its first GPU; :func:`placer.target.load_target` reads the whole).

    Raises
    ------
    FileNotFoundError
        Neither a shipped description nor a file of that name exists.
    """
    return _load(name_or_path, _first_gpu)


def load_gpus(name_or_path: str | Path) -> list[DeviceDescription]:
    """Every GPU of a shipped target (``"h200"``) or of a JSON file (a whole-machine target,
    or one GPU's description); errors as :func:`load_description`."""
    return _load(name_or_path, _all_gpus)


def _load(name_or_path: str | Path, pick):
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return _from_file(p, pick)
    key = str(name_or_path).lower().replace("nvidia-", "").replace("nvidia ", "")
    try:
        text = _data().joinpath(f"{key}.json").read_text()
    except FileNotFoundError as exc:
        have = sorted(f.name[:-5] for f in _data().iterdir() if f.name.endswith(".json"))
        raise FileNotFoundError(
            f"no device description {name_or_path!r}; shipped ones: {', '.join(have)}, "
            "or give a path to a description JSON file"
        ) from exc
    return pick(json.loads(text))


def _first_gpu(data: dict) -> DeviceDescription:
    """A GPU description, or the first GPU of a whole-machine target (:mod:`placer.target`)."""
    if isinstance(data, dict) and "gpus" in data:
        if not data["gpus"]:
            raise ValueError(f"target {data.get('name', '')!r} describes no GPU")
        data = data["gpus"][0]
    return DeviceDescription.model_validate(data)


def _all_gpus(data: dict) -> list[DeviceDescription]:
    """Every GPU of a whole-machine target, or the one GPU of a GPU description."""
    if isinstance(data, dict) and "gpus" in data:
        return [DeviceDescription.model_validate(g) for g in data["gpus"]]
    return [DeviceDescription.model_validate(data)]


def _from_file(p: Path, pick=_first_gpu):
    """A description file; :class:`~placer.errors.InputFileError` names the file and the bad fields."""
    where = f"device description {str(p)!r}"
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except IsADirectoryError:
        raise InputFileError(f"{where} is a directory; give the JSON file's path") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {where}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputFileError(f"{where} is not valid JSON ({type(exc).__name__}: {exc}); fix it") from None
    try:
        return pick(data)
    except ValueError as exc:
        if not isinstance(exc, ValidationError):
            raise InputFileError(f"{where}: {exc}") from None
        raise InputFileError(f"{where}: {validation_line(exc)}; see the shipped placer/data/h200.json") from None


def _data():
    return resources.files("placer").joinpath("data")
