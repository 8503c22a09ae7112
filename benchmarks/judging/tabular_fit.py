"""Tabular cleaning then training, as a user writes it: a float table with gaps → clean → crossed
features → an MLP fitted by full-batch Adam (many small steps) → scores.

May import: numpy, placer; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 100_000
COLS = 24


def _table(size: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, COLS)).astype(np.float32)
    x[rng.random((size, COLS)) < 0.02] = np.nan
    return x


def _target(table, seed: int):
    w = np.random.default_rng(seed + 1).normal(size=COLS).astype(np.float32)
    return (np.nan_to_num(table) @ w > 0).astype(np.int64)


def _clean(table, device):
    import torch

    x = torch.nan_to_num(table, nan=0.0).clamp(-4, 4)
    return (x - x.mean(0)) / (x.std(0) + 1e-6)


def _cross(clean, device):
    import torch

    a = clean[:, :8]
    pairs = (a[:, :, None] * a[:, None, :]).flatten(1)
    return torch.cat([clean, pairs], 1)


def _fit(cross, target, device, steps: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(cross.shape[1], 64), nn.ReLU(), nn.Linear(64, 2)).to(cross.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    y = target.to(cross.device)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(cross), y).backward()
        opt.step()
    return model


def _score(cross, fit, device):
    import torch

    with torch.no_grad():
        return fit(cross).softmax(1)[:, 1]


def build(size: int | None = None, *, steps: int = 30, seed: int = 0) -> Pipeline:
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 2:
        raise ValueError(f"tabular_fit pipeline: size (rows) must be at least 2, got {n}")
    p = Pipeline("tabular_fit", size=n, size_unit="rows")
    p.add(name="table", kind="other", cpu=_table, pin="cpu", params={"size": n, "seed": seed})
    p.add(name="target", kind="other", cpu=_target, pin="cpu", inputs=["table"], params={"seed": seed})
    p.add(name="clean", kind="cleaning", fn=_clean, inputs=["table"])
    p.add(name="cross", kind="preprocessing", fn=_cross, inputs=["clean"])
    p.add(name="fit", kind="training", fn=_fit, inputs=["cross", "target"], params={"steps": steps})
    p.add(name="score", kind="inference", fn=_score, inputs=["cross", "fit"])
    return p
