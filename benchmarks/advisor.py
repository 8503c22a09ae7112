"""How good are placer's plans? Measured end to end against the baselines and the oracle.

For every gallery pipeline at two sizes (small and large), in one process, this
measures the wall time of ``execute(pipeline, placement)`` (after one untimed
warm-up run, median of repeats) for:

* placer's plan (profiled once per pipeline, planned at each size); the seconds
  placer spent profiling and planning are reported beside it, not included;
* all-CPU, all-GPU and the rule of thumb (training and inference on the GPU);
* the oracle: every placement of the placeable stages (those not pinned and with
  both a CPU and a GPU implementation), for pipelines of at most 6 of them.

It prints a table with plan/oracle and plan/best-baseline and writes it, with the
machine it ran on, to ``--out`` (default ``benchmarks/results/advisor-<host>.txt``)
and the same name with ``.json`` (every placement's repeats and digests).

On a machine without a GPU the device set is {cpu}: only all-CPU placements can
run, so the table says that GPU placements were not measurable here, and adds
what placer predicts for the described H200. ``--simulated`` adds the simulated
test device ``gpu-sim`` (GPU implementations run on the CPU): a labelled test of
the machinery, never a GPU result.

Targets, recorded here and not asserted anywhere: on a GPU machine, plan ≤ 1.10 ×
oracle on every case, and plan no more than 5 % slower than the best baseline.

Usage
-----
    python benchmarks/advisor.py                      # this machine, default sizes
    python benchmarks/advisor.py --out "$OUT/advisor-h200.txt" --time-limit-s 450
    python benchmarks/advisor.py --pipelines timeseries,branches --simulated
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: name -> (small, large on a GPU machine, large on a CPU-only machine)
SIZES = {
    "tabular": (2_000, 200_000, 50_000),
    "requests": (1, 1_024, 256),
    "mnist_mlp": (1_024, 16_384, 4_096),
    "mnist_cnn": (512, 8_192, 1_024),
    "cifar_augment": (512, 8_192, 1_024),
    "batched_inference": (2_000, 1_000_000, 200_000),
    "timeseries": (20_000, 1_000_000, 500_000),
    "branches": (2_000, 100_000, 20_000),
    "etl_dask": (20_000, 2_000_000, 400_000),
}
#: the simulated device runs numba.cuda kernels in numba's Python simulator: tiny sizes
SIMULATED_SIZES = {
    "tabular": (2_000, 8_000), "requests": (1, 256), "mnist_mlp": (256, 1_024),
    "mnist_cnn": (128, 512), "cifar_augment": (128, 512), "batched_inference": (2_000, 50_000),
    "timeseries": (2_000, 8_000), "branches": (200, 800), "etl_dask": (20_000, 100_000),
}
ORACLE_LIMIT = 6


# -- the machine ----------------------------------------------------------------------------
def machine() -> dict:
    """What the numbers were measured on."""
    import numpy
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        cpu = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), cpu)
    except (OSError, subprocess.SubprocessError):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        import numba

        numba_v = numba.__version__
    except Exception:  # pragma: no cover - numba is a dependency
        numba_v = None
    return {
        "host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "gpu": gpu,
        "python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
        "numba": numba_v, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# -- measuring -------------------------------------------------------------------------------
class Clock:
    """The benchmark's time limit."""

    def __init__(self, limit_s: float):
        self.t0 = time.perf_counter()
        self.limit_s = limit_s

    def left(self) -> float:
        return self.limit_s - (time.perf_counter() - self.t0)


def run_once(p, placement: dict, inv, keep: dict | None = None) -> tuple[float, str]:
    """Wall seconds of one ``execute`` call, and its outputs' digest. ``keep``: outputs by digest, the
    first run's of each digest added (values to compare where digests differ)."""
    from placer.executor import execute

    t0 = time.perf_counter()
    run = execute(p, placement, inventory=inv)
    seconds = time.perf_counter() - t0
    if keep is not None and run.outputs_digest not in keep:
        keep[run.outputs_digest] = run.final_outputs
    return seconds, run.outputs_digest


def measure(p, placement: dict, inv, clock: Clock, reps: int, keep: dict | None = None) -> dict:
    """Warm up once, then time up to ``reps`` runs (fewer for slow placements or little time)."""
    rec = {"placement": placement, "runs": [], "digest": None, "error": None}
    try:
        warm, rec["digest"] = run_once(p, placement, inv, keep)
        n = reps if warm < 1.0 else (2 if warm < 3.0 else 1)
        for _ in range(n):
            if rec["runs"] and clock.left() < 3 * warm:
                break
            s, digest = run_once(p, placement, inv)
            rec["runs"].append(s)
            if digest != rec["digest"]:
                rec["error"] = "digest changed between repeats"
    except Exception as exc:  # a placement that cannot run here is reported, not fatal
        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return rec


