"""A signal in two concurrent branches: a blockwise running sum that carries state from block to
block (loop-carried), and windowed spectra (parallel); a join sums both up.

May import: numpy, placer; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 1_000_000
BLOCK = 4096
WINDOW = 256


def _signal(size: int, seed: int):
    return np.random.default_rng(seed).normal(size=size).astype(np.float32)


def _running(signal, device):
    import torch

    out = torch.empty_like(signal)
    carry = torch.zeros((), dtype=signal.dtype, device=signal.device)
    for i in range(0, signal.shape[0], BLOCK):
        block = torch.cumsum(signal[i:i + BLOCK], 0) + carry * 0.999
        out[i:i + BLOCK] = block
        carry = block[-1]
    return out


def _spectra(signal, device):
    import torch

    n = signal.shape[0] // WINDOW * WINDOW
    w = signal[:n].reshape(-1, WINDOW) * torch.hann_window(WINDOW, device=signal.device)
    return torch.fft.rfft(w).abs().mean(0)


def _join(running, spectra, device):
    return float(running[-1]) + float(spectra.sum())


def build(size: int | None = None, *, seed: int = 0) -> Pipeline:
    n = DEFAULT_SIZE if size is None else int(size)
    if n < WINDOW:
        raise ValueError(f"two_branches pipeline: size (samples) must be at least {WINDOW}, got {n}")
    p = Pipeline("two_branches", size=n, size_unit="samples")
    p.add(name="signal", kind="other", cpu=_signal, pin="cpu", params={"size": n, "seed": seed})
    p.add(name="running", kind="preprocessing", fn=_running, inputs=["signal"])
    p.add(name="spectra", kind="preprocessing", fn=_spectra, inputs=["signal"])
    p.add(name="join", kind="other", fn=_join, inputs=["running", "spectra"])
    return p
