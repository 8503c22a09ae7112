"""The transfer (bus) model: host↔device copies, kept apart from compute fits.

May import: numpy, placer.data.measures (the types it fits). Never torch (measuring lives
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

import numpy as np

from placer.data.measures import (  # noqa: F401
    PIN_THRESHOLD,
    Direction,
    Label,
    Link,
    Mode,
    Prediction,
    TransferModel,
)


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

