"""MNIST-style digit classification with a small CNN: load → normalise → train → evaluate.

The same job as :mod:`pipelines.mnist_mlp` (the same synthetic 28×28 digits,
normalisation and held-out scoring), with the model swapped for a small
convolutional network: conv(32, 3×3)-ReLU-maxpool-conv(64, 3×3)-ReLU-maxpool-
linear(128)-ReLU-linear(10), trained by SGD with momentum. Convolutions make the
training stage far more compute-heavy per image than the MLP's, which moves the
point at which a GPU pays off.

On a GPU, convolutions run with cuDNN's TF32 mode off, so results agree with the
CPU within :mod:`placer.digest`'s tolerance.

May import: numpy, placer, pipelines.mnist_mlp; torch inside the stage functions.
"""

from __future__ import annotations

import contextlib

from pipelines.mnist_mlp import CLASSES, MEAN, SIDE, STD, _load, evaluate_model, fit, split
from placer import Pipeline

DEFAULT_SIZE = 1024


def cnn(in_channels: int, side: int, seed: int):
    """The seeded small CNN for ``in_channels`` × ``side`` × ``side`` images."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    flat = 64 * (((side - 2) // 2 - 2) // 2) ** 2
    model = nn.Sequential(
        nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, CLASSES),
    )
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                m.bias.zero_()
    return model


def exact_fp32(device):
    """A context that turns off TF32 convolutions on a CUDA device (a no-op elsewhere)."""
    import torch

    if getattr(device, "type", "cpu") != "cuda":
        return contextlib.nullcontext()
    return torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False)


def _normalise(load, device):
    import torch

    x = load["images"].to(torch.float32) / 255.0
    x = (x - MEAN) / STD
    return {"x": x[:, None].contiguous(), "y": load["labels"]}


def _train(normalise, device, epochs: int, batch: int, lr: float, seed: int):
    x, y = normalise["x"], normalise["y"]
    n_train = split(x.shape[0])
    model = cnn(1, SIDE, seed).to(x.device)
    with exact_fp32(x.device):
        model, losses = fit(model, x[:n_train], y[:n_train], epochs=epochs, batch=batch, lr=lr, seed=seed)
    return {"model": model, "train_loss": losses}


def _evaluate(normalise, train, device):
    x, y = normalise["x"], normalise["y"]
    n_train = split(x.shape[0])
    with exact_fp32(x.device):
        loss, p_true = evaluate_model(train["model"], x[n_train:], y[n_train:])
    return {"test_loss": loss, "p_true": p_true, "train_loss": train["train_loss"]}


def build(size: int | None = None, *, epochs: int = 1, batch: int = 64, lr: float = 0.01,
          seed: int = 0) -> Pipeline:
    """The MNIST CNN pipeline on ``size`` images (default 1,024)."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 2:
        raise ValueError(f"mnist_cnn pipeline: size (images) must be at least 2 (one to train on, one to evaluate), got {n}")
    p = Pipeline("mnist_cnn", size=n, size_unit="images")
    p.add(name="load", kind="other", cpu=_load, pin="cpu", params={"size": n, "seed": seed},
          doc="Synthetic 28×28 uint8 digits and labels, on the host.")
    p.add(name="normalise", kind="preprocessing", fn=_normalise, inputs=["load"],
          doc="Scale to [0, 1], standardise, add the channel axis.")
    p.add(name="train", kind="training", fn=_train, inputs=["normalise"],
          params={"epochs": epochs, "batch": batch, "lr": lr, "seed": seed},
          doc="SGD of conv32-pool-conv64-pool-fc128-fc10 on the first 80 %.")
    p.add(name="evaluate", kind="inference", fn=_evaluate, inputs=["normalise", "train"],
          doc="Cross-entropy and true-class probability on the held-out 20 %.")
    return p
