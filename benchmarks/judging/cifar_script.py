"""A CIFAR training script as a user writes it: uint8 images → augment → a small CNN trained by SGD → accuracy.

Every stage is one device-agnostic torch function (``fn(..., device)``). The CNN
(conv16-BN-pool-conv32-BN-pool-linear) is trained with SGD and momentum for one
epoch at batch 128 on the first 80 % of the images; the rest are scored.

May import: numpy, placer; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 4096


def _images(size: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size, 3, 32, 32), dtype=np.uint8)


def _labels(size: int, seed: int):
    return np.random.default_rng(seed + 1).integers(0, 10, size).astype(np.int64)


def _augment(images, device):
    import torch
    import torch.nn.functional as F

    x = images.to(torch.float32) / 255.0
    x[1::2] = x[1::2].flip(-1)
    x = F.pad(x, (4, 4, 4, 4))[:, :, 2:34, 6:38]
    mean = torch.tensor([0.49, 0.48, 0.45], device=x.device)[None, :, None, None]
    std = torch.tensor([0.25, 0.24, 0.26], device=x.device)[None, :, None, None]
    return (x - mean) / std


def _net(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def _train(augment, labels, device, batch: int, seed: int):
    import torch

    n = int(augment.shape[0] * 0.8)
    model = _net(seed).to(augment.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    y = labels.to(augment.device)
    for i in range(0, n, batch):
        opt.zero_grad()
        loss = loss_fn(model(augment[i:i + batch]), y[i:i + batch])
        loss.backward()
        opt.step()
    return model


def _accuracy(augment, labels, train, device):
    import torch

    n = int(augment.shape[0] * 0.8)
    with torch.no_grad():
        train.eval()
        pred = train(augment[n:]).argmax(1)
    return float((pred.cpu() == labels[n:].cpu()).float().mean())


def build(size: int | None = None, *, batch: int = 128, seed: int = 0) -> Pipeline:
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 10:
        raise ValueError(f"cifar_script pipeline: size (images) must be at least 10, got {n}")
    p = Pipeline("cifar_script", size=n, size_unit="images")
    p.add(name="images", kind="other", cpu=_images, pin="cpu", params={"size": n, "seed": seed})
    p.add(name="labels", kind="other", cpu=_labels, pin="cpu", params={"size": n, "seed": seed})
    p.add(name="augment", kind="preprocessing", fn=_augment, inputs=["images"])
    p.add(name="train", kind="training", fn=_train, inputs=["augment", "labels"],
          params={"batch": batch, "seed": seed})
    p.add(name="accuracy", kind="inference", fn=_accuracy, inputs=["augment", "labels", "train"])
    return p