def median(rec: dict | None) -> float | None:
    if rec is None or rec["error"] or not rec["runs"]:
        return None
    return statistics.median(rec["runs"])


def placeable(p) -> list[str]:
    """Stages a planner may move: not pinned, with both a CPU and a GPU implementation."""
    return [n for n, s in p.stages.items() if s.pin is None and len(s.device_classes()) == 2]


def complete(p, partial: dict[str, str], accelerator: str | None) -> dict[str, str]:
    """A full placement: pinned stages on their pin, one-class stages on their class."""
    out = {}
    for n, s in p.stages.items():
        if n in partial:
            out[n] = partial[n]
        elif s.pin is not None:
            out[n] = "cpu" if s.pin == "cpu" else (accelerator or s.pin)
        else:
            out[n] = "cpu" if s.impl_for("cpu") is not None or accelerator is None else accelerator
    return out


def oracle_placements(p, devices: list[str]) -> list[dict[str, str]]:
    names = placeable(p)
    acc = next((d for d in devices if d != "cpu"), None)
    return [complete(p, dict(zip(names, devs)), acc) for devs in itertools.product(devices, repeat=len(names))]


class Case:
    """One pipeline at one size: the placements measured, deduplicated."""

    def __init__(self, name: str, size: int, p, inv, clock: Clock, reps: int):
        self.name, self.size, self.p, self.inv, self.clock, self.reps = name, size, p, inv, clock, reps
        self.records: dict[tuple, dict] = {}
        #: the outputs of the first run with each digest
        self.outputs: dict[str, dict] = {}

    def get(self, placement: dict) -> dict:
        key = tuple(sorted(placement.items()))
        if key not in self.records:
            self.records[key] = measure(self.p, placement, self.inv, self.clock, self.reps, self.outputs)
        return self.records[key]

    def remeasure(self, placements: list[dict], rounds: int) -> None:
        """More runs of the placements that decide the ratios, interleaved, to cut noise."""
        for _ in range(rounds):
            for pl in placements:
                rec = self.get(pl)
                if rec["error"] or self.clock.left() < 4 * (median(rec) or 0) + 5:
                    continue
                s, _digest = run_once(self.p, pl, self.inv)
                rec["runs"].append(s)


# -- planning --------------------------------------------------------------------------------
def profile_pipeline(name: str, size: int, budget_s: float, inv):
    """Profile once per pipeline (up to the large size's profiling range); seconds spent."""
    from placer.site import LocalSite

    t0 = time.perf_counter()
    costs = LocalSite(inv, cache=False).costs(f"pipelines.{name}:build", size=size, budget_s=budget_s)
    return costs.profile, time.perf_counter() - t0


def load_gallery(name: str, size: int):
    from placer.loader import load_pipeline

    return load_pipeline(f"pipelines.{name}:build", size)


def plan_at(prof, size: int, devices: list[str]):
    """The plan as ``placer advise`` makes it, its planning seconds, and a note when it fell back.

    When the advise flow's planning fails (for instance while it looks for crossover
    sizes), the placement is planned from the same cost table without them: the
    placement is the same search, only the explanations lack crossover sizes.
    """
    from placer.optimize import plan
    from placer.site import costs_from_profile

    t0 = time.perf_counter()
    costs = costs_from_profile(prof, size=size)
    try:
        return costs.plan(size=size, devices=devices), time.perf_counter() - t0, None
    except Exception as exc:  # noqa: BLE001 - reported in the table
        note = f"advise's planning failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
    chosen = plan(costs.table(size, devices))
    return chosen, time.perf_counter() - t0, note + "; planned without crossover sizes"


def h200_prediction(prof, size: int, p) -> dict | None:
    """What placer plans for the described H200 (predictions only; machines without a GPU).

    Stages the plan puts off the CPU although they are pinned to it, or have no GPU
    implementation, are listed: such a placement could not run.
    """
    from placer.advisor import target_step
    from placer.site import costs_from_profile

    try:
        t = target_step(costs_from_profile(prof, size=size, describe="h200"), "h200")
    except Exception as exc:  # the description may not cover a stage
        return {"error": f"{type(exc).__name__}: {exc}"}
    impossible = sorted(n for n, d in t["placement"].items() if d != "cpu" and n in p.stages
                        and (p.stages[n].pin == "cpu" or p.stages[n].impl_for("gpu") is None))
    return {"placement": t["placement"], "predicted_s": t["predicted_s"],
            "all_cpu_predicted_s": t["all_cpu_predicted_s"], "speedup": t["speedup"],
            "impossible": impossible}


