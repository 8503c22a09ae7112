"""The reference ops: small torch programs timed on every machine a target describes.

May import: torch (inside the functions; importing this module stays cheap).

The same ops (and sizes) as the H200 reference measurements
(``h200-calibration.json``): tabular ops on a float32 matrix of ``n`` rows × 16
columns with some NaNs, image augmentation of ``n`` uint8 3×32×32 images, and train
steps and inference of small MLPs and CNNs at batch ``n``. Each ``OPS[name](n)``
builds its inputs and returns a no-argument callable that runs the op once on the
CPU (or, with ``device``, on that torch device).

:data:`CALIBRATION` is the short list of (op, size) a calibration times: small
dispatch-bound calls and larger throughput-bound ones, about a second in all on a
laptop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _table(n, device):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    x[::7, 3] = float("nan")
    return x.to(device)


def clean_standardize(n, device="cpu"):
    import torch

    x = _table(n, device)
    return lambda: ((torch.nan_to_num(x).clamp(-5, 5)) - x.nanmean(0)) / x.std(0)


def filter_rows(n, device="cpu"):
    x = _table(n, device)
    return lambda: x[x[:, 0] > 0]


def sort_column(n, device="cpu"):
    import torch

    x = _table(n, device)
    return lambda: torch.sort(x[:, 1])


def groupby_sum(n, device="cpu"):
    import torch

    x = _table(n, device)
    key = torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(1)).to(device)
    return lambda: torch.zeros(1000, 16, device=device).index_add_(0, key, x)


def feature_cross(n, device="cpu"):
    x = _table(n, device)
    return lambda: (x.unsqueeze(2) * x.unsqueeze(1)).sum((1, 2))


def image_augment(n, device="cpu"):
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(2)
    imgs = torch.randint(0, 255, (n, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)
    mean = torch.tensor([0.5, 0.5, 0.5], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.25] * 3, device=device).view(1, 3, 1, 1)

    def f():
        p = F.pad(imgs, (4, 4, 4, 4))
        c = p[:, :, 2:34, 3:35].clone()
        c[::2] = c[::2].flip(3)
        return (c.float() / 255 - mean) / std

    return f


def mlp():
    import torch.nn as nn

    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def cnn(ch, hw):
    import torch.nn as nn

    flat = 64 * (((hw - 2) // 2 - 2) // 2) ** 2
    return nn.Sequential(
        nn.Conv2d(ch, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def train(model, x, y):
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def f():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return f


def infer(model, x):
    import torch

    model.eval()

    def f():
        with torch.no_grad():
            return model(x)

    return f


def _inputs(n, shape, device, classes=10):
    import torch

    g = torch.Generator().manual_seed(3)
    return torch.randn(n, *shape, generator=g).to(device), torch.randint(0, classes, (n,), generator=g).to(device)


def mlp_train_step(n, device="cpu"):
    x, y = _inputs(n, (784,), device)
    return train(mlp().to(device), x, y)


def cnn_mnist_train_step(n, device="cpu"):
    x, y = _inputs(n, (1, 28, 28), device)
    return train(cnn(1, 28).to(device), x, y)


def cnn_cifar_train_step(n, device="cpu"):
    x, y = _inputs(n, (3, 32, 32), device)
    return train(cnn(3, 32).to(device), x, y)


def mlp_infer(n, device="cpu"):
    return infer(mlp().to(device), _inputs(n, (784,), device)[0])


def cnn_cifar_infer(n, device="cpu"):
    return infer(cnn(3, 32).to(device), _inputs(n, (3, 32, 32), device)[0])


OPS: dict[str, Callable[..., Callable[[], Any]]] = {
    "clean_standardize": clean_standardize,
    "filter_rows": filter_rows,
    "sort_column": sort_column,
    "groupby_sum": groupby_sum,
    "feature_cross": feature_cross,
    "image_augment": image_augment,
    "mlp_train_step": mlp_train_step,
    "cnn_mnist_train_step": cnn_mnist_train_step,
    "cnn_cifar_train_step": cnn_cifar_train_step,
    "mlp_infer": mlp_infer,
    "cnn_cifar_infer": cnn_cifar_infer,
}

#: (op, size) pairs a calibration times: dispatch-bound, middling and throughput-bound calls
CALIBRATION: tuple[tuple[str, int], ...] = (
    ("clean_standardize", 100), ("filter_rows", 1000), ("sort_column", 1000), ("groupby_sum", 1000),
    ("feature_cross", 1000), ("mlp_infer", 1), ("mlp_infer", 8), ("image_augment", 16),
    ("mlp_infer", 64), ("image_augment", 256), ("mlp_train_step", 1), ("mlp_train_step", 32),
    ("clean_standardize", 10000), ("groupby_sum", 10000), ("filter_rows", 100000), ("groupby_sum", 100000),
    ("mlp_infer", 512), ("sort_column", 100000), ("clean_standardize", 100000), ("feature_cross", 100000),
)
