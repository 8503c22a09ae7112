"""Value types shared by measurements and predictions: work counts, copy links, predictions.

May import: numpy, pydantic. Nothing from placer: the profile, the cost table and the
cost model all read these.

A :class:`Prediction` is a value with its error and provenance; :class:`Work` is the
counted work of one call; a :class:`Link` is one way of copying in one direction
(a curve over size: its measured points interpolated in log-log, ``latency_s +
nbytes / bandwidth_Bps`` beyond them) and a :class:`TransferModel` holds a device's
links. :func:`copy_mode` is the one rule for which way a copy goes (the executor
copies by it, the transfer model and the simulator price by it):

>>> copy_mode("h2d", 4096), copy_mode("h2d", 4 << 20), copy_mode("d2h", 4 << 20)
('fresh', 'staged', 'fresh')
>>> copy_mode("h2d", 4 << 20, pin=False)
'fresh'

Fitting them lives in :mod:`placer.costmodel`; measuring them in :mod:`placer.profile`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

Label = Literal["measured", "predicted", "roofline", "scaled"]
Direction = Literal["h2d", "d2h"]
Mode = Literal["pinned", "pageable", "fresh", "staged"]
#: host→device copies of at least this many bytes are staged through pinned memory
PIN_THRESHOLD = 1 << 20
#: per direction, the way the executor copies below and at/above the threshold
EXECUTOR_MODES: dict[str, tuple[str, str]] = {"h2d": ("fresh", "staged"), "d2h": ("fresh", "fresh")}


def copy_mode(direction: Direction, nbytes: float, *, pin: bool = True, threshold: int = PIN_THRESHOLD,
              executor: dict | None = None) -> Mode:
    """The way the executor copies ``nbytes`` in ``direction``: the one copy-kind rule.

    Host→device copies of at least ``threshold`` bytes are ``staged`` through
    pinned (page-locked) memory when ``pin`` allows it; smaller ones are ``fresh``
    (an ordinary pageable host buffer copied into newly allocated device memory).
    Device→host copies allocate a fresh pageable host buffer at any size.
    ``executor`` overrides the modes per direction (``{"h2d": (small, large)}``).
    """
    small, large = (executor or EXECUTOR_MODES)[direction]
    return large if pin and nbytes >= threshold else small


def curve_seconds(points: list[tuple[float, float]], nbytes: float, latency_s: float,
                  bandwidth_Bps: float) -> float:
    """Seconds at ``nbytes`` on a copy curve: its points interpolated in log-log,
    extended beyond the largest by the last segment's bandwidth (never faster than
    ``bandwidth_Bps``), and below the smallest by ``latency_s + nbytes / bandwidth_Bps``
    (never above the smallest point). Points at the same size count as their median.

    >>> curve_seconds([(1e3, 1e-5), (1e6, 1e-4), (1e6, 3e-4)], 2e6, 1e-5, 1e10) > 2e-4
    True
    """
    if nbytes <= 0:
        return 0.0
    by_size: dict[float, list[float]] = {}
    for nb, s in points:  # a size measured twice (two calls copying the same way) is one point
        by_size.setdefault(float(nb), []).append(float(s))
    pts = sorted((nb, float(np.median(ts))) for nb, ts in by_size.items())
    if len(pts) < 2:
        return latency_s + nbytes / bandwidth_Bps
    b = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    if nbytes > b[-1]:
        slope = max((t[-1] - t[-2]) / (b[-1] - b[-2]), 1.0 / bandwidth_Bps, 1e-15)
        return float(t[-1] + (nbytes - b[-1]) * slope)
    if nbytes < b[0]:
        return float(min(t[0], latency_s + nbytes / bandwidth_Bps) or t[0])
    return float(np.exp(np.interp(np.log(nbytes), np.log(b), np.log(t))))



class Prediction(BaseModel):
    """A predicted value with its error estimate and provenance.

    Attributes
    ----------
    value : float
        The predicted quantity (seconds or bytes).
    rel_error : float
        Estimated relative error (one standard deviation, roughly).
    label : {"measured", "predicted", "roofline", "scaled"}
        ``measured``: at a measured size; ``predicted``: from a fit to measurements
        of this device; ``roofline``: from work counts and a device description;
        ``scaled``: measured (or fitted) on this machine's CPU and scaled to a
        described target's CPU by ops measured on both.
    extrapolation : float
        How far outside the measured sizes (1.0 inside; 10.0 means ten times
        beyond the largest or below the smallest).
    far_outside : bool
        ``extrapolation`` exceeds :data:`FAR_FACTOR`.
    fit_spread : float
        How far (relative) fit forms that match the measurements about as well disagree
        at this size, where that exceeds the fit's own error (then ``rel_error`` is at
        least this); 0 otherwise.
    """

    value: float
    rel_error: float
    label: Label = "predicted"
    extrapolation: float = 1.0
    far_outside: bool = False
    fit_spread: float = 0.0

    def __str__(self) -> str:
        flag = " (far outside the measured sizes)" if self.far_outside else ""
        spread = f" (fit forms disagree by {self.fit_spread:.0%})" if self.fit_spread > 0 else ""
        return f"{self.value:.4g} ±{self.rel_error:.0%} [{self.label}]{flag}{spread}"



class Work(BaseModel):
    """The work of one call.

    Attributes
    ----------
    flops : float
        Floating-point operations.
    tensor_flops : float
        The part of ``flops`` in matrix products, convolutions and attention: what a GPU's
        tensor cores take in a lower precision (TF32, bf16, fp16); the rest (elementwise,
        reductions) runs at the ordinary rate. 0 when not counted (an older profile, declared work).
    bytes : float
        Bytes read and written, summed over operations.
    tensor_bytes : float
        The part of ``bytes`` read and written by the ops of ``tensor_flops`` (their inputs and
        outputs): halved in bf16 or fp16, whose elements take two bytes. 0 when not counted.
    irregular_bytes : float
        The part of ``bytes`` read and written by ops that reach memory through an index, a
        mask or a sort (boolean-mask compaction, gathers and scatters by index, scatter-adds,
        sorts, ``unique``): on a GPU they run at a fraction of streaming bandwidth
        (:attr:`placer.costmodel.roofline.DeviceDescription.irregular_eff`). 0 when not counted.
    ops : int
        Operations issued (≈ kernel launches on a GPU).
    calls : int
        Calls through torch's dispatcher, views and metadata included (``t``, ``view``,
        ``detach``, a profiler's record): each costs the host a dispatch though it launches
        nothing; 0 when not counted (a profile from an older placer: ``ops`` stands in).
    syncs : int
        Operations that wait for the device's result on the host (``.item()``,
        boolean-mask compaction, ``nonzero``): a synchronisation each on a GPU.
    precision : str
        The floating-point type that dominates (``fp32``, ``bf16``, ``fp16``, ``fp64``).
    host_s : float
        The host-side (Python, dispatch) seconds a GPU run pays: the calls dispatched times a
        tiny op's measured cost, plus ``outside_s`` (filled in by the cost model).
    source : str
        ``counted`` (torch), ``declared`` (the stage's own counts) or ``tensor sizes``
        (only the bytes of inputs and outputs were known).
    outside_s : float
        Seconds of the counting thread's CPU time the counted call spent outside torch
        operations (Python, numpy, a DataLoader), torch's own work (freeing its tensors)
        kept out: host work that a GPU run of the stage pays as well.
    """

    @property
    def dispatches(self) -> int:
        """The calls that cost the host a dispatch (``calls``, or ``ops`` when not counted)."""
        return self.calls or self.ops

    flops: float = 0.0
    #: the part of ``flops`` tensor cores take (matrix products, convolutions, attention)
    tensor_flops: float = 0.0
    bytes: float = 0.0
    #: the part of ``bytes`` the tensor-core ops read and write
    tensor_bytes: float = 0.0
    #: the part of ``bytes`` moved by indexed, masked or sorting ops (see the class docstring)
    irregular_bytes: float = 0.0
    ops: int = 1
    syncs: int = 0
    calls: int = 0
    outside_s: float = 0.0
    precision: str = "fp32"
    source: str = "counted"
    #: host-side seconds a GPU run pays (filled in by the cost model; 0 when unknown)
    host_s: float = 0.0



class PrecisionCheck(BaseModel):
    """A stage run here in a lower precision and compared with fp32 on the profiled input.

    Attributes
    ----------
    precision : str
        ``tf32``, ``bf16`` or ``fp16``.
    metric : {"outputs", "loss"}
        What was compared: the stage's outputs (their largest relative difference, by norm),
        or its loss (a training stage whose output has a ``loss`` or ``losses`` entry).
    rel_error : float
        The relative difference from the fp32 run.
    tolerance : float
        The stage's tolerance; the precision is chosen only when ``rel_error`` is within it.
    method : str
        How the precision was run here (``autocast`` on the CPU, or TF32 emulated by
        rounding the inputs of matrix products to a 10-bit mantissa).
    seconds, fp32_seconds : float or None
        This CPU's time for the stage in that precision and in fp32 (the least of a few
        runs for a one-shot stage; one run for a stream's stage).
    size : int or None
        The size the pipeline was built at for the check.
    bytes_ratio, ops_ratio, calls_ratio : float or None
        The stage's work counted under this precision (bf16, fp16: ``torch.autocast``, so each
        op's tensors have the type autocast gives them) over its work counted in fp32, on the
        same input: bytes moved, kernels launched, calls dispatched (autocast's casts add
        some). None when not counted (TF32 moves fp32 bytes; a stream's stage). The roofline
        prices the precision's work with them (:func:`placer.costmodel.precision.under`).
    counted : list of dict
        The counts those ratios come from, one per size counted: ``size``, and fp32's and
        this precision's ``bytes``/``low_bytes``, ``ops``/``low_ops``, ``calls``/``low_calls``.
        With two sizes the roofline takes the difference autocast makes as a line over size
        (a weight's casts are fixed, an activation's halving grows with the batch).
    """

    precision: str
    metric: Literal["outputs", "loss"] = "outputs"
    rel_error: float = Field(ge=0)
    tolerance: float = Field(gt=0)
    method: str = ""
    seconds: float | None = None
    fp32_seconds: float | None = None
    size: int | None = None
    bytes_ratio: float | None = Field(default=None, gt=0)
    ops_ratio: float | None = Field(default=None, gt=0)
    calls_ratio: float | None = Field(default=None, gt=0)
    counted: list[dict[str, float]] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the difference is within the tolerance."""
        return self.rel_error <= self.tolerance

    def words(self) -> str:
        """``loss differs by 0.31% (tolerance 1.00%)``: the measured difference, for reasons."""
        what = "loss differs" if self.metric == "loss" else "outputs differ"
        return f"{what} by {_pct(self.rel_error)} (tolerance {_pct(self.tolerance)})"


def _pct(x: float) -> str:
    if x >= 1e6:
        return "everything (shapes, types or non-finite values differ)"
    if 0 < x < 1e-4:
        return f"{x * 100:.1g}%"
    return f"{x:.2%}" if x < 0.1 else f"{x:.0%}"


class Link(BaseModel):
    """One way of copying in one direction: ``latency_s + nbytes / bandwidth_Bps``.

    Attributes
    ----------
    points : list of [bytes, seconds]
        The measured medians the fit came from (empty for a description).
    rel_error : float
        Root-mean-square relative error of the fit over its points.
    """

    latency_s: float = Field(ge=0)
    bandwidth_Bps: float = Field(gt=0)
    points: list[tuple[float, float]] = Field(default_factory=list)
    rel_error: float = 0.0

    def seconds(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` over this link (:func:`curve_seconds` of its points)."""
        return curve_seconds(self.points, nbytes, self.latency_s, self.bandwidth_Bps)


class TransferModel(BaseModel):
    """Host↔device copy costs of one device.

    Attributes
    ----------
    device : str
        The device (``gpu:0``, ``gpu-sim``) or description (``NVIDIA H200``) it is for.
    label : {"measured", "roofline"}
        ``measured`` on this machine, or taken from a device description.
    links : dict
        ``{"h2d": {mode: Link}, "d2h": {mode: Link}}``; modes as measured.
    executor : dict
        Per direction, the mode the executor uses below and at/above
        ``pin_threshold``: ``{"h2d": ["fresh", "staged"], "d2h": ["fresh", "fresh"]}``.
    fingerprint : str
        The machine it was measured on (empty for descriptions).
    """

    device: str
    label: Label = "measured"
    links: dict[Direction, dict[Mode, Link]]
    executor: dict[Direction, tuple[Mode, Mode]] = Field(default_factory=lambda: dict(EXECUTOR_MODES))
    pin_threshold: int = PIN_THRESHOLD
    fingerprint: str = ""

    def mode_for(self, direction: Direction, nbytes: float, *, pin: bool = True) -> Mode:
        """The way the executor copies ``nbytes`` (:func:`copy_mode` with this model's threshold)."""
        return copy_mode(direction, nbytes, pin=pin, threshold=self.pin_threshold, executor=self.executor)

    def link_for(self, direction: Direction, nbytes: float, *, pin: bool = True) -> Link:
        """The link the executor would use for a copy of ``nbytes``."""
        mode = self.mode_for(direction, nbytes, pin=pin)
        have = self.links[direction]
        if mode in have:
            return have[mode]
        # fall back to the closest measured way of copying
        for alt in {"staged": ("pinned",)}.get(mode, ()) + ("fresh", "pageable", "pinned"):
            if alt in have:
                return have[alt]
        raise KeyError(f"transfer model for {self.device!r} has no {direction} links")

    def predict(self, nbytes: float, direction: Direction = "h2d") -> Prediction:
        """Seconds to copy ``nbytes`` the way the executor does."""
        link = self.link_for(direction, nbytes)
        top = max((p[0] for p in link.points), default=0.0)
        x = nbytes / top if top and nbytes > top else 1.0
        return Prediction(
            value=link.seconds(nbytes),
            rel_error=max(link.rel_error, 0.05),
            label=self.label,
            extrapolation=x,
            far_outside=x > 10,
        )

    def curve(self, direction: Direction) -> list[tuple[float, float]]:
        """``(bytes, seconds)`` of the executor's copies in ``direction``, size by size: each
        link's measured sizes on its side of the pinning threshold, and both sides of it."""
        sizes = {float(b) for mode in set(self.executor[direction]) if mode in self.links[direction]
                 for b, _ in self.links[direction][mode].points}
        th = float(self.pin_threshold)
        sizes |= {th - 1.0, th, 4096.0, float(1 << 30)}
        return [(b, self.link_for(direction, b).seconds(b)) for b in sorted(s for s in sizes if s > 0)]

    def table_link(self) -> dict[str, dict]:
        """The optimizer's link: per direction the executor's copy curve (:meth:`curve`), with a
        small-copy latency and large-copy bandwidth for one-line summaries."""
        out = {}
        for d in ("h2d", "d2h"):
            small = self.link_for(d, 0)
            big = float(max(self.pin_threshold, 1 << 28))
            spent = self.link_for(d, big).seconds(big) - small.latency_s
            out[d] = {"latency_s": small.latency_s, "bandwidth_Bps": big / spent if spent > 0 else small.bandwidth_Bps,
                      "points": self.curve(d)}
        return out