# -- one case ---------------------------------------------------------------------------------
def bench_case(name: str, size: int, prof, profile_s: float, devices: list[str], inv, clock: Clock,
               reps: int, oracle: bool) -> dict:
    from placer.advisor import baseline_placements

    p = load_gallery(name, size)
    acc = next((d for d in devices if d != "cpu"), None)
    case = Case(name, size, p, inv, clock, reps)
    chosen, plan_s, note = plan_at(prof, size, devices)
    plan_pl = complete(p, dict(chosen.placement), acc)
    row = {"pipeline": name, "size": size, "placeable": len(placeable(p)), "profile_s": profile_s,
           "plan_s": plan_s, "plan_placement": plan_pl, "predicted_s": chosen.predicted_makespan_s,
           "plan_note": note}
    rec_plan = case.get(plan_pl)
    baselines = {k: complete(p, v, acc) for k, v in baseline_placements(p, acc).items()}
    for k, pl in baselines.items():
        case.get(pl)
    enumerate_all = oracle and len(placeable(p)) <= ORACLE_LIMIT and clock.left() > 60
    if enumerate_all:
        for pl in oracle_placements(p, devices):
            if clock.left() < 30:
                enumerate_all = False
                break
            case.get(pl)
    ok = [r for r in case.records.values() if median(r) is not None]
    top = sorted(ok, key=median)[:2]
    decisive = [rec_plan["placement"], *(r["placement"] for r in top),
                *(baselines[k] for k in baselines)]
    case.remeasure(decisive, rounds=2)
    return finish_row(row, case, rec_plan, baselines, enumerate_all)


def finish_row(row: dict, case: Case, rec_plan: dict, baselines: dict, enumerated: bool) -> dict:
    times = {k: median(case.get(pl)) for k, pl in baselines.items()}
    ok = [r for r in case.records.values() if median(r) is not None]
    best = min(ok, key=median) if ok else None
    plan_t = median(rec_plan)
    base = [t for t in times.values() if t is not None]
    digests = {r["digest"] for r in ok}
    differ = outputs_differ(case.outputs, [r["digest"] for r in ok])
    row.update({
        "plan_measured_s": plan_t, "plan_error": rec_plan["error"], "baselines_s": times,
        "oracle_s": median(best) if best else None, "oracle_placement": best["placement"] if best else None,
        "oracle_complete": enumerated, "placements_measured": len(case.records),
        "plan_over_oracle": plan_t / median(best) if plan_t and best else None,
        "plan_over_best_baseline": plan_t / min(base) if plan_t and base else None,
        "digests_agree": len(digests) <= 1,
        # digests on two sides of a rounding step are not a difference: the values decide (as placer's own check)
        "outputs_agree": differ is None, "outputs_differ": differ,
        "measurements": [{**r, "median_s": median(r)} for r in case.records.values()],
    })
    return row


def outputs_differ(outputs: dict[str, dict], digests: list[str]) -> str | None:
    """None when every digest's outputs agree with the first's elementwise (placer.digest's tolerance);
    else where the first that does not differs. A digest with no outputs kept is not compared."""
    from placer.digest import compare_outputs

    seen = [d for d in dict.fromkeys(digests) if d in outputs]
    for d in seen[1:]:
        why = compare_outputs(outputs[seen[0]], outputs[d])
        if why is not None:
            return why
    return None


def agreement(row: dict) -> str:
    """The table's word for a case's outputs across placements."""
    if row.get("digests_agree"):
        return "same"
    return "close" if row.get("outputs_agree") else "DIFFER"


# -- the table --------------------------------------------------------------------------------
def fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "n/a"
    if unit == "x":
        return f"{x:.2f}×"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def on_accelerator(placement: dict[str, str] | None) -> str:
    if not placement:
        return "n/a"
    acc = sorted(n for n, d in placement.items() if d != "cpu")
    return ",".join(acc) if acc else "(all CPU)"


def render(rows: list[dict], meta: dict) -> str:
    head = ["pipeline", "size", "k", "profile", "plan", "placer plan", "all-CPU", "all-GPU", "rule",
            "oracle", "plan/oracle", "plan/best", "plan on GPU", "digests"]
    lines = []
    for r in rows:
        b = r["baselines_s"]
        lines.append([
            r["pipeline"], f"{r['size']:,}", str(r["placeable"]), fmt(r["profile_s"]), fmt(r["plan_s"]),
            fmt(r["plan_measured_s"]) if not r["plan_error"] else "failed", fmt(b.get("all_cpu")),
            fmt(b.get("all_gpu")), fmt(b.get("rule_of_thumb")),
            fmt(r["oracle_s"]) + ("" if r["oracle_complete"] else "*"),
            fmt(r["plan_over_oracle"], "x"), fmt(r["plan_over_best_baseline"], "x"),
            on_accelerator(r["plan_placement"]), agreement(r),
        ])
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = [header(meta), ""]
    out.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(ln, widths)) for ln in lines]
    out += ["", *footnotes(rows, meta)]
    return "\n".join(out) + "\n"


