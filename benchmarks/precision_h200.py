"""Per-precision H200 predictions for training steps, against the reference's tensor-core ratios.

Usage::

    python benchmarks/precision_h200.py [--out benchmarks/results/precision-h200] [--no-accuracy]

For a pure 4096³ product and for one training step of ``pipelines.transformer`` (and of a
wide MLP) at several sizes, the step's work is counted (``placer.costmodel.counts.count_work``
on torch's ``meta`` device: shapes only, so realistic sizes cost nothing here) and the
shipped H200 description predicts it in fp32, TF32 and bf16 (tensor-core FLOPs at the
precision's peak, their bytes halved in bf16, the rest and the host's dispatch unchanged;
host time = calls × the target CPU's measured dispatch cost). The reference ratios for a
matmul-bound step are bf16 3–14× and TF32 2–7× over fp32 (the reference products: 13.6×
and 7.2×). With accuracy on, the measured differences (loss per step, outputs) of TF32
(emulated) and bf16 at a small transformer are added (``placer.profile.precision``).

Predictions only: no GPU is needed (nor used). Results are written as JSON and Markdown,
with the machine they were computed on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: the reference ranges a matmul-bound step's speed-up over fp32 should fall in
RANGES = {"tf32": (2.0, 7.5), "bf16": (3.0, 14.0)}
PRECISIONS = ("fp32", "tf32", "bf16")

TRANSFORMER = [  # (d_model, sequences per batch, seq)
    (512, 16, 128), (1024, 32, 64), (1024, 128, 128), (2048, 64, 128), (4096, 32, 256),
]
#: (width, batch): matmul-bound steps (width 4096 at batch 512 is the bar: bf16 >= 2.5x, tf32 >= 1.8x),
#: and a launch-bound one (width 256 at batch 16: a lower precision must not pay there)
MLP = [(4096, 512), (4096, 4096), (8192, 8192), (256, 16)]


def _desc():
    from placer.costmodel.roofline import load_description

    return load_description("h200")


def _dispatch_s() -> float:
    return json.loads((ROOT / "placer" / "data" / "h200.json").read_text())["cpu"]["dispatch_s"]


def predict(work) -> dict:
    h200 = _desc()
    w = work.model_copy(update={"host_s": work.dispatches * _dispatch_s()})
    t = {p: h200.predict(w, precision=p) for p in PRECISIONS}
    out = {"gflop": work.flops / 1e9, "tensor_share": work.tensor_flops / work.flops if work.flops else 0.0,
           "calls": work.calls, "ops": work.ops, "host_ms": w.host_s * 1e3,
           "ms": {p: v * 1e3 for p, v in t.items()}}
    out["speedup"] = {p: t["fp32"] / t[p] for p in ("tf32", "bf16")}
    out["in_range"] = {p: RANGES[p][0] <= out["speedup"][p] <= RANGES[p][1] for p in ("tf32", "bf16")}
    return out


def matmul_reference() -> dict:
    from placer.data.measures import Work

    n = 4096.0
    return predict(Work(flops=2 * n**3, tensor_flops=2 * n**3, bytes=3 * n * n * 4, tensor_bytes=3 * n * n * 4,
                        ops=1, calls=1))


def transformer_step(d: int, size: int, seq: int) -> dict:
    import torch

    from pipelines.transformer import build
    from placer.costmodel.counts import count_work

    p = build(size, d_model=d, heads=max(1, d // 64), seq=seq, steps=1)
    load = p.stages["load"].cpu.fn(**p.stages["load"].params)
    st = p.stages["train"]
    _, work = count_work(lambda: st.fn.fn(load, torch.device("meta"), **st.params), repeats=1)
    return predict(work)


def mlp_step(width: int, batch: int) -> dict:
    import torch

    from placer.costmodel.counts import count_work

    def step():
        dev = torch.device("meta")
        layers = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                     torch.nn.GELU(), torch.nn.Linear(width, 16)).to(dev)
        opt = torch.optim.SGD(layers.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch, width, device=dev), torch.randint(0, 16, (batch,), device=dev)
        loss = torch.nn.functional.cross_entropy(layers(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    _, work = count_work(step, repeats=1)
    return predict(work)


def accuracy() -> dict:
    from pipelines.transformer import build
    from placer.profile.precision import check_precisions

    t0 = time.perf_counter()
    checks = check_precisions(build(8, d_model=128, heads=4, vocab=256, seq=64, steps=3))
    return {"config": "transformer size=8 d_model=128 heads=4 vocab=256 seq=64 steps=3",
            "seconds": time.perf_counter() - t0,
            "stages": {n: [c.model_dump() for c in cs] for n, cs in checks.items()}}


def markdown(doc: dict) -> str:
    lines = [f"# Per-precision H200 predictions ({doc['machine']})", "",
             f"load average at the start: {doc['load']:.2f}; reference ranges over fp32: "
             f"tf32 {RANGES['tf32'][0]:g}–{RANGES['tf32'][1]:g}×, bf16 {RANGES['bf16'][0]:g}–{RANGES['bf16'][1]:g}× "
             "(the reference 4096³ products: tf32 7.2×, bf16 13.6×)", "",
             "| step | GFLOP | tensor-core share | host ms | fp32 ms | tf32 ms | bf16 ms | tf32 × | bf16 × | in range |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in doc["rows"].items():
        ok = "yes" if all(r["in_range"].values()) else ", ".join(
            f"{p} {'yes' if v else 'no'}" for p, v in r["in_range"].items())
        lines.append(f"| {name} | {r['gflop']:.0f} | {r['tensor_share']:.1%} | {r['host_ms']:.2f} | "
                     f"{r['ms']['fp32']:.2f} | {r['ms']['tf32']:.2f} | {r['ms']['bf16']:.2f} | "
                     f"{r['speedup']['tf32']:.2f} | {r['speedup']['bf16']:.2f} | {ok} |")
    if doc.get("accuracy"):
        acc = doc["accuracy"]
        lines += ["", f"## Measured differences from fp32 here ({acc['config']}; {acc['seconds']:.0f} s)", "",
                  "| stage | precision | metric | relative difference | tolerance | chosen if faster | how |",
                  "|---|---|---|---|---|---|---|"]
        for n, cs in acc["stages"].items():
            for c in cs:
                lines.append(f"| {n} | {c['precision']} | {c['metric']} | {c['rel_error']:.2e} | {c['tolerance']:g} | "
                             f"{'yes' if c['rel_error'] <= c['tolerance'] else 'no'} | {c['method']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "precision-h200"))
    ap.add_argument("--no-accuracy", action="store_true")
    args = ap.parse_args()
    from _machine import describe

    doc = {"machine": describe(), "load": os.getloadavg()[0], "rows": {}}
    doc["rows"]["matmul 4096³ (reference)"] = matmul_reference()
    for w, b in MLP:
        doc["rows"][f"MLP step width={w} batch={b}"] = mlp_step(w, b)
    for d, size, seq in TRANSFORMER:
        doc["rows"][f"transformer step d={d} batch={size}x{seq}"] = transformer_step(d, size, seq)
    if not args.no_accuracy:
        doc["accuracy"] = accuracy()
    from placer.files import write_text_atomic

    write_text_atomic(Path(args.out + ".json"), json.dumps(doc, indent=2))
    md = markdown(doc)
    write_text_atomic(Path(args.out + ".md"), md)
    print(md)


if __name__ == "__main__":
    main()
