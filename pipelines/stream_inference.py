"""Batched inference over a stream of requests: train once → requests → preprocess → predict → summarise.

Models a model server's input pipeline. A 784-128-10 ReLU MLP is trained once
(``model``, a one-shot stage pinned to the CPU) on synthetic 28×28 digits; a log
of ``size`` requests (grey ``uint8`` digits, with their true classes kept aside) is
read by the source in batches of ``batch``; ``preprocess`` scales each batch to
MNIST's standard units and flattens it to 784 features; the ``predict`` step (an
inference step without ``init``) returns each batch's predicted classes and their
probabilities, in order; ``summary`` joins them and reports the class counts,
the mean confidence and the accuracy against the true classes.

``preprocess`` has a numpy implementation for the CPU and a torch one for the GPU;
both scale with one float32 multiply and one subtract per value, so they agree bit
for bit. ``predict`` is one device-agnostic torch function; the trained model is a
one-shot input, moved to the step's device once per run.

May import: numpy, placer, pipelines.mnist_mlp; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from pipelines.mnist_mlp import CLASSES, MEAN, SIDE, STD, fit, mlp, render, synthetic_images, synthetic_labels
from placer import Pipeline

DEFAULT_SIZE = 8192
TRAIN = 512
SCALE = np.float32(1.0 / (255.0 * STD))
SHIFT = np.float32(MEAN / STD)


def _scale_numpy(pixels: np.ndarray) -> np.ndarray:
    x = pixels.reshape(pixels.shape[0], -1).astype(np.float32)
    x *= SCALE
    x -= SHIFT
    return x


def _model(seed: int, epochs: int):
    import torch

    images, labels = synthetic_images(TRAIN, 1, SIDE, seed)
    x = torch.from_numpy(_scale_numpy(images))
    model = mlp([SIDE * SIDE, 128, CLASSES], seed)
    model, _ = fit(model, x, torch.from_numpy(labels), epochs=epochs, batch=128, lr=0.05, seed=seed)
    return model


def _requests(size: int, seed: int):
    """The request log: pixels of every request and (kept aside) their true classes."""
    labels = synthetic_labels(size, seed + 7)
    images = render(labels, 1, SIDE, seed)  # the training set's classes, other samples
    return {"pixels": images[:, 0], "labels": labels}


def _batches(requests, batch: int):
    pixels = requests["pixels"]
    for i in range(0, pixels.shape[0], batch):
        yield {"id": np.arange(i, min(i + batch, pixels.shape[0]), dtype=np.int64), "pixels": pixels[i:i + batch]}


def _preprocess_cpu(batches):
    return {"id": batches["id"], "x": _scale_numpy(batches["pixels"])}


def _preprocess_gpu(batches, device):
    import torch

    pixels = torch.as_tensor(batches["pixels"]).to(device)
    x = pixels.reshape(pixels.shape[0], -1).to(torch.float32)
    x *= torch.tensor(SCALE, device=x.device)
    x -= torch.tensor(SHIFT, device=x.device)
    return {"id": torch.as_tensor(batches["id"]).to(device), "x": x}


def _predict(preprocess, model, device):
    import torch

    with torch.no_grad():
        probs = torch.softmax(model(torch.as_tensor(preprocess["x"]).to(device)), 1)
    p, label = probs.max(1)
    return {"id": torch.as_tensor(preprocess["id"]).to(device), "label": label, "p": p}


def _summary(predict, requests):
    import torch

    ids = torch.cat([torch.as_tensor(b["id"]).cpu() for b in predict])
    label = torch.cat([torch.as_tensor(b["label"]).cpu() for b in predict])
    p = torch.cat([torch.as_tensor(b["p"]).cpu() for b in predict])
    truth = torch.as_tensor(requests["labels"])[ids]
    return {"id": ids, "label": label, "p": p, "counts": torch.bincount(label, minlength=CLASSES),
            "mean_p": p.to(torch.float64).mean(), "accuracy": (label == truth).to(torch.float64).mean()}


def build(size: int | None = None, *, batch: int = 256, epochs: int = 2, seed: int = 0) -> Pipeline:
    """The inference stream on ``size`` requests (default 8,192), ``batch`` per minibatch.

    ``epochs`` are the training epochs of the one-shot model; the request log is read once.
    """
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"stream_inference pipeline: size (requests) must be at least 1, got {n}")
    p = Pipeline("stream_inference", size=n, size_unit="requests")
    p.add(name="model", kind="training", cpu=_model, pin="cpu", params={"seed": seed, "epochs": epochs},
          doc="A 784-128-10 MLP trained once on 512 synthetic digits.")
    p.add(name="requests", kind="other", cpu=_requests, pin="cpu", params={"size": n, "seed": seed},
          doc="The request log: synthetic 28×28 uint8 digits and their true classes, on the host.")
    p.source("batches", batch_size=batch, inputs=["requests"], params={"batch": batch})(_batches)
    p.stage("preprocess", kind="preprocessing", device="cpu")(_preprocess_cpu)
    p.stage("preprocess", device="gpu")(_preprocess_gpu)
    p.step("predict", kind="inference")(_predict)
    p.add(name="summary", kind="other", fn=_summary, pin="cpu", inputs=["predict", "requests"],
          doc="Predictions in request order, class counts, mean confidence and accuracy.")
    return p
