"""Request-by-request inference: request → preprocess → infer → postprocess.

Models an online service: each run handles one request batch of ``size`` rows
(``size`` is the batch: 1 for single requests) with 64 raw features; preprocessing
log-scales and standardises them, a 64-256-256-10 MLP scores them, and
postprocessing turns logits into the top class and its probability. The model's
weights are created once per device and stay there, as in a server, so a run
measures the latency of one request. Seeded and deterministic.
"""

from __future__ import annotations

import threading

from placer import Pipeline

DEFAULT_SIZE = 32
FEATURES = 64
_WEIGHTS: dict[str, dict] = {}
_LOCK = threading.Lock()


def _weights(device):
    import torch

    key = str(device)
    with _LOCK:
        if key not in _WEIGHTS:
            g = torch.Generator().manual_seed(1234)
            dims = [FEATURES, 256, 256, 10]
            w = {}
            for i, (a, b) in enumerate(zip(dims, dims[1:])):
                w[f"w{i}"] = (torch.randn(a, b, generator=g) / a**0.5).to(device)
                w[f"b{i}"] = (0.01 * torch.randn(b, generator=g)).to(device)
            _WEIGHTS[key] = w
        return _WEIGHTS[key]


def _request(device, size: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(size, FEATURES, generator=g) * 1000.0
    return raw.to(device)


def _preprocess(request, device):
    import torch

    x = torch.log1p(request)
    return (x - 5.9) / 1.1


def _infer(preprocess, device):
    import torch

    w = _weights(device)
    h = preprocess
    for i in range(3):
        h = h @ w[f"w{i}"] + w[f"b{i}"]
        if i < 2:
            h = torch.relu(h)
    return h


def _postprocess(infer, device):
    import torch

    prob = torch.softmax(infer, 1)
    top, cls = prob.max(1)
    return {"class": cls, "prob": top}


def build(size: int | None = None, *, seed: int = 7) -> Pipeline:
    """One request batch of ``size`` rows (default 32)."""
    n = int(size or DEFAULT_SIZE)
    if n < 1:
        raise ValueError(f"requests pipeline: size (the batch) must be at least 1, got {n}")
    p = Pipeline("requests", size=n)
    p.add(name="request", kind="other", fn=_request, params={"size": n, "seed": seed},
          doc="One incoming request batch.")
    p.add(name="preprocess", kind="preprocessing", fn=_preprocess, inputs=["request"],
          doc="log1p and standardise.")
    p.add(name="infer", kind="inference", fn=_infer, inputs=["preprocess"],
          doc="64-256-256-10 MLP forward pass; weights resident per device.")
    p.add(name="postprocess", kind="other", fn=_postprocess, inputs=["infer"],
          doc="Top class and its probability.")
    return p
