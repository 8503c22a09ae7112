"""Per-precision training steps measured on this machine's GPU, against placer's H200 predictions.

Usage (on a machine with a CUDA GPU; part of ``benchmarks/gpu_check.sh``)::

    python benchmarks/precision_gpu.py [--out gpu-results/precision-gpu] [--time-limit-s 100]

For each training step of ``benchmarks/precision_h200.py`` that fits the time limit (a wide
MLP and ``pipelines.transformer`` at several sizes), one step is timed on ``cuda:0`` in fp32,
TF32 and bf16, each run inside :func:`placer.precision.running_in` — the same context a
planned stage runs in, so this also checks that placer's TF32 flags and autocast take effect
on a real GPU — as the median of repeated, synchronised steps after warm-up. Beside each
measurement stands placer's prediction for the H200 description (``precision_h200.predict``:
counted work, roofline per precision, host dispatch), so the file shows both the measured
tensor-core ratios and how far each prediction is from the measurement.

``--device cpu`` runs the same code on the CPU (fp32 and bf16 autocast only; tf32 is a CUDA
setting) with tiny sizes: a smoke run for machines without a GPU, never recorded as a GPU result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PRECISIONS = ("fp32", "tf32", "bf16")
#: (name, kind, parameters): smallest first, so a time limit drops the largest
CASES = [
    ("MLP step width=256 batch=16", "mlp", {"width": 256, "batch": 16}),
    ("MLP step width=4096 batch=512", "mlp", {"width": 4096, "batch": 512}),
    ("MLP step width=4096 batch=4096", "mlp", {"width": 4096, "batch": 4096}),
    ("transformer step d=512 batch=16x128", "transformer", {"d": 512, "size": 16, "seq": 128}),
    ("transformer step d=1024 batch=32x64", "transformer", {"d": 1024, "size": 32, "seq": 64}),
    ("transformer step d=1024 batch=128x128", "transformer", {"d": 1024, "size": 128, "seq": 128}),
    ("transformer step d=2048 batch=64x128", "transformer", {"d": 2048, "size": 64, "seq": 128}),
]
SMOKE = [
    ("MLP step width=64 batch=32", "mlp", {"width": 64, "batch": 32}),
    ("transformer step d=64 batch=4x16", "transformer", {"d": 64, "size": 4, "seq": 16}),
]


def _mlp_step(width: int, batch: int, device):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                              torch.nn.GELU(), torch.nn.Linear(width, 16)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, width, device=device), torch.randint(0, 16, (batch,), device=device)

    def step():
        loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def _transformer_step(d: int, size: int, seq: int, device):
    import torch
    import torch.nn.functional as F

    from pipelines.transformer import model

    vocab = 1024
    lm = model(vocab, d, max(1, d // 64), 2, seq, 0).to(device)
    opt = torch.optim.SGD(lm.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, vocab, (size, seq + 1), generator=g).to(device)
    x, y = toks[:, :-1], toks[:, 1:]

    def step():
        loss = F.cross_entropy(lm(x).float().reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def time_step(kind: str, params: dict, precision: str, device, *, repeats: int) -> dict:
    """Median and spread of one step's wall time in ``precision`` (synchronised, after warm-up).

    ``pipelined_ms`` is the mean step of ``repeats`` steps run back to back with one
    synchronisation at the end, as a training loop runs them: the host queues the next step
    while the device computes this one, so a step whose host side is longer than its device
    side shows it here and not in ``ms``.
    """
    import torch

    from placer.precision import running_in

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step = (_mlp_step(params["width"], params["batch"], device) if kind == "mlp"
            else _transformer_step(params["d"], params["size"], params["seq"], device))
    times = []
    with running_in(precision, device):
        for _ in range(3):
            step()
        sync()
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(repeats):
            step()
        sync()
        pipelined = (time.perf_counter() - t0) / repeats
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 4 else [min(times), med, max(times)]
    return {"ms": med * 1e3, "iqr_ms": (q[2] - q[0]) * 1e3, "repeats": len(times), "pipelined_ms": pipelined * 1e3}


def predicted(kind: str, params: dict) -> dict | None:
    """placer's H200 prediction for the same step (``precision_h200``), or None if it cannot be counted."""
    import precision_h200 as ph

    try:
        if kind == "mlp":
            return ph.mlp_step(params["width"], params["batch"])
        return ph.transformer_step(params["d"], params["size"], params["seq"])
    except Exception as exc:  # noqa: BLE001 - a benchmark row records why it has no prediction
        return {"error": f"{type(exc).__name__}: {exc}"}


