"""A saved profile's per-precision H200 roofline at larger sizes, from its work counted at two sizes.

Usage::

    python benchmarks/precision_profile_sizes.py PROFILE.json STAGE SIZE [SIZE ...] [--out FILE.md]

``PROFILE.json`` is a profile saved by ``placer advise --save DIR`` (``DIR/profile.json``) or
``placer profile -o``, measured at two sizes or more and holding the stage's accuracy checks with
their autocast counts (``PrecisionCheck.counted``). For each SIZE the stage's fp32 work (FLOPs,
tensor-core FLOPs, bytes, launches) is read off the line through its two largest counted sizes,
(launches and calls: the largest counted size's, as a batch's kernels do not multiply with its
rows), bf16's bytes, launches and dispatches off the line through the counted differences autocast makes
(:func:`placer.costmodel.precision.under`), and the shipped H200 description predicts fp32, TF32 and
bf16 with the roofline's own formula (``DeviceDescription.predict``). The host's time is the least of
the cost model's host readings (``CostModel.host_seconds``: dispatches times this machine's cost of
one, plus the time outside torch ops, scaled to the target's CPU; noise only adds to it), charged
as the cost model charges it (``host_factor`` times it, added to the device's time).

This is the cost model's prediction with one change: the work is extrapolated as a line in the
size, where ``placer plan`` fits the predicted *times* over the counted sizes, which a noisy host
reading at one size (on a loaded machine) can bend. The table gives each part, so where a ratio
falls outside the reference range the reason is in the numbers (host, launches, memory, compute).
Predictions only: nothing runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RANGES = {"tf32": (2.0, 7.5), "bf16": (3.0, 14.0)}


def at(points: list[tuple[float, float]], size: float) -> float:
    """The line through the two largest ``(size, value)`` points, read at ``size``."""
    (a, va), (b, vb) = sorted(points)[-2:]
    return va + (vb - va) * (size - a) / (b - a)


def rows(profile_path: str, stage: str, sizes: list[float]) -> list[dict]:
    from placer.costmodel import precision as pm
    from placer.data.profile import Profile
    from placer.site import costs_from_profile

    prof = Profile.load(profile_path)
    sp = prof.stages[stage]
    if len({w.size for w in sp.work}) < 2:
        raise SystemExit(f"{stage!r}: work counted at {[w.size for w in sp.work]}; two sizes are needed")
    model = costs_from_profile(prof, size=max(sizes), describe="h200").target_model
    desc = model.described["gpu:0"]
    host = min(model.host_seconds(stage))
    out = []
    for n in sizes:
        fields = {k: at([(w.size, getattr(w.work, k)) for w in sp.work], n)
                  for k in ("flops", "tensor_flops", "bytes", "tensor_bytes")}
        w = sp.work[-1].work.model_copy(update=fields)  # launches and calls: the largest counted size's
        r = {"size": n, "gflop": w.flops / 1e9, "tensor_share": w.tensor_flops / w.flops, "gb": w.bytes / 1e9,
             "host_ms": host * desc.host_factor * 1e3, "launch_ms": w.ops * desc.op_overhead_s * 1e3, "ms": {},
             "parts": {}}
        for p in ("fp32", "tf32", "bf16"):
            wp, h = pm.under(model, stage, p, w, host, n)
            wp = wp.model_copy(update={"host_s": h})
            r["ms"][p] = desc.predict(wp, precision=p) * 1e3
            tensor = min(wp.tensor_flops, wp.flops)
            compute = (tensor / desc.peak(p if p != "fp32" else "fp32") + (wp.flops - tensor) / desc.peak("fp32")) \
                / desc.compute_eff
            nbytes = wp.bytes - (min(wp.tensor_bytes, wp.bytes) / 2 if p in ("bf16", "fp16") else 0)
            r["parts"][p] = {"compute_ms": compute * 1e3, "memory_ms": nbytes / (desc.mem_bandwidth_Bps * desc.memory_eff)
                             * 1e3, "gb": nbytes / 1e9, "fixed_ms": (desc.host_factor * h + wp.ops * desc.op_overhead_s
                                                                     + desc.stage_overhead_s) * 1e3}
        r["speedup"] = {p: r["ms"]["fp32"] / r["ms"][p] for p in ("tf32", "bf16")}
        out.append(r)
    return out


def markdown(profile_path: str, stage: str, table: list[dict]) -> str:
    lines = [f"`{stage}` of `{profile_path}` on the H200 description, work read off the line through its two "
             "largest counted sizes", "",
             "| size | GFLOP | tensor-core share | fp32 GB | fp32 ms | tf32 ms | bf16 ms | tf32 × | bf16 × | in range |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        ok = ", ".join(f"{p} {'yes' if RANGES[p][0] <= r['speedup'][p] <= RANGES[p][1] else 'no'}" for p in RANGES)
        lines.append(f"| {r['size']:g} | {r['gflop']:.0f} | {r['tensor_share']:.1%} | {r['gb']:.1f} | "
                     f"{r['ms']['fp32']:.1f} | {r['ms']['tf32']:.1f} | {r['ms']['bf16']:.1f} | "
                     f"{r['speedup']['tf32']:.2f} | {r['speedup']['bf16']:.2f} | {ok} |")
    lines += ["", "Parts of each prediction (ms; time = fixed + max(compute, memory); fixed = host_factor × host + "
              "launches × op overhead + stage overhead):", "",
              "| size | precision | compute | memory (GB) | fixed |", "|---|---|---|---|---|"]
    for r in table:
        for p, q in r["parts"].items():
            lines.append(f"| {r['size']:g} | {p} | {q['compute_ms']:.1f} | {q['memory_ms']:.1f} ({q['gb']:.1f}) | "
                         f"{q['fixed_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("stage")
    ap.add_argument("sizes", nargs="+", type=float)
    ap.add_argument("--out")
    args = ap.parse_args()
    md = markdown(args.profile, args.stage, rows(args.profile, args.stage, args.sizes))
    if args.out:
        from placer.files import write_text_atomic

        write_text_atomic(Path(args.out), md)
    print(md)


if __name__ == "__main__":
    main()