def header(meta: dict) -> str:
    m = meta["machine"]
    gpu = m["gpu"] or "no GPU"
    lines = [
        "placer advisor benchmark: placer's plan against all-CPU, all-GPU, the rule of thumb and the oracle",
        f"machine: {m['cpu']}, {m['cores']} cores, {gpu}; host {m['host']}",
        f"software: Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, numba {m['numba']}; {m['date']}",
        f"devices measured: {', '.join(meta['devices'])}; profiling budget {meta['budget_s']:g} s per pipeline; "
        f"wall time of execute() after one warm-up run, median of up to {meta['reps']} runs (more for the "
        "placements that decide the ratios)",
    ]
    if meta["simulated"]:
        lines.append("SIMULATED: 'gpu-sim' runs GPU implementations on the CPU (numba.cuda in its simulator). "
                     "It is not a GPU; these numbers test the machinery, not GPU performance.")
    elif not m["gpu"]:
        lines.append("No GPU on this machine: GPU placements were not measurable here, so all-GPU, the rule "
                     "of thumb and every oracle placement with a GPU stage are n/a; the plan is all-CPU.")
    return "\n".join(lines)


def footnotes(rows: list[dict], meta: dict) -> list[str]:
    notes = [
        "k: placeable stages (not pinned, with CPU and GPU implementations); the oracle tries all 2^k "
        f"placements when k <= {ORACLE_LIMIT}. profile: placer's profiling time for the pipeline (once, "
        "shared by both sizes); plan: planning time at this size. Neither is included in 'placer plan'.",
        "*: oracle incomplete (time limit, or k too large): the best placement measured.",
        "digests: same (every placement measured gave the same outputs digest, placer.digest), close (digests "
        "differ, but the outputs agree elementwise within placer.digest's rtol 1e-4, atol 1e-5: values on two "
        "sides of a rounding step) or DIFFER (they do not; the JSON's outputs_differ says where).",
    ]
    for r in rows:
        if r.get("plan_note"):
            notes.append(f"{r['pipeline']}@{r['size']:,}: {r['plan_note']}")
    failed = [f"{r['pipeline']}@{r['size']}: {m['error']} ({on_accelerator(m['placement'])})"
              for r in rows for m in r["measurements"] if m["error"]]
    if failed:
        notes.append("placements that failed: " + "; ".join(failed[:12]))
    preds = [r for r in rows if r.get("h200")]
    if preds:
        notes.append("placer's plan for the described H200 (predicted from this machine's profile; not measured):")
        for r in preds:
            h = r["h200"]
            if "error" in h:
                notes.append(f"  {r['pipeline']}@{r['size']:,}: {h['error']}")
                continue
            bad = (f"; puts {', '.join(h['impossible'])} on the GPU although pinned to the CPU or "
                   "without a GPU implementation" if h.get("impossible") else "")
            notes.append(f"  {r['pipeline']}@{r['size']:,}: GPU stages {on_accelerator(h['placement'])}, "
                         f"predicted {fmt(h['predicted_s'])} vs all-CPU {fmt(h['all_cpu_predicted_s'])}{bad}")
    if meta.get("failed"):
        notes.append("pipelines that failed: " + "; ".join(meta["failed"]))
    if meta.get("skipped"):
        notes.append("not run (time limit): " + ", ".join(meta["skipped"]))
    notes.append(summary(rows, meta))
    return notes


