"""A stream of image minibatches: read → augment → train a CNN step by step → evaluate.

The standard image-training input pipeline as a stream. ``size`` colour 3×32×32
``uint8`` images of ten classes sit on the host; each epoch the source reads them
in minibatches of ``batch`` (images and labels), ``augment`` pads each image by 4
pixels, crops a random 32×32 window, flips it at random and normalises each
channel, and the ``train`` step takes one SGD step of a small CNN
(conv32-pool-conv64-pool-fc128-fc10) per batch, its model and optimizer kept
across batches and epochs. ``evaluate`` scores the trained model on a held-out set
once the stream is done.

Augmentation comes in two CPU flavours, chosen by ``augment``:

- ``python`` (default): per sample, in pure Python (lists of rows), as a
  Dataset's per-sample transforms often are: it holds the GIL, the kind of code
  that only process workers speed up, and on a CPU it costs about as much as the
  CNN step, so with ``num_workers=0`` the step waits for it;
- ``numpy``: vectorised over the batch; numpy releases the GIL, so thread workers
  run it in parallel, and it costs a tenth of the step (the step is the
  bottleneck whatever the workers);

and a torch implementation for the GPU. Crop offsets and flips are drawn from a
generator seeded by the batch's ``batch_info.seed``, so every flavour, placement
and number of workers augments each batch identically; the three implementations
scale with one float32 multiply and one subtract per value, so they agree bit for
bit.

May import: numpy, placer, pipelines.cifar_augment (the augmentation itself),
pipelines.mnist_mlp, pipelines.mnist_cnn; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from pipelines.cifar_augment import CHANNELS, PAD, SCALE, SHIFT, SIDE, augment_cpu, augment_gpu
from pipelines.mnist_cnn import cnn, exact_fp32
from pipelines.mnist_mlp import evaluate_model, render, synthetic_labels
from placer import Pipeline

DEFAULT_SIZE = 1024
HOLDOUT = 256


def _jitter(n: int, seed: int) -> np.ndarray:
    """Per image of a batch: crop offset (dy, dx) in [0, 2·PAD] and a flip flag."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(0, 2 * PAD + 1, (n, 2)), rng.integers(0, 2, (n, 1))], 1)


def _dataset(size: int, seed: int):
    labels = synthetic_labels(size, seed)
    return render(labels, CHANNELS, SIDE, seed), labels


def _holdout(seed: int):
    return _dataset(HOLDOUT, seed + 101)


def _batches(dataset, batch: int):
    images, labels = dataset
    for i in range(0, images.shape[0], batch):
        yield images[i:i + batch], labels[i:i + batch]


def _augment_numpy(batches, batch_info):
    images, labels = batches
    return augment_cpu(images, _jitter(images.shape[0], batch_info.seed)), labels


def _augment_python(batches, batch_info):
    """The same augmentation, sample by sample and row by row in pure Python."""
    images, labels = batches
    jitter = _jitter(images.shape[0], batch_info.seed).tolist()
    zero_row = [0] * (SIDE + 2 * PAD)
    out = []
    for img, (dy, dx, flip) in zip(images.tolist(), jitter):
        planes = []
        for plane in img:
            padded = [zero_row] * PAD + [[0] * PAD + row + [0] * PAD for row in plane] + [zero_row] * PAD
            rows = [r[dx:dx + SIDE] for r in padded[dy:dy + SIDE]]
            if flip:
                rows = [r[::-1] for r in rows]
            planes.append(rows)
        out.append(planes)
    x = np.asarray(out, dtype=np.float32)
    x *= SCALE[None, :, None, None]
    x -= SHIFT[None, :, None, None]
    return x, labels


def _augment_gpu(batches, batch_info, device):
    import torch

    images, labels = (torch.as_tensor(v).to(device) for v in batches)
    jitter = torch.from_numpy(_jitter(images.shape[0], batch_info.seed)).to(images.device)
    return augment_gpu(images, jitter, device), labels


def _init(device, lr: float, seed: int):
    import torch

    model = cnn(CHANNELS, SIDE, seed).to(device)
    model.train()
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
            "loss_sum": torch.zeros((), dtype=torch.float64, device=device), "samples": 0}


def _step(augment, state, device):
    import torch
    import torch.nn.functional as F

    x, y = (torch.as_tensor(v).to(device) for v in augment)
    with exact_fp32(x.device):
        loss = F.cross_entropy(state["model"](x), y.long())
        state["opt"].zero_grad(set_to_none=True)
        loss.backward()
        state["opt"].step()
    state["loss_sum"] += loss.detach().to(torch.float64) * x.shape[0]
    state["samples"] += int(x.shape[0])


def _evaluate(train, holdout, device):
    import torch

    images, labels = (np.asarray(v.cpu()) if hasattr(v, "cpu") else v for v in holdout)
    x = torch.as_tensor(_augment_numpy((images, labels), _NoJitter())[0])
    model = train["model"].to("cpu").eval()
    loss, p_true = evaluate_model(model, x, torch.as_tensor(labels))
    return {"test_loss": loss, "p_true": p_true, "train_loss": train["loss_sum"].cpu() / max(train["samples"], 1)}


class _NoJitter:
    """Held-out images are cropped the same fixed way every time (seed 0)."""

    seed = 0


def build(size: int | None = None, *, epochs: int = 2, batch: int = 64, lr: float = 0.01, seed: int = 0,
          augment: str = "python") -> Pipeline:
    """The image stream on ``size`` images per epoch (default 1,024), ``batch`` per minibatch."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"stream_images pipeline: size (images per epoch) must be at least 1, got {n}")
    if augment not in ("numpy", "python"):
        raise ValueError(f"stream_images pipeline: augment must be 'numpy' or 'python', got {augment!r}")
    p = Pipeline("stream_images", size=n, size_unit="images")
    p.add(name="dataset", kind="other", cpu=_dataset, pin="cpu", params={"size": n, "seed": seed},
          doc="Synthetic 3×32×32 uint8 images of ten classes and their labels, on the host.")
    p.add(name="holdout", kind="other", cpu=_holdout, pin="cpu", params={"seed": seed},
          doc="A held-out set of 256 images for evaluation.")
    p.source("batches", epochs=epochs, batch_size=batch, params={"batch": batch})(_batches)
    cpu_augment = _augment_numpy if augment == "numpy" else _augment_python
    p.stage("augment", kind="preprocessing", device="cpu", random=True)(cpu_augment)
    p.stage("augment", device="gpu")(_augment_gpu)
    p.step("train", init=lambda device: _init(device, lr, seed))(_step)
    p.add(name="evaluate", kind="inference", fn=_evaluate, pin="cpu", inputs=["train", "holdout"],
          doc="Cross-entropy and true-class probability of the trained model on the held-out set.")
    return p
