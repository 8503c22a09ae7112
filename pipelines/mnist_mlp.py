"""MNIST-style digit classification with an MLP: load → normalise → train → evaluate.

Models the classic first training job: ``size`` grey 28×28 ``uint8`` images of ten
classes arrive on the host; they are scaled to [0, 1] and standardised with
MNIST's mean and standard deviation and flattened to 784 features; a
784-512-512-10 ReLU MLP is trained by mini-batch SGD with momentum on the first
80 % of the images; the held-out 20 % are scored (mean cross-entropy and the
probability the model gives the true class of each image).

The images are synthetic but shaped like MNIST: each class has a fixed smooth
stroke pattern, and every image is its class's pattern at a random intensity
plus noise, so the model has something to learn. Everything is seeded, and
every placement gives the same outputs (see :mod:`placer.digest`).

``load`` is pinned to the CPU (data arrives on the host); every other stage is
one device-agnostic torch function. :mod:`pipelines.mnist_cnn` reuses ``load``,
``normalise`` and ``evaluate`` with a small CNN.

May import: numpy, placer; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 8192
SIDE = 28
CLASSES = 10
MEAN, STD = 0.1307, 0.3081


def class_patterns(side: int, channels: int, seed: int) -> np.ndarray:
    """One smooth pattern per class, values in [0, 1], shape ``(10, channels, side, side)``."""
    rng = np.random.default_rng(seed + 10_000)
    yy, xx = np.mgrid[0:side, 0:side] / (side - 1)
    out = np.zeros((CLASSES, channels, side, side))
    for c in range(CLASSES):
        for ch in range(channels):
            strokes = np.zeros((side, side))
            for _ in range(3):
                cy, cx = rng.uniform(0.2, 0.8, 2)
                sy, sx = rng.uniform(0.05, 0.25, 2)
                strokes += np.exp(-(((yy - cy) / sy) ** 2 + ((xx - cx) / sx) ** 2))
            out[c, ch] = strokes / strokes.max()
    return out


def synthetic_labels(n: int, seed: int) -> np.ndarray:
    """``n`` seeded int64 class labels."""
    return np.random.default_rng(seed).integers(0, CLASSES, n).astype(np.int64)


def render(labels: np.ndarray, channels: int, side: int, seed: int) -> np.ndarray:
    """Seeded uint8 images ``(n, channels, side, side)`` of the given classes."""
    n = labels.shape[0]
    rng = np.random.default_rng(seed + 1)
    patterns = class_patterns(side, channels, seed)
    gain = rng.uniform(150.0, 255.0, (n, 1, 1, 1)).astype(np.float32)
    noise = rng.standard_normal((n, channels, side, side), dtype=np.float32)
    noise *= 30.0
    noise += patterns.astype(np.float32)[labels] * gain
    return np.clip(noise, 0, 255).astype(np.uint8)


def synthetic_images(n: int, channels: int, side: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` seeded uint8 images ``(n, channels, side, side)`` and their int64 labels."""
    labels = synthetic_labels(n, seed)
    return render(labels, channels, side, seed), labels


def _load(size: int, seed: int):
    images, labels = synthetic_images(size, 1, SIDE, seed)
    return {"images": images[:, 0], "labels": labels}


def _normalise(load, device):
    import torch

    x = load["images"].to(torch.float32) / 255.0
    x = (x - MEAN) / STD
    return {"x": x.reshape(x.shape[0], -1).contiguous(), "y": load["labels"]}


def mlp(dims: list[int], seed: int):
    """A seeded ReLU MLP with layer sizes ``dims`` (created on the CPU)."""
    import torch

    torch_gen = torch.Generator().manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        lin = torch.nn.Linear(a, b)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=torch_gen) * (2.0 / a) ** 0.5)
            lin.bias.zero_()
        layers.append(lin)
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def fit(model, x, y, *, epochs: int, batch: int, lr: float, seed: int):
    """Train ``model`` on ``(x, y)`` by SGD with momentum in a seeded batch order.

    Returns the model (in eval mode) and the mean training loss of each epoch as a
    float64 tensor on ``x``'s device.
    """
    import torch
    import torch.nn.functional as F

    n = x.shape[0]
    g = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(n, generator=g).to(x.device)
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for s in range(0, n, batch):
            idx = order[s : s + batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach().to(torch.float64) * idx.numel()
        losses.append(total / n)
    model.eval()
    if not losses:
        return model, torch.zeros(0, dtype=torch.float64, device=x.device)
    return model, torch.stack(losses)


def split(n: int) -> int:
    """Rows used for training (the first 80 %)."""
    return max(1, int(0.8 * n))


def _train(normalise, device, epochs: int, batch: int, lr: float, seed: int):
    x, y = normalise["x"], normalise["y"]
    n_train = split(x.shape[0])
    model = mlp([SIDE * SIDE, 512, 512, CLASSES], seed).to(x.device)
    model, losses = fit(model, x[:n_train], y[:n_train], epochs=epochs, batch=batch, lr=lr, seed=seed)
    return {"model": model, "train_loss": losses}


def evaluate_model(model, x, y):
    """Mean cross-entropy and each row's probability of its true class."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        p_true = torch.softmax(logits, 1).gather(1, y[:, None])[:, 0]
    return loss, p_true


def _evaluate(normalise, train, device):
    x, y = normalise["x"], normalise["y"]
    n_train = split(x.shape[0])
    loss, p_true = evaluate_model(train["model"], x[n_train:], y[n_train:])
    return {"test_loss": loss, "p_true": p_true, "train_loss": train["train_loss"]}


def build(size: int | None = None, *, epochs: int = 1, batch: int = 128, lr: float = 0.01,
          seed: int = 0) -> Pipeline:
    """The MNIST MLP pipeline on ``size`` images (default 8,192)."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 2:
        raise ValueError(f"mnist_mlp pipeline: size (images) must be at least 2 (one to train on, one to evaluate), got {n}")
    p = Pipeline("mnist_mlp", size=n, size_unit="images")
    p.add(name="load", kind="other", cpu=_load, pin="cpu", params={"size": n, "seed": seed},
          doc="Synthetic 28×28 uint8 digits and labels, on the host.")
    p.add(name="normalise", kind="preprocessing", fn=_normalise, inputs=["load"],
          doc="Scale to [0, 1], standardise, flatten to 784.")
    p.add(name="train", kind="training", fn=_train, inputs=["normalise"],
          params={"epochs": epochs, "batch": batch, "lr": lr, "seed": seed},
          doc="SGD of a 784-512-512-10 MLP on the first 80 %.")
    p.add(name="evaluate", kind="inference", fn=_evaluate, inputs=["normalise", "train"],
          doc="Cross-entropy and true-class probability on the held-out 20 %.")
    return p
