"""Measuring host↔device copies: latency and bandwidth for each way of copying.

May import: numpy (inside functions), placer.devices, placer.timing,
placer.costmodel.bus (fitting), placer.data, placer.executor.transfer (to copy
exactly as a run does). The device's kind supplies any further ways of copying
(:meth:`placer.devices.DeviceKind.extra_copies`) and the synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from placer.costmodel.bus import fit_link
from placer.data.measures import TransferModel, copy_mode
from placer.devices import Device, host_device
from placer.timing import Measurement, measure

#: transfer sizes measured (bytes), KB to hundreds of MB
TRANSFER_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20)


# -- transfers -------------------------------------------------------------------------------
def measure_transfers(device: Device, *, budget_s: float = 10.0, sizes: Iterable[int] = TRANSFER_SIZES,
                      fingerprint: str = "") -> TransferModel:
    """Measure host↔``device`` copies: latency and bandwidth, each way of copying.

    Every device: the executor's own copies (:func:`placer.executor.transfer.to_location`),
    ``staged`` (at least :data:`~placer.executor.transfer.PIN_THRESHOLD` bytes) or
    ``fresh`` host→device and ``fresh`` device→host. Then the kind's further ways
    (on a GPU: ``pinned`` and ``pageable`` both ways, and ``fresh`` allocating
    host→device copies). Without its own ``staged`` fit, ``staged`` is taken from
    ``pinned``, else from ``fresh``.
    """
    import numpy as np

    from placer.executor.transfer import PIN_THRESHOLD, to_location

    cpu = host_device()
    t_end = time.perf_counter() + budget_s
    pts: dict[str, dict[str, list]] = {"h2d": {}, "d2h": {}}

    def add(direction, mode, nb, m):
        pts[direction].setdefault(mode, []).append((nb, m.median_s))

    def per_call() -> float:
        return max(0.02, (t_end - time.perf_counter()) / 40)

    sync = device.synchronize
    for nb in sorted(sizes):
        if time.perf_counter() > t_end:
            break
        host = np.ones(nb // 4, dtype=np.float32)
        kw = dict(sync=sync, min_reps=3, max_reps=20, min_time_s=0.01, max_time_s=per_call(), warn=False)
        add("h2d", copy_mode("h2d", nb), nb, measure(lambda: to_location(host, device), **kw))
        on_dev = to_location(host, device)[0]
        add("d2h", copy_mode("d2h", nb), nb, measure(lambda: to_location(on_dev, cpu), **kw))
        for direction, mode, call in device.driver.extra_copies(device, host, on_dev):
            if mode != copy_mode(direction, nb):  # the executor's own way was measured above
                add(direction, mode, nb, measure(call, **kw))
    links = {d: {m: fit_link(*zip(*sorted(p))) for m, p in modes.items() if len(p) >= 2} for d, modes in pts.items()}
    h2d = links["h2d"]
    fallback = h2d.get("pinned", h2d.get("fresh"))
    if "staged" not in h2d and fallback is not None:
        h2d["staged"] = fallback
    return TransferModel(device=device.name, label="measured", links=links, fingerprint=fingerprint,
                         pin_threshold=PIN_THRESHOLD)


def value_copies(value: Any, device: Device, *, max_time_s: float = 0.05) -> dict[str, Measurement]:
    """Copying every array of a per-batch ``value`` into ``device`` in each further way its kind offers
    host→device (on a GPU: ``pinned`` and ``pageable``; none elsewhere): way → the time of all the
    value's arrays copied in turn, synchronised through the device (a few repeats)."""
    import numpy as np

    from placer.executor.transfer import to_location

    calls: dict[str, list] = {}
    for host in _host_arrays(value, np):
        on_dev = to_location(host, device)[0]
        for direction, mode, call in device.driver.extra_copies(device, host, on_dev):
            if direction == "h2d" and mode in ("pinned", "pageable"):
                calls.setdefault(mode, []).append(call)
    return {mode: measure(lambda cs=cs: [c() for c in cs], sync=device.synchronize, cold=False, warmup=0,
                          min_reps=1, max_reps=3, min_time_s=0.0, max_time_s=max_time_s, warn=False,
                          label=f"{mode} copy into {device.name}")
            for mode, cs in calls.items()}


def _host_arrays(value: Any, np: Any) -> list:
    """The numeric arrays of a value (dicts, lists and tuples walked), as numpy arrays on the host."""
    out: list = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, np.ndarray) and v.dtype != object:
            out.append(np.ascontiguousarray(v))
        elif type(v).__module__.startswith("torch") and getattr(getattr(v, "device", None), "type", None) == "cpu":
            out.append(v.detach().numpy())

    walk(value)
    return out
