"""Two independent branches that merge: events → (sessions ‖ embed) → score.

Models a scoring job whose features come from two kinds of work::

    events ──► sessions (sequential scan: CPU-friendly) ──┐
       │                                                   ├──► score
       └────► embed (dense MLP: GPU-friendly) ─────────────┘

``size`` event rows of 32 float32 fields arrive on the host. ``sessions`` walks
the rows in order keeping a running state (an exponential moving average of each
row's branchy activity sum, and the drawdown from its running peak): a
loop-carried recurrence, ``numba.njit`` on the CPU and a single-thread
``numba.cuda`` kernel on a GPU. ``embed`` pushes every row through a seeded
32-1024-1024-32 MLP: dense arithmetic that a GPU does far faster. ``score``
concatenates both feature sets and applies a linear head and a sigmoid.

The branches are independent, so with ``sessions`` on the CPU and ``embed`` on a
GPU they run at the same time and the run takes about the longer branch, not
their sum: the placement is only as good as the schedule that overlaps them.

May import: numpy, placer; torch and numba inside functions.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 20_000
FIELDS = 32
HIDDEN = 1024
EMBED = 32
_WEIGHTS: dict[tuple[str, int], dict] = {}
_LOCK = threading.Lock()


def _events(size: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, FIELDS), dtype=np.float32)
    x[:, 0] += np.sin(np.arange(size) / 500.0).astype(np.float32)
    return x


def session_scan(x, alpha, out):
    """Per row: a branchy activity sum; across rows: its EMA and drawdown from the peak."""
    acc = np.float64(0.0)
    peak = np.float64(0.0)
    for i in range(x.shape[0]):
        s = np.float64(0.0)
        for j in range(x.shape[1]):
            v = np.float64(x[i, j])  # float64 explicitly, also in the CUDA simulator
            if v > 0:
                s += v
            else:
                s -= 0.5 * v
        acc = alpha * s + (1.0 - alpha) * acc
        peak = max(peak, acc)
        out[i, 0] = acc
        out[i, 1] = peak - acc


@functools.lru_cache(maxsize=None)
def scan_cpu_kernel():
    """``session_scan`` compiled by ``numba.njit`` (cached on disk when its module is importable)."""
    from placer.jit import njit

    return njit(session_scan)


@functools.lru_cache(maxsize=None)
def scan_gpu_kernel():
    """``session_scan`` compiled by ``numba.cuda.jit``, launched on one thread."""
    from numba import cuda

    return cuda.jit(session_scan)


def _sessions_cpu(events, alpha: float):
    out = np.empty((events.shape[0], 2), dtype=np.float32)
    scan_cpu_kernel()(np.ascontiguousarray(events), float(alpha), out)
    return out


def _sessions_gpu(events, alpha: float):
    from numba import cuda

    out = cuda.device_array((events.shape[0], 2), dtype=np.float32)
    scan_gpu_kernel()[1, 1](events, float(alpha), out)
    return out


def _weights(device, seed: int):
    import torch

    key = (str(device), seed)
    with _LOCK:
        if key not in _WEIGHTS:
            g = torch.Generator().manual_seed(seed)
            dims = [FIELDS, HIDDEN, HIDDEN, EMBED]
            w = {}
            for i, (a, b) in enumerate(zip(dims, dims[1:])):
                w[f"w{i}"] = (torch.randn(a, b, generator=g) / a**0.5).to(device)
                w[f"b{i}"] = (0.01 * torch.randn(b, generator=g)).to(device)
            w["head"] = (torch.randn(EMBED + 2, generator=g) / (EMBED + 2) ** 0.5).to(device)
            _WEIGHTS[key] = w
        return _WEIGHTS[key]


def _embed(events, device, seed: int):
    import torch

    w = _weights(events.device, seed)
    h = events
    with torch.no_grad():
        for i in range(3):
            h = h @ w[f"w{i}"] + w[f"b{i}"]
            if i < 2:
                h = torch.relu(h)
    return h


def _score(sessions, embed, device, seed: int):
    import torch

    w = _weights(embed.device, seed)
    feats = torch.cat([sessions.to(embed.dtype), embed], 1)
    return torch.sigmoid(feats @ w["head"])


def build(size: int | None = None, *, alpha: float = 0.05, seed: int = 0) -> Pipeline:
    """The branching pipeline over ``size`` event rows (default 20,000)."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"branches pipeline: size (rows) must be at least 1, got {n}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"branches pipeline: alpha must be in (0, 1], got {alpha}")
    p = Pipeline("branches", size=n)
    p.add(name="events", kind="other", cpu=_events, pin="cpu", params={"size": n, "seed": seed},
          doc="Event rows of 32 float32 fields, on the host.")
    p.add(name="sessions", kind="preprocessing", cpu={"fn": _sessions_cpu, "api": "numpy"},
          gpu={"fn": _sessions_gpu, "api": "numba.cuda"}, inputs=["events"], params={"alpha": alpha},
          doc="Sequential session state: EMA of activity and drawdown (numba).")
    p.add(name="embed", kind="inference", fn=_embed, inputs=["events"], params={"seed": seed},
          doc=f"{FIELDS}-{HIDDEN}-{HIDDEN}-{EMBED} MLP embedding of every row.")
    p.add(name="score", kind="inference", fn=_score, inputs=["sessions", "embed"], params={"seed": seed},
          doc="Linear head and sigmoid over both feature sets.")
    return p
