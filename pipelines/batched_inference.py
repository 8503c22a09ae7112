"""Batched (offline) inference: requests → preprocess → infer → postprocess.

The same model and preprocessing as :mod:`pipelines.requests` (log1p and
standardise 64 raw features, a 64-256-256-10 MLP whose weights stay resident on
each device, softmax), served the other way: ``size`` requests (default 100,000)
are collected on the host and scored in one run, in micro-batches of ``batch``
rows. Compare the two to see how the batch size moves the best device: one
request batch of 32 rows is dominated by launch and transfer overheads, a large
batch by arithmetic.

The output is each request's class probabilities (float), not the arg-max class,
so that two placements whose logits differ in the last bits still agree.

May import: numpy, placer, pipelines.requests; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from pipelines.requests import FEATURES, _preprocess, _weights
from placer import Pipeline

DEFAULT_SIZE = 100_000


def _requests(size: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.random((size, FEATURES), dtype=np.float32) * np.float32(1000.0)


def _infer(preprocess, device, batch: int):
    import torch

    w = _weights(preprocess.device)
    outs = []
    with torch.no_grad():
        for s in range(0, preprocess.shape[0], batch):
            h = preprocess[s : s + batch]
            for i in range(3):
                h = h @ w[f"w{i}"] + w[f"b{i}"]
                if i < 2:
                    h = torch.relu(h)
            outs.append(h)
    return torch.cat(outs)


def _postprocess(infer, device):
    import torch

    return torch.softmax(infer, 1)


def build(size: int | None = None, *, batch: int = 8192, seed: int = 7) -> Pipeline:
    """``size`` requests (default 100,000) scored in micro-batches of ``batch`` rows."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"batched_inference pipeline: size (requests) must be at least 1, got {n}")
    if batch < 1:
        raise ValueError(f"batched_inference pipeline: batch must be at least 1, got {batch}")
    p = Pipeline("batched_inference", size=n, size_unit="requests")
    p.add(name="requests", kind="other", cpu=_requests, pin="cpu", params={"size": n, "seed": seed},
          doc="Collected requests: 64 raw features each, on the host.")
    p.add(name="preprocess", kind="preprocessing", fn=_preprocess, inputs={"request": "requests"},
          doc="log1p and standardise (as pipelines.requests).")
    p.add(name="infer", kind="inference", fn=_infer, inputs=["preprocess"], params={"batch": batch},
          doc="64-256-256-10 MLP forward pass in micro-batches; weights resident per device.")
    p.add(name="postprocess", kind="other", fn=_postprocess, inputs=["infer"],
          doc="Class probabilities.")
    return p
