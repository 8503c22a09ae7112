"""The transfer (bus) model: host↔device copies, kept apart from compute fits.

May import: numpy, pydantic, placer.costmodel.fit. Never torch (measuring lives
in :mod:`placer.profile`).

As StarPU's ``perfmodel_bus`` is apart from its regression models, a transfer
is predicted from the bytes moved alone: ``latency_s + nbytes / bandwidth_Bps``,
per direction and per way of copying: ``pinned`` (a page-locked host buffer),
``pageable`` (an ordinary host buffer, copied into an existing one), ``fresh`` (the
destination is freshly allocated, as ``torch.from_numpy(a).to("cuda")`` and
``t.cpu()`` do) and ``staged`` (first copied into a fresh pinned buffer, then
copied asynchronously). :class:`TransferModel` also records which way the
executor copies (:attr:`TransferModel.executor`): host→device copies of at least
``pin_threshold`` bytes are staged through pinned memory, smaller ones are fresh;
device→host copies allocate fresh host tensors. Predictions use the executor's
way, since that is what a run will pay.

Inside the measured sizes a link interpolates its measured points (log-log);
outside, it extends the nearest segment's bandwidth. ``latency_s`` and
``bandwidth_Bps`` are a least-squares line over all points, for summaries and the
optimizer's one-line link model.

Examples
--------
>>> link = fit_link([4096, 1 << 20, 1 << 24], [2e-5, 1.1e-4, 1.3e-3])
>>> 1e10 < link.bandwidth_Bps < 2e10
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from placer.costmodel.fit import Label, Prediction

Direction = Literal["h2d", "d2h"]
Mode = Literal["pinned", "pageable", "fresh", "staged"]
#: the executor's threshold for pinned staging (placer.executor.transfer.PIN_THRESHOLD)
PIN_THRESHOLD = 1 << 20


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
        """Seconds to copy ``nbytes`` over this link."""
        if nbytes <= 0:
            return 0.0
        pts = sorted(self.points)
        if len(pts) < 2:
            return self.latency_s + nbytes / self.bandwidth_Bps
        b = np.array([p[0] for p in pts])
        t = np.array([p[1] for p in pts])
        if nbytes > b[-1]:
            slope = max((t[-1] - t[-2]) / (b[-1] - b[-2]), 1.0 / self.bandwidth_Bps, 1e-15)
            return float(t[-1] + (nbytes - b[-1]) * slope)
        if nbytes < b[0]:
            return float(min(t[0], self.latency_s + nbytes / self.bandwidth_Bps) or t[0])
        return float(np.exp(np.interp(np.log(nbytes), np.log(b), np.log(t))))


def fit_link(nbytes: Sequence[float], seconds: Sequence[float]) -> Link:
    """Fit latency and bandwidth to measured copies, minimising relative error.

    Raises
    ------
    ValueError
        Fewer than two points, or a size or time that is not positive.
    """
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(b) < 2 or b.shape != t.shape or np.any(b <= 0) or np.any(t <= 0):
        raise ValueError("fit_link needs at least two copies with positive bytes and seconds")
    w = 1.0 / t
    A = np.stack([w, b * w], axis=1)
    (lat, inv_bw), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if inv_bw <= 0:  # latency-dominated: bandwidth from the largest copy
        inv_bw = float(t[-1] / b[-1])
        lat = 0.0
    if lat < 0:  # bandwidth-dominated: through the origin
        lat = 0.0
        inv_bw = float((b * w) @ np.ones_like(t) / ((b * w) @ (b * w)))
    pred = lat + b * inv_bw
    err = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return Link(
        latency_s=float(lat),
        bandwidth_Bps=float(1.0 / inv_bw),
        points=[(float(x), float(y)) for x, y in zip(b, t)],
        rel_error=err,
    )


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
    executor: dict[Direction, tuple[Mode, Mode]] = Field(
        default_factory=lambda: {"h2d": ("fresh", "staged"), "d2h": ("fresh", "fresh")}
    )
    pin_threshold: int = PIN_THRESHOLD
    fingerprint: str = ""

    def link_for(self, direction: Direction, nbytes: float) -> Link:
        """The link the executor would use for a copy of ``nbytes``."""
        small, large = self.executor[direction]
        mode = large if nbytes >= self.pin_threshold else small
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

    def table_link(self) -> dict[str, dict[str, float]]:
        """The optimizer's single-line link: small-copy latency, large-copy bandwidth."""
        out = {}
        for d in ("h2d", "d2h"):
            small = self.link_for(d, 0)
            big = float(max(self.pin_threshold, 1 << 28))
            spent = self.link_for(d, big).seconds(big) - small.latency_s
            out[d] = {"latency_s": small.latency_s, "bandwidth_Bps": big / spent if spent > 0 else small.bandwidth_Bps}
        return out
