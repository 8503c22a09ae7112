"""CIFAR-style training with data augmentation: images → augment → train a CNN → evaluate.

Models the standard image-classification input pipeline: ``size`` colour 3×32×32
``uint8`` images of ten classes arrive on the host, each is augmented (zero-pad
by 4 pixels, crop a random 32×32 window, flip horizontally at random, convert to
float and normalise each channel with CIFAR-10's mean and standard deviation), and
a small CNN (conv32-pool-conv64-pool-fc128-fc10) is trained by SGD on the first
80 %; the held-out 20 % (augmented the same way) are scored.

The random crop offsets and flips are drawn by the ``jitter`` stage from a seeded
generator, before augmentation, so the augmentation itself is a pure function of
its inputs. Augmentation has two implementations with identical semantics: a
vectorised numpy one for the CPU (declared ``data_parallel``, so the executor
splits it into row partitions on several cores) and a torch one for the GPU. Both
scale with one float32 multiply and one subtract per value, so they agree bit for
bit.

May import: numpy, placer, pipelines.mnist_mlp, pipelines.mnist_cnn; torch inside
the stage functions.
"""

from __future__ import annotations

import numpy as np

from pipelines.mnist_cnn import cnn, exact_fp32
from pipelines.mnist_mlp import evaluate_model, fit, render, split, synthetic_labels
from placer import Pipeline

DEFAULT_SIZE = 1024
SIDE = 32
PAD = 4
CHANNELS = 3
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
#: per channel: value = uint8 * SCALE - SHIFT  ==  (uint8 / 255 - mean) / std
SCALE = np.array([1.0 / (255.0 * s) for s in CIFAR_STD], dtype=np.float32)
SHIFT = np.array([m / s for m, s in zip(CIFAR_MEAN, CIFAR_STD)], dtype=np.float32)


def _labels(size: int, seed: int):
    return synthetic_labels(size, seed)


def _images(labels, seed: int):
    return render(labels, CHANNELS, SIDE, seed)


def _jitter(size: int, seed: int):
    """Per image: crop offset (dy, dx) in [0, 2·PAD] and a flip flag (0 or 1)."""
    rng = np.random.default_rng(seed + 2)
    offsets = rng.integers(0, 2 * PAD + 1, (size, 2))
    flips = rng.integers(0, 2, (size, 1))
    return np.concatenate([offsets, flips], 1).astype(np.int64)


def augment_cpu(images, jitter):
    """Pad, crop at each image's offset, flip where its flag says, to float, normalise (numpy)."""
    n = images.shape[0]
    padded = np.pad(images, ((0, 0), (0, 0), (PAD, PAD), (PAD, PAD)))
    ar = np.arange(SIDE)
    rows = jitter[:, 0, None] + ar
    cols = jitter[:, 1, None] + np.where(jitter[:, 2, None] == 1, SIDE - 1 - ar, ar)
    crop = padded[np.arange(n)[:, None, None, None], np.arange(CHANNELS)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]
    x = crop.astype(np.float32)
    x *= SCALE[None, :, None, None]
    x -= SHIFT[None, :, None, None]
    return x


def augment_gpu(images, jitter, device):
    """:func:`augment_cpu` in torch, on the tensors' device."""
    import torch
    import torch.nn.functional as F

    n, dev = images.shape[0], images.device
    padded = F.pad(images, (PAD, PAD, PAD, PAD))
    ar = torch.arange(SIDE, device=dev)
    rows = jitter[:, 0, None] + ar
    cols = jitter[:, 1, None] + torch.where(jitter[:, 2, None] == 1, SIDE - 1 - ar, ar)
    crop = padded[torch.arange(n, device=dev)[:, None, None, None],
                  torch.arange(CHANNELS, device=dev)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]
    x = crop.to(torch.float32)
    x *= torch.from_numpy(SCALE).to(dev)[None, :, None, None]
    x -= torch.from_numpy(SHIFT).to(dev)[None, :, None, None]
    return x


def _train(augment, labels, device, epochs: int, batch: int, lr: float, seed: int):
    n_train = split(augment.shape[0])
    model = cnn(CHANNELS, SIDE, seed).to(augment.device)
    with exact_fp32(augment.device):
        model, losses = fit(model, augment[:n_train], labels[:n_train], epochs=epochs, batch=batch,
                            lr=lr, seed=seed)
    return {"model": model, "train_loss": losses}


def _evaluate(augment, labels, train, device):
    n_train = split(augment.shape[0])
    with exact_fp32(augment.device):
        loss, p_true = evaluate_model(train["model"], augment[n_train:], labels[n_train:])
    return {"test_loss": loss, "p_true": p_true, "train_loss": train["train_loss"]}


def build(size: int | None = None, *, epochs: int = 1, batch: int = 64, lr: float = 0.01,
          seed: int = 0) -> Pipeline:
    """The CIFAR augmentation + CNN pipeline on ``size`` images (default 1,024)."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 2:
        raise ValueError(f"cifar_augment pipeline: size (images) must be at least 2 (one to train on, one to evaluate), got {n}")
    p = Pipeline("cifar_augment", size=n, size_unit="images")
    p.add(name="labels", kind="other", cpu=_labels, pin="cpu", params={"size": n, "seed": seed},
          doc="Seeded class labels.")
    p.add(name="images", kind="other", cpu=_images, pin="cpu", inputs=["labels"],
          params={"seed": seed}, doc="Synthetic 3×32×32 uint8 images of those classes, on the host.")
    p.add(name="jitter", kind="other", cpu=_jitter, pin="cpu", params={"size": n, "seed": seed},
          doc="Seeded crop offsets and flip flags, one row per image.")
    p.add(name="augment", kind="preprocessing", cpu=augment_cpu, gpu=augment_gpu,
          inputs=["images", "jitter"], data_parallel=True,
          doc="Pad 4, crop 32×32, flip, to float, normalise per channel.")
    p.add(name="train", kind="training", fn=_train, inputs=["augment", "labels"],
          params={"epochs": epochs, "batch": batch, "lr": lr, "seed": seed},
          doc="SGD of conv32-pool-conv64-pool-fc128-fc10 on the first 80 %.")
    p.add(name="evaluate", kind="inference", fn=_evaluate, inputs=["augment", "labels", "train"],
          doc="Cross-entropy and true-class probability on the held-out 20 %.")
    return p
