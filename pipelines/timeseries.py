"""Sensor time series: signal → smooth → exponential moving average → features → reduce.

Models a feature job over one long sensor recording of ``size`` float32 samples
(default 500,000): a noisy random walk is smoothed with a centred 9-sample
moving average (parallel: every output is independent), tracked with an
exponential moving average (a loop-carried recurrence: each value needs the one
before, so it runs on one thread wherever it runs), expanded into 16 features per
sample from the smoothed value, the average and their residual (parallel), and
reduced to per-feature statistics and the 16×16 feature Gram matrix.

The moving average has one body compiled twice: ``numba.njit`` on the CPU and a
single-thread ``numba.cuda.jit`` kernel on a GPU (``api="numba.cuda"``), so both
compute the same recurrence. A sequential loop gains nothing from thousands of
GPU threads: this stage is where a planner must keep work on the CPU at any size.
The smoothing, features and reduction are device-agnostic torch functions.

Compiled functions are cached on disk where the package folder is writable
(``cache=True``) and compiled in memory otherwise.

May import: numpy, placer; torch and numba inside functions.
"""

from __future__ import annotations

import functools

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 500_000
WINDOW = 9
FEATURES = 16


def _signal(size: int, seed: int):
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.standard_normal(size) * 0.05)
    noise = rng.standard_normal(size) * 0.5
    season = np.sin(np.arange(size) * (2 * np.pi / 1440.0))
    return (walk + season + noise).astype(np.float32)


def _smooth(signal, device):
    import torch
    import torch.nn.functional as F

    half = WINDOW // 2
    x = F.pad(signal[None, None], (half, half), mode="replicate")
    return F.avg_pool1d(x, WINDOW, stride=1)[0, 0]


def ema_loop(x, alpha, out):
    """``out[i] = alpha·x[i] + (1 − alpha)·out[i−1]`` (``out[−1] = x[0]``), in float64."""
    if x.shape[0] == 0:
        return
    acc = np.float64(x[0])
    for i in range(x.shape[0]):
        # float64 explicitly: numba promotes anyway, the CUDA simulator's numpy would not
        acc = alpha * np.float64(x[i]) + (1.0 - alpha) * acc
        out[i] = acc


@functools.lru_cache(maxsize=None)
def ema_cpu_kernel():
    """``ema_loop`` compiled by ``numba.njit`` (cached on disk when its module is importable)."""
    from placer.jit import njit

    return njit(ema_loop)


@functools.lru_cache(maxsize=None)
def ema_gpu_kernel():
    """``ema_loop`` compiled by ``numba.cuda.jit``, launched on one thread."""
    from numba import cuda

    return cuda.jit(ema_loop)


def _ema_cpu(smooth, alpha: float):
    out = np.empty_like(smooth, dtype=np.float32)
    ema_cpu_kernel()(np.ascontiguousarray(smooth), float(alpha), out)
    return out


def _ema_gpu(smooth, alpha: float):
    from numba import cuda

    out = cuda.device_array(smooth.shape[0], dtype=np.float32)
    ema_gpu_kernel()[1, 1](smooth, float(alpha), out)
    return out


def _features(smooth, ema, device):
    import torch

    r = smooth - ema
    cols = [smooth, ema, r, r * r, r.abs(), torch.tanh(r)]
    for k in (1, 2, 3, 4, 5):
        cols.append(torch.sin(k * r))
    for k in (1, 2, 3, 4, 5):
        cols.append(torch.cos(k * r))
    return torch.stack(cols, 1)


def _reduce(features, device):
    import torch

    f = features.to(torch.float64)
    n = max(f.shape[0], 1)
    return {
        "mean": f.mean(0),
        "std": f.std(0, unbiased=False),
        "min": f.amin(0),
        "max": f.amax(0),
        "gram": (f.T @ f) / n,
    }


def build(size: int | None = None, *, alpha: float = 0.01, seed: int = 0) -> Pipeline:
    """The time-series pipeline over ``size`` samples (default 500,000)."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"timeseries pipeline: size (samples) must be at least 1, got {n}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"timeseries pipeline: alpha must be in (0, 1], got {alpha}")
    p = Pipeline("timeseries", size=n, size_unit="samples")
    p.add(name="signal", kind="other", cpu=_signal, pin="cpu", params={"size": n, "seed": seed},
          doc="Noisy random walk with a daily cycle, on the host.")
    p.add(name="smooth", kind="preprocessing", fn=_smooth, inputs=["signal"],
          doc=f"Centred {WINDOW}-sample moving average.")
    p.add(name="ema", kind="preprocessing", cpu={"fn": _ema_cpu, "api": "numpy"},
          gpu={"fn": _ema_gpu, "api": "numba.cuda"}, inputs=["smooth"], params={"alpha": alpha},
          doc="Exponential moving average: a loop-carried recurrence (numba).")
    p.add(name="features", kind="preprocessing", fn=_features, inputs=["smooth", "ema"],
          doc=f"{FEATURES} features per sample from value, average and residual.")
    p.add(name="reduce", kind="other", fn=_reduce, inputs=["features"],
          doc="Per-feature mean, std, min, max and the Gram matrix.")
    return p
