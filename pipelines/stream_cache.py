"""A multi-epoch stream with an expensive decode: records → decode → augment → train, where caching decides.

``size`` grey 32×32 images of ten classes are stored encoded, the way a dataset of
compressed files is: each image as the coefficients of a reversible integer Haar
transform (the S-transform, ``LEVELS`` levels). Every epoch the source reads them
in minibatches of ``batch``; ``decode`` inverts the transform exactly and runs
``passes`` passes of an integer 3×3 deblocking filter (edge pixels repeated) —
deterministic and expensive; ``augment`` flips each image horizontally at random
(seeded by the batch's ``batch_info.seed``) and normalises it — random and cheap;
the ``train`` step takes one SGD step of a 1024-128-10 MLP per batch. ``evaluate``
scores the trained model on a held-out set once the stream is done.

The decode's output is the same in every epoch, so over several epochs keeping it
after the first (``StreamConfig(cache="decode")``) removes most of the work;
``augment`` is ``random=True`` and is never cached.

``decode`` has a numpy implementation for the CPU and a torch one for the GPU;
both are the same integer arithmetic (one generic function over the two array
libraries), so they agree bit for bit. ``augment`` scales with one float32 multiply
and one subtract per value in both implementations.

May import: numpy, placer, pipelines.mnist_mlp; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from pipelines.mnist_mlp import CLASSES, evaluate_model, mlp, render, synthetic_labels
from placer import Pipeline

DEFAULT_SIZE = 2048
SIDE = 32
LEVELS = 4
HOLDOUT = 256
MEAN, STD = 0.1307, 0.3081
SCALE = np.float32(1.0 / (255.0 * STD))
SHIFT = np.float32(MEAN / STD)


# -- the integer transform, generic over numpy and torch ---------------------------------------
class _Numpy:
    cat = staticmethod(lambda parts, axis: np.concatenate(parts, axis=axis))
    empty_like = staticmethod(np.empty_like)


class _Torch:
    @staticmethod
    def cat(parts, axis):
        import torch

        return torch.cat(parts, dim=axis)

    @staticmethod
    def empty_like(x):
        import torch

        return torch.empty_like(x)


def _forward_1d(x, xp):
    """S-transform along the last axis: (low, high) halves, low = ⌊(a + b) / 2⌋, high = a − b."""
    a, b = x[..., 0::2], x[..., 1::2]
    return xp.cat([(a + b) // 2, a - b], -1)


def _inverse_1d(c, xp):
    m = c.shape[-1] // 2
    low, high = c[..., :m], c[..., m:]
    a = low + (high + 1) // 2
    out = xp.empty_like(c)
    out[..., 0::2] = a
    out[..., 1::2] = a - high
    return out


def encode(images: np.ndarray, levels: int = LEVELS) -> np.ndarray:
    """int32 Haar coefficients of uint8 images ``(n, side, side)`` (the top-left corner is coarsest)."""
    c = images.astype(np.int32)
    side = c.shape[-1]
    for lv in range(levels):
        s = side >> lv
        block = c[..., :s, :s]
        block = _forward_1d(block, _Numpy)
        block = _forward_1d(block.swapaxes(-1, -2), _Numpy).swapaxes(-1, -2)
        c[..., :s, :s] = block
    return c


def _decode(coeffs, passes: int, xp):
    c = coeffs.clone() if hasattr(coeffs, "clone") else coeffs.copy()
    side = c.shape[-1]
    for lv in reversed(range(LEVELS)):
        s = side >> lv
        block = _inverse_1d(c[..., :s, :s].swapaxes(-1, -2), xp).swapaxes(-1, -2)
        c[..., :s, :s] = _inverse_1d(block, xp)
    for _ in range(passes):
        c = _deblock(c, xp)
    return c


def _deblock(x, xp):
    """⌊(3×3 neighbourhood sum + 4) / 9⌋, edge pixels repeated."""
    rows = xp.cat([x[..., :1, :], x, x[..., -1:, :]], -2)
    rows = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]
    cols = xp.cat([rows[..., :, :1], rows, rows[..., :, -1:]], -1)
    return (cols[..., :, :-2] + cols[..., :, 1:-1] + cols[..., :, 2:] + 4) // 9


# -- stages -------------------------------------------------------------------------------------
def _dataset(size: int, seed: int):
    """Encoded training images and labels, and a held-out set drawn from the same classes."""
    labels = synthetic_labels(size + HOLDOUT, seed)
    coeffs = encode(render(labels, 1, SIDE, seed)[:, 0])
    return {"coeffs": coeffs[:size], "labels": labels[:size],
            "holdout": coeffs[size:], "holdout_labels": labels[size:]}


def _records(dataset, batch: int):
    coeffs, labels = dataset["coeffs"], dataset["labels"]
    for i in range(0, coeffs.shape[0], batch):
        yield coeffs[i:i + batch], labels[i:i + batch]


def _decode_cpu(records, passes: int):
    coeffs, labels = records
    return _decode(coeffs, passes, _Numpy).astype(np.uint8), labels


def _decode_gpu(records, passes: int, device):
    import torch

    coeffs, labels = (torch.as_tensor(v).to(device) for v in records)
    return _decode(coeffs, passes, _Torch).to(torch.uint8), labels


def _flips(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, n).astype(bool)


def _augment_cpu(decode, batch_info):
    images, labels = decode
    flip = _flips(images.shape[0], batch_info.seed)
    x = np.where(flip[:, None, None], images[:, :, ::-1], images).astype(np.float32)
    x *= SCALE
    x -= SHIFT
    return x.reshape(x.shape[0], -1), labels


def _augment_gpu(decode, batch_info, device):
    import torch

    images, labels = (torch.as_tensor(v).to(device) for v in decode)
    flip = torch.from_numpy(_flips(images.shape[0], batch_info.seed)).to(images.device)
    x = torch.where(flip[:, None, None], images.flip(-1), images).to(torch.float32)
    x *= torch.tensor(SCALE, device=x.device)
    x -= torch.tensor(SHIFT, device=x.device)
    return x.reshape(x.shape[0], -1), labels


def _init(device, lr: float, seed: int):
    import torch

    model = mlp([SIDE * SIDE, 128, CLASSES], seed).to(device)
    model.train()
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
            "loss_sum": torch.zeros((), dtype=torch.float64, device=device), "samples": 0}


def _step(augment, state, device):
    import torch
    import torch.nn.functional as F

    x, y = (torch.as_tensor(v).to(device) for v in augment)
    loss = F.cross_entropy(state["model"](x), y.long())
    state["opt"].zero_grad(set_to_none=True)
    loss.backward()
    state["opt"].step()
    state["loss_sum"] += loss.detach().to(torch.float64) * x.shape[0]
    state["samples"] += int(x.shape[0])


def _evaluate(train, dataset, passes: int):
    import torch

    images = _decode(np.asarray(dataset["holdout"]), passes, _Numpy)
    labels = np.asarray(dataset["holdout_labels"])
    x = torch.from_numpy((images.astype(np.uint8).astype(np.float32) * SCALE - SHIFT).reshape(images.shape[0], -1))
    model = train["model"].to("cpu").eval()
    loss, p_true = evaluate_model(model, x, torch.as_tensor(labels))
    return {"test_loss": loss, "p_true": p_true, "train_loss": train["loss_sum"].cpu() / max(train["samples"], 1)}


def build(size: int | None = None, *, epochs: int = 3, batch: int = 64, passes: int = 6, lr: float = 0.01,
          seed: int = 0) -> Pipeline:
    """The cached-decode stream on ``size`` images per epoch (default 2,048), ``batch`` per minibatch."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"stream_cache pipeline: size (images per epoch) must be at least 1, got {n}")
    if passes < 0:
        raise ValueError(f"stream_cache pipeline: passes must be at least 0, got {passes}")
    p = Pipeline("stream_cache", size=n, size_unit="images")
    p.add(name="dataset", kind="other", cpu=_dataset, pin="cpu", params={"size": n, "seed": seed},
          doc="Synthetic 32×32 images of ten classes stored as integer Haar coefficients, their labels, "
              "and 256 held-out ones.")
    p.source("records", epochs=epochs, batch_size=batch, params={"batch": batch})(_records)
    p.stage("decode", kind="preprocessing", device="cpu", params={"passes": passes})(_decode_cpu)
    p.stage("decode", device="gpu")(_decode_gpu)
    p.stage("augment", kind="preprocessing", device="cpu", random=True)(_augment_cpu)
    p.stage("augment", device="gpu")(_augment_gpu)
    p.step("train", init=lambda device: _init(device, lr, seed))(_step)
    p.add(name="evaluate", kind="inference", fn=_evaluate, pin="cpu", inputs=["train", "dataset"],
          params={"passes": passes}, doc="Cross-entropy and true-class probability on the decoded held-out set.")
    return p