def run(device_name: str, time_limit_s: float, repeats: int) -> dict:
    import torch

    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --device cpu for a smoke run (not a GPU result)")
    if device.type == "cpu":
        torch.set_num_threads(1)  # a smoke run: on a shared 2-core VM, 2 threads spin at each barrier
    cases = CASES if device.type == "cuda" else SMOKE
    precisions = PRECISIONS if device.type == "cuda" else ("fp32", "bf16")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke run, not a GPU result)"
    doc = {"device": name, "torch": torch.__version__, "rows": {}, "skipped": []}
    t_start = time.perf_counter()
    for label, kind, params in cases:
        if time.perf_counter() - t_start > time_limit_s:
            doc["skipped"].append(label)
            continue
        row = {"measured": {}}
        for p in precisions:
            try:
                row["measured"][p] = time_step(kind, params, p, device, repeats=repeats)
            except Exception as exc:  # noqa: BLE001 - keep the other precisions and cases
                row["measured"][p] = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        fp32 = row["measured"].get("fp32", {}).get("ms")
        row["measured_speedup"] = {p: fp32 / m["ms"] for p, m in row["measured"].items()
                                   if p != "fp32" and fp32 and "ms" in m}
        row["predicted_h200"] = predicted(kind, params)
        pred = (row["predicted_h200"] or {}).get("ms", {})
        row["predicted_over_measured"] = {p: pred[p] / m["ms"] for p, m in row["measured"].items()
                                          if p in pred and "ms" in m}
        doc["rows"][label] = row
    doc["seconds"] = time.perf_counter() - t_start
    return doc


def markdown(doc: dict, machine: str) -> str:
    lines = [f"# Per-precision steps measured on {doc['device']} ({machine})", "",
             f"torch {doc['torch']}; {doc['seconds']:.0f} s. Measured: median of synchronised steps after "
             "warm-up, inside `placer.precision.running_in`. Predicted: placer's H200 description "
             "(`benchmarks/precision_h200.py`). Pipelined: the mean step of as many steps run back to "
             "back with one synchronisation at the end, as a training loop runs them.", "",
             "| step | precision | measured ms (IQR) | pipelined ms | speed-up over fp32 | predicted H200 ms | predicted / measured |",
             "|---|---|---|---|---|---|---|"]
    for label, row in doc["rows"].items():
        pred = (row.get("predicted_h200") or {}).get("ms", {})
        for p, m in row["measured"].items():
            if "ms" not in m:
                lines.append(f"| {label} | {p} | {m.get('error')} | | | | |")
                continue
            sp = row["measured_speedup"].get(p)
            ratio = row["predicted_over_measured"].get(p)
            pipe = f"{m['pipelined_ms']:.2f}" if "pipelined_ms" in m else "—"
            lines.append(f"| {label} | {p} | {m['ms']:.2f} ({m['iqr_ms']:.2f}) | {pipe} | {f'{sp:.2f}' if sp else '—'} | "
                         f"{f'{pred[p]:.2f}' if p in pred else '—'} | {f'{ratio:.2f}' if ratio else '—'} |")
    if doc["skipped"]:
        lines += ["", "Not run (time limit): " + ", ".join(doc["skipped"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "gpu-results"), "precision-gpu"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--time-limit-s", type=float, default=100.0)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    from _machine import describe

    from placer.files import write_text_atomic

    machine = describe()
    doc = run(args.device, args.time_limit_s, args.repeats)
    doc["machine"] = machine
    write_text_atomic(Path(args.out + ".json"), json.dumps(doc, indent=2))
    md = markdown(doc, machine)
    write_text_atomic(Path(args.out + ".md"), md)
    print(md)


if __name__ == "__main__":
    main()