def summary(rows: list[dict], meta: dict) -> str:
    po = [r["plan_over_oracle"] for r in rows if r["plan_over_oracle"]]
    pb = [r["plan_over_best_baseline"] for r in rows if r["plan_over_best_baseline"]]
    if not po:
        return "summary: no case measured"
    one = ("with one device the plan, all-CPU and the oracle are the same placement, so the ratios are 1 by "
           "construction; " if len(meta["devices"]) == 1 else "")
    return (f"summary: {one}{len(rows)} cases; plan/oracle worst {max(po):.2f}×, median {statistics.median(po):.2f}×; "
            f"plan/best-baseline worst {max(pb):.2f}×, median {statistics.median(pb):.2f}×; "
            f"cases within 1.10× of the oracle: {sum(x <= 1.10 for x in po)}/{len(po)}; "
            f"within 1.05× of the best baseline: {sum(x <= 1.05 for x in pb)}/{len(pb)}")


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="table path (default benchmarks/results/advisor-<host>.txt)")
    ap.add_argument("--pipelines", default=",".join(SIZES), help="comma-separated gallery pipelines")
    ap.add_argument("--sizes", default="small,large", help="small, large or both")
    ap.add_argument("--budget-s", type=float, default=6.0, help="profiling budget per pipeline")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per placement (after one warm-up)")
    ap.add_argument("--time-limit-s", type=float, default=450.0, help="stop measuring new cases after this")
    ap.add_argument("--no-oracle", action="store_true", help="skip enumerating every placement")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="re-render the table of a saved run's JSON (nothing is measured)")
    ap.add_argument("--simulated", action="store_true",
                    help="add the simulated device gpu-sim (a labelled test of the machinery, not a GPU)")
    return ap.parse_args(argv)


def setup_env(simulated: bool) -> None:
    """Environment that must be set before placer or numba are imported."""
    if simulated:
        os.environ["PLACER_TEST_DEVICES"] = "1"
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        os.environ.pop("PLACER_TEST_DEVICES", None)
    sys.path.insert(0, str(ROOT))


def sizes_for(name: str, which: list[str], has_gpu: bool, simulated: bool) -> list[int]:
    if simulated:
        small, large = SIMULATED_SIZES[name]
    else:
        small, large_gpu, large_cpu = SIZES[name]
        large = large_gpu if has_gpu else large_cpu
    return [s for label, s in (("small", small), ("large", large)) if label in which]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return rerender(args.from_json, args.out)
    setup_env(args.simulated)
    from placer.advisor import accelerators
    from placer.devices import discover

    inv = discover()
    devices = ["cpu", *accelerators(inv)[:1]]
    meta = {"machine": machine(), "devices": devices, "budget_s": args.budget_s, "reps": args.reps,
            "simulated": args.simulated, "skipped": [], "failed": []}
    names = [s.strip() for s in args.pipelines.split(",") if s.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        print(f"advisor benchmark: unknown pipeline(s) {', '.join(unknown)}; choose from {', '.join(SIZES)}",
              file=sys.stderr)
        return 2
    clock = Clock(args.time_limit_s)
    rows = []
    for name in names:
        if clock.left() < 20:
            meta["skipped"].append(name)
            continue
        sizes = sizes_for(name, args.sizes.split(","), bool(inv.gpus), args.simulated)
        try:
            rows += bench_pipeline(name, sizes, devices, inv, clock, args)
        except Exception as exc:  # noqa: BLE001 - one pipeline's failure is reported, the rest still run
            meta["failed"].append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            print(f"{name}: failed: {meta['failed'][-1]}", file=sys.stderr, flush=True)
    write(rows, meta, args.out)
    return 0


def bench_pipeline(name: str, sizes: list[int], devices: list[str], inv, clock: Clock, args) -> list[dict]:
    """Profile a pipeline once, then measure every size."""
    prof, profile_s = profile_pipeline(name, max(sizes), args.budget_s, inv)
    rows = []
    for size in sizes:
        row = bench_case(name, size, prof, profile_s, devices, inv, clock, args.reps, not args.no_oracle)
        if not inv.gpus and not args.simulated:
            row["h200"] = h200_prediction(prof, size, load_gallery(name, size))
        rows.append(row)
        print(f"{name}@{size:,}: plan {fmt(row['plan_measured_s'])}, oracle {fmt(row['oracle_s'])}, "
              f"{clock.left():.0f} s left", file=sys.stderr, flush=True)
    return rows


def rerender(saved: Path, out: Path | None) -> int:
    """Write the table of a saved run again (after a change to the table's layout)."""
    sys.path.insert(0, str(ROOT))
    from placer.files import write_text_atomic

    doc = json.loads(saved.read_text())
    text = render(doc["rows"], doc["meta"])
    write_text_atomic(out or saved.with_suffix(".txt"), text)
    print(text)
    return 0


def write(rows: list[dict], meta: dict, out: Path | None) -> None:
    from placer.files import write_text_atomic

    suffix = "-simulated" if meta["simulated"] else ""
    out = out or ROOT / "benchmarks" / "results" / f"advisor-{meta['machine']['host']}{suffix}.txt"
    text = render(rows, meta)
    write_text_atomic(out, text)
    write_text_atomic(out.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print(text)
    print(f"written: {out} and {out.with_suffix('.json').name}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
