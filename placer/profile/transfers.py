"""Measuring host↔device copies: latency and bandwidth for each way of copying.

May import: numpy, torch (inside functions), placer.devices, placer.timing,
placer.costmodel.bus (fitting), placer.data, placer.executor.transfer (to copy
exactly as a run does).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from placer.costmodel.bus import fit_link
from placer.data.measures import TransferModel
from placer.devices import Device
from placer.timing import measure

#: transfer sizes measured (bytes), KB to hundreds of MB
TRANSFER_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20)



# -- transfers -------------------------------------------------------------------------------
def measure_transfers(device: Device, *, budget_s: float = 10.0, sizes: Iterable[int] = TRANSFER_SIZES,
                      fingerprint: str = "") -> TransferModel:
    """Measure host↔``device`` copies: latency and bandwidth, each way of copying.

    On a GPU: ``pinned``, ``pageable``, ``fresh`` (allocating) and ``staged`` (the
    executor's pinned staging, via :func:`placer.executor.transfer.to_location`)
    host→device; ``pinned``, ``pageable`` and ``fresh`` device→host. On the
    simulated device, the executor's copies only (host memory both sides).
    """
    import numpy as np
    import torch

    from placer.executor.transfer import PIN_THRESHOLD, to_location

    cpu = Device(name="cpu", kind="cpu", label="host")
    t_end = time.perf_counter() + budget_s
    pts: dict[str, dict[str, list]] = {"h2d": {}, "d2h": {}}

    def add(direction, mode, nb, m):
        pts[direction].setdefault(mode, []).append((nb, m.median_s))

    def per_call() -> float:
        return max(0.02, (t_end - time.perf_counter()) / 40)

    gpu = device.kind == "gpu"
    sync = (lambda: torch.cuda.synchronize(device.index)) if gpu else None
    for nb in sorted(sizes):
        if time.perf_counter() > t_end:
            break
        host = np.ones(nb // 4, dtype=np.float32)
        kw = dict(sync=sync, min_reps=3, max_reps=20, min_time_s=0.01, max_time_s=per_call(), warn=False)
        staged_or_fresh = "staged" if nb >= PIN_THRESHOLD else "fresh"
        add("h2d", staged_or_fresh, nb, measure(lambda: to_location(host, device), **kw))
        on_dev = to_location(host, device)[0]
        add("d2h", "fresh", nb, measure(lambda: to_location(on_dev, cpu), **kw))
        if gpu:
            src = torch.from_numpy(host)
            pinned = src.pin_memory()
            dst = torch.empty_like(on_dev)
            add("h2d", "pinned", nb, measure(lambda: dst.copy_(pinned, non_blocking=True), **kw))
            add("h2d", "pageable", nb, measure(lambda: dst.copy_(src), **kw))
            if nb < PIN_THRESHOLD:
                add("h2d", "fresh", nb, measure(lambda: src.to(device.torch_device()), **kw))
            add("d2h", "pinned", nb, measure(lambda: pinned.copy_(on_dev, non_blocking=True), **kw))
            add("d2h", "pageable", nb, measure(lambda: src.copy_(on_dev), **kw))
    links = {d: {m: fit_link(*zip(*sorted(p))) for m, p in modes.items() if len(p) >= 2} for d, modes in pts.items()}
    if gpu and "staged" not in links["h2d"] and "pinned" in links["h2d"]:
        links["h2d"]["staged"] = links["h2d"]["pinned"]
    if not gpu:
        links["h2d"].setdefault("staged", links["h2d"].get("fresh"))
        links["h2d"] = {k: v for k, v in links["h2d"].items() if v is not None}
    return TransferModel(device=device.name, label="measured", links=links, fingerprint=fingerprint,
                         pin_threshold=PIN_THRESHOLD)
