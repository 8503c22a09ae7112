"""Stage-level check of ``--target h200``: user-style stages built from the reference ops.

Usage::

    python benchmarks/target_stages.py [REFERENCE_JSON] [-o benchmarks/results/target-stages-vm.txt]

``benchmarks/target.py`` checks the H200 description op by op. This script checks what a
user sees: a pipeline stage that runs a reference op the way user code does (a train
step or an inference at one batch size, repeated over the batches of a dataset; a
tabular op on a table), profiled on this machine and predicted for the H200 machine.

For each stage, its work is counted as the profiler counts it
(:func:`placer.costmodel.counts.count_work`, the stage's GPU implementation run on CPU
tensors) at three sizes up to the one planned for, and the cost model of a profile
measured on this machine (its CPU calibration scaling the host time to the H200's
Xeon) predicts the stage on the described H200 at the planned size. The reference is
the H200 measurement of the same op: batches x its seconds per batch (a loop of steps
issues one after another, so the steps add up), or the op's own row for a tabular
stage. Targets: predictions within 1.5x of the reference at the median, within 2x at
worst.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe as machine_line  # noqa: E402
from placer.costmodel.counts import count_work  # noqa: E402
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint  # noqa: E402
from placer.devices import discover  # noqa: E402
from placer.site import costs_from_profile  # noqa: E402
from placer.target.ops import OPS  # noqa: E402

#: (reference op, batch, batches) for the repeated stages: the stage's size is batch x batches
LOOPS = [
    ("mlp_train_step", 32, 16), ("mlp_train_step", 256, 8), ("mlp_train_step", 2048, 4),
    ("cnn_cifar_train_step", 64, 16), ("cnn_cifar_train_step", 8, 16), ("cnn_cifar_train_step", 512, 4),
    ("cnn_mnist_train_step", 64, 16),
    ("mlp_infer", 64, 8), ("mlp_infer", 512, 8), ("mlp_infer", 4096, 4),
    ("cnn_cifar_infer", 64, 8), ("cnn_cifar_infer", 512, 4),
]
#: (reference op, rows) for the one-call tabular and image stages
CALLS = [
    ("clean_standardize", 10_000), ("clean_standardize", 1_000_000), ("filter_rows", 1_000_000),
    ("sort_column", 1_000_000), ("groupby_sum", 1_000_000), ("feature_cross", 100_000),
    ("image_augment", 4096), ("image_augment", 65536),
]


def loop_stage(op: str, batch: int, batches: int):
    """A user's stage: the reference op at ``batch``, once per batch of ``batch x batches`` rows."""
    step = OPS[op](batch)

    def stage():
        for _ in range(batches):
            out = step()
        return out

    return stage


def reference(ref: dict, op: str, size: float) -> float | None:
    return next((r["seconds"] for r in ref["ops"] if r["op"] == op and r["device"] == "cuda"
                 and float(r["size"]) == float(size)), None)


def predict(name: str, counted: list[tuple[int, object]], size: int, host: dict) -> float:
    """The H200 prediction at ``size`` from the counted work at each size (a profile of this machine)."""
    pts, work = [], []
    for n, (seconds, w) in counted:
        pts.append(Point(size=n, median_s=seconds, iqr_s=0.0, reps=1, raw_times=[seconds]))
        work.append(WorkPoint(size=n, work=w))
    sp = StageProfile(name=name, key=name, devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)},
                      work=work, device_classes=["cpu", "gpu"])
    prof = Profile(pipeline=name, fingerprint="bench", machine=dict(host),
                   devices={"cpu": {"kind": "cpu", "workers": host.get("cores") or 1, "label": "cpu"}},
                   stages={name: sp}, measured_sizes=[n for n, _ in counted], sizes=[n for n, _ in counted])
    costs = costs_from_profile(prof, size=size, describe="h200")
    return costs.target_model.predict(name, "gpu:0", size).value


def timed_count(fn) -> tuple[float, object]:
    fn()  # warm, as the profiler counts a stage it has run
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return seconds, count_work(fn)[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reference", nargs="?", default=str(ROOT / "benchmarks/reference/h200-calibration.json"))
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args(argv)
    ref = json.loads(Path(args.reference).read_text())
    host = {k: v for k, v in discover().host.items() if v is None or isinstance(v, (str, int, float))}
    rows = []
    for op, batch, batches in LOOPS:
        meas = reference(ref, op, batch)
        if meas is None:
            continue
        counted = [(k * batch, timed_count(loop_stage(op, batch, k))) for k in sorted({1, max(batches // 4, 1),
                                                                                          batches})]
        pred = predict(f"{op}_{batch}", counted, batch * batches, host)
        rows.append((f"{op} batch {batch} x {batches}", pred, batches * meas, counted[-1][1][1].ops))
    for op, n in CALLS:
        meas = reference(ref, op, n)
        if meas is None:
            continue
        counted = [(m, timed_count(OPS[op](m))) for m in (n // 16, n // 4, n)]
        pred = predict(f"{op}_{n}", counted, n, host)
        rows.append((f"{op} {n:,} rows", pred, meas, counted[-1][1][1].ops))
    ratios = [p / m for _, p, m, _ in rows]
    logs = [abs(math.log(r)) for r in ratios]
    median = math.exp(statistics.median(logs))
    worst = math.exp(max(logs))
    import os

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = [machine_line() + f"; load average {load:.1f} at the end", "",
           f"{'stage':40s} {'predicted':>11s} {'reference':>11s} {'ratio':>7s} {'ops':>6s}"]
    for (name, p, m, ops), r in zip(rows, ratios):
        out.append(f"{name:40s} {p * 1e3:9.3f}ms {m * 1e3:9.3f}ms {r:7.2f} {ops:6d}")
    out += ["", f"GPU stage predictions against the H200 reference: median factor {median:.2f} (target <= 1.5), "
                f"worst {worst:.2f} (target <= 2.0) over {len(rows)} stages; "
                f"{'PASS' if median <= 1.5 and worst <= 2.0 else 'FAIL'}"]
    text = "\n".join(out)
    print(text)
    if args.output:
        from placer.files import write_text_atomic

        write_text_atomic(args.output, text + "\n")
    return 0 if median <= 1.5 and worst <= 2.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
