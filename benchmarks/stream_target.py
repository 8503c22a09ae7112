"""The bundled stream steps planned for ``--target h200``: predicted step time against the H200 reference.

Usage::

    python benchmarks/stream_target.py [REFERENCE_JSON] [-o benchmarks/results/stream-target-vm-epyc.txt]

A stream planned for a target (:mod:`placer.stream.target`) prices its step on the
target's GPU by the roofline of the work of one batch counted here
(:func:`placer.stream.target.count_stream_work`: the step's own call through the
stream runner, on CPU tensors) plus the host time a GPU run pays (the calls dispatched
times this machine's measured cost of one, plus the time outside torch ops, scaled to
the target's CPU per core). This script does exactly that for the step of every
bundled stream pipeline and compares it with the H200 reference's training-step (or
inference) rows (``benchmarks/reference/h200-calibration.json``):

- ``stream_images`` trains the reference's ``cnn_cifar_train_step`` model (same layers,
  3x32x32 inputs): compared at batches 8, 64 and 512, the reference's own sizes;
- ``stream_cache`` (a 1024-128-10 MLP), ``stream_tabular`` (12-64-2) and
  ``stream_inference`` (784-128-10, inference) train or run smaller MLPs than the
  reference's 784-512-512-10: compared with the nearest row (``mlp_train_step`` /
  ``mlp_infer``) as launch-bound steps of the same kind, marked ``other model``.

Targets (as ``benchmarks/target_stages.py``): for the same model, within 1.5x of the
reference at the median and within 2x at worst. The other rows are reported, not
held to a target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe as machine_line  # noqa: E402
from placer.files import write_text_atomic  # noqa: E402
from placer.loader import load_pipeline  # noqa: E402
from placer.stream.target import count_stream_work, host_seconds  # noqa: E402
from placer.target import CpuScale, load_target  # noqa: E402
from placer.target.calibrate import this_cpu  # noqa: E402

REFERENCE = ROOT / "benchmarks/reference/h200-calibration.json"
#: (pipeline, build parameters, the reference op, whether it is the same model)
CASES = [
    ("stream_images", {"batch": 8, "augment": "numpy"}, "cnn_cifar_train_step", True),
    ("stream_images", {"batch": 64, "augment": "numpy"}, "cnn_cifar_train_step", True),
    ("stream_images", {"batch": 512, "augment": "numpy"}, "cnn_cifar_train_step", True),
    ("stream_cache", {"batch": 64, "passes": 1}, "mlp_train_step", False),
    ("stream_tabular", {"batch": 512}, "mlp_train_step", False),
    ("stream_inference", {"batch": 256}, "mlp_infer", False),
]
MEDIAN_TARGET, WORST_TARGET = 1.5, 2.0


def reference_row(ref: dict, op: str, batch: int) -> dict:
    """The reference's GPU row of ``op`` at the batch nearest ``batch`` (in log size)."""
    rows = [r for r in ref["ops"] if r["op"] == op and r["device"] == "cuda"]
    return min(rows, key=lambda r: abs(math.log(r["size"] / batch)))


def predict_step(name: str, params: dict, scale: CpuScale, dispatch_s: float, gpu) -> dict:
    """The step's predicted seconds per batch on the target's GPU, from one batch counted here."""
    batch = params["batch"]
    p = load_pipeline(str(ROOT / "pipelines" / f"{name}.py"), 3 * batch, **params, epochs=1)
    source = next(iter(p.validate().streams()))
    notes: list[str] = []
    work = count_stream_work(p, source, notes=notes)
    step = p.validate().streams()[source][-1]
    w = work[step]
    host = host_seconds(w, dispatch_s, scale)
    total = gpu.predict(w.model_copy(update={"host_s": host}))
    return {"step": step, "predicted_s": total, "host_s": host, "flops": w.flops, "bytes": w.bytes, "ops": w.ops,
            "calls": w.calls, "outside_s": w.outside_s, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reference", nargs="?", default=str(REFERENCE))
    ap.add_argument("-o", "--output", default=str(ROOT / "benchmarks" / "results" / "stream-target-vm-epyc.txt"))
    args = ap.parse_args(argv)
    ref = json.loads(Path(args.reference).read_text())
    target = load_target("h200")
    here = this_cpu()
    scale = CpuScale.between(here, target.cpu)
    gpu = target.gpus[0]
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    rows = []
    for name, params, op, same in CASES:
        got = predict_step(name, params, scale, here.dispatch_s, gpu)
        r = reference_row(ref, op, params["batch"])
        rows.append({"pipeline": name, "batch": params["batch"], **got, "reference_op": op,
                     "reference_batch": r["size"], "reference_s": r["seconds"],
                     "ratio": got["predicted_s"] / r["seconds"], "same_model": same})
    same = [r["ratio"] for r in rows if r["same_model"]]
    factors = [max(x, 1 / x) for x in same]
    median, worst = statistics.median(factors), max(factors)
    ok = median <= MEDIAN_TARGET and worst <= WORST_TARGET
    lines = [f"{machine_line()}; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
             f"{time.perf_counter() - t0:.0f} s",
             f"target: {target.name}; {scale.describe()}; dispatch here {here.dispatch_s * 1e6:.2f} us per call",
             "",
             f"{'pipeline':<18}{'batch':>6}{'predicted':>12}{'host':>10}{'reference':>12}{'ref op (batch)':>32}"
             f"{'ratio':>7}  model"]
    for r in rows:
        ref_op = f"{r['reference_op']} ({r['reference_batch']})"
        lines.append(f"{r['pipeline']:<18}{r['batch']:>6}{r['predicted_s'] * 1e3:>10.3f}ms{r['host_s'] * 1e3:>8.3f}ms"
                     f"{r['reference_s'] * 1e3:>10.3f}ms{ref_op:>32}{r['ratio']:>7.2f}  "
                     f"{'same' if r['same_model'] else 'other model'}")
    lines += ["", f"stream steps (same model) against the H200 reference: median factor {median:.2f} "
                  f"(target <= {MEDIAN_TARGET}), worst {worst:.2f} (target <= {WORST_TARGET}) over {len(same)} "
                  f"steps; {'PASS' if ok else 'FAIL'}"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = Path(args.output)
    write_text_atomic(out, text)
    write_text_atomic(out.with_suffix(".json"), json.dumps({"machine": machine_line(), "target": target.name,
                                                             "rows": rows, "median_factor": median,
                                                             "worst_factor": worst, "pass": ok}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
