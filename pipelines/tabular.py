"""Tabular classification: load → clean → features → train an MLP → predict.

Models the everyday tabular job: a table of ``size`` rows × 16 float columns with
missing values (NaN) and outliers is cleaned (NaN → 0, clamp to ±5 standard units,
standardise columns), expanded with all pairwise column products, used to train a
small MLP (152-64-2) by mini-batch SGD on the first 80 % of rows, and the model
predicts the held-out 20 %. Everything is seeded: every placement gives the same
predictions (see placer.digest for the tolerance).

Every stage is one device-agnostic torch function, so any stage can run on the CPU
or a GPU.
"""

from __future__ import annotations

from placer import Pipeline

DEFAULT_SIZE = 20_000
COLUMNS = 16


def _load(device, size: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, COLUMNS, generator=g)
    w = torch.randn(COLUMNS, generator=g)
    y = ((x @ w + 0.5 * torch.randn(size, generator=g)) > 0).to(torch.int64)
    x = x * torch.linspace(0.5, 4.0, COLUMNS) + torch.linspace(-2.0, 2.0, COLUMNS)
    missing = torch.rand(size, COLUMNS, generator=g) < 0.05
    x[missing] = float("nan")
    outliers = torch.rand(size, COLUMNS, generator=g) < 0.01
    x[outliers] *= 100.0
    return {"x": x.to(device), "y": y.to(device)}


def _clean(load, device):
    import torch

    x = torch.nan_to_num(load["x"], nan=0.0)
    mean = x.mean(0, keepdim=True)
    std = x.std(0, keepdim=True).clamp_min(1e-6)
    z = ((x - mean) / std).clamp(-5.0, 5.0)
    z = (z - z.mean(0, keepdim=True)) / z.std(0, keepdim=True).clamp_min(1e-6)
    return {"x": z, "y": load["y"]}


def _features(clean, device):
    import torch

    x = clean["x"]
    i, j = torch.triu_indices(COLUMNS, COLUMNS, device=x.device)
    cross = x[:, i] * x[:, j]
    return {"x": torch.cat([x, cross], 1).contiguous(), "y": clean["y"]}


def _train(features, device, epochs: int, batch: int, lr: float, seed: int):
    import torch
    import torch.nn.functional as F

    x, y = features["x"], features["y"]
    n_train = int(0.8 * x.shape[0])
    g = torch.Generator().manual_seed(seed)
    d_in = x.shape[1]
    params = {
        "w1": (torch.randn(d_in, 64, generator=g) / d_in**0.5),
        "b1": torch.zeros(64),
        "w2": (torch.randn(64, 2, generator=g) / 8.0),
        "b2": torch.zeros(2),
    }
    params = {k: v.to(x.device).requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.SGD(params.values(), lr=lr, momentum=0.9)
    for _ in range(epochs):
        for s in range(0, n_train, batch):
            xb, yb = x[s : min(s + batch, n_train)], y[s : min(s + batch, n_train)]
            logits = torch.relu(xb @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
            loss = F.cross_entropy(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return {k: v.detach() for k, v in params.items()}


def _predict(features, train, device):
    import torch

    x, y = features["x"], features["y"]
    n_train = int(0.8 * x.shape[0])
    xt = x[n_train:]
    logits = torch.relu(xt @ train["w1"] + train["b1"]) @ train["w2"] + train["b2"]
    prob = torch.softmax(logits, 1)[:, 1]
    label = (prob > 0.5).to(torch.int64)
    accuracy = (label == y[n_train:]).to(torch.float64).mean()
    return {"label": label, "prob": prob, "accuracy": accuracy}


def build(size: int | None = None, *, epochs: int = 3, batch: int = 1024, lr: float = 0.05, seed: int = 0) -> Pipeline:
    """The tabular pipeline at ``size`` rows (default 20,000)."""
    n = int(size or DEFAULT_SIZE)
    if n < 10:
        raise ValueError(f"tabular pipeline: size must be at least 10 rows, got {n}")
    p = Pipeline("tabular", size=n)
    p.add(name="load", kind="cleaning", fn=_load, params={"size": n, "seed": seed},
          doc="Synthetic table with NaNs and outliers.")
    p.add(name="clean", kind="cleaning", fn=_clean, inputs=["load"],
          doc="NaN to 0, clamp outliers, standardise.")
    p.add(name="features", kind="preprocessing", fn=_features, inputs=["clean"],
          doc="Columns plus all pairwise products.")
    p.add(name="train", kind="training", fn=_train, inputs=["features"],
          params={"epochs": epochs, "batch": batch, "lr": lr, "seed": seed},
          doc="Mini-batch SGD of a 152-64-2 MLP.")
    p.add(name="predict", kind="inference", fn=_predict, inputs=["features", "train"],
          doc="Predict the held-out rows.")
    return p
