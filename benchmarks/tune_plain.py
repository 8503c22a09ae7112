"""``placer tune`` on the plain scripts, scored by running each script with the recommended settings.

For each script of ``benchmarks/plain/``:

1. ``placer tune --json -- python SCRIPT --data-dir D`` on the script as it is (its own size and
   epochs), timed from start to end (the goal: at most 2 minutes per script on 2 cores,
   the script's own start-ups included);
2. the recommendation written as the script's own flags (``--num-workers``, ``--worker-kind``,
   ``--prefetch-factor``, ``--persistent-workers``, ``--pin-memory``, ``--threads``); where it
   keeps a cache inside the Dataset, which no flag of the script is, the script as written run
   under ``placer tune --apply FILE`` (the settings and the cache applied by the hook, as a user
   would run it);
3. a final comparison, ``--rounds`` interleaved rounds in a shuffled order of: the script as
   written, the recommendation as flags, and the best configurations of a recorded
   exhaustive grid on this kind of machine (``--grid``, a ``plain_grid.py`` results JSON),
   re-measured here beside the others, each scored by the script's own clock (its whole loop,
   epochs and worker start-up included). Every run's batch digest is checked against the
   script as written.

Scored: the recommendation's median samples/s over the best median of the final rounds
(bar: at least 0.90), and ``placer tune``'s claimed speed-up over the one the final rounds
measured against the script as written (bar: within 20 %).

    python benchmarks/tune_plain.py --machine vm-epyc
    python benchmarks/tune_plain.py --scripts table_train,text_infer --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _machine import describe  # noqa: E402
from plain_grid import PLAIN, SCRIPTS, Config, config_from_flags, interleaved, run_script, stats  # noqa: E402

GRID = HERE / "results" / "plain-vm-epyc-quiet-v40-screened.json"


def flags_of(rec: dict) -> Config:
    """``placer tune``'s recommendation (its JSON) as the plain scripts' flags."""
    w = rec["num_workers"]
    return Config(num_workers=w, worker_kind="thread" if rec["worker_kind"] in ("threads", "thread") else "process",
                  prefetch_factor=rec["prefetch_factor"] if w else None,
                  persistent_workers=bool(rec["persistent_workers"]), pin_memory=bool(rec["pin_memory"]),
                  threads=rec["torch_threads"])


def grid_best(path: Path, script: str, top: int) -> dict[str, Config]:
    """The recorded grid's best configurations of ``script`` (by their final-round medians)."""
    data = json.loads(path.read_text())
    for entry in data["scripts"]:
        if entry["script"] != script:
            continue
        args = {r["label"]: r["args"] for r in entry["runs"] if r["phase"] == "final"}
        grid = [k for k in entry["final"] if k.startswith("grid #") and k in args][:top]
        return {k: config_from_flags(" ".join(args[k])) for k in grid}
    return {}


def tune(script: str, base: list[str], budget_s: float, log) -> tuple[dict | None, float, str]:
    cmd = [sys.executable, "-m", "placer", "tune", "--json", "--budget-s", str(budget_s), "--",
           sys.executable, str(PLAIN / f"{script}.py"), *base]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=budget_s * 3 + 120)
    wall = time.perf_counter() - t0
    log(f"  placer tune: {wall:.0f} s, exit {p.returncode}")
    if p.returncode != 0:
        return None, wall, p.stderr[-2000:]
    return json.loads(p.stdout), wall, p.stderr[-4000:]


def bench(script: str, a: argparse.Namespace, data_dir: Path, log) -> dict:
    base = ["--data-dir", str(data_dir)]
    log(f"{script}")
    ref = run_script(script, None, base=base, phase="reference", timeout_s=a.timeout_s)  # writes the data once
    tuned, tune_s, tune_log = tune(script, base, a.budget_s, log)
    out = {"script": script, "tune_s": round(tune_s, 1), "tune": tuned, "tune_log": tune_log,
           "reference_ok": ref.ok}
    if tuned is None:
        return out
    rec = flags_of(tuned["recommended"])
    configs: dict[str, Config | None] = {"as written": None, "placer tune": rec if tuned["change"] else None}
    prefixes = {}
    if tuned["recommended"].get("cache"):
        saved = data_dir / "tuned.json"
        saved.write_text(json.dumps(tuned))
        configs["placer tune"] = None
        prefixes["placer tune"] = [sys.executable, "-m", "placer", "tune", "--apply", str(saved), "--"]
    configs |= grid_best(Path(a.grid), script, a.top)
    runs = interleaved(script, configs, a.rounds, base=base, phase="final", timeout_s=a.timeout_s, seed=0, log=log,
                       prefixes=prefixes)
    written_digest = next((r.digest for r in runs["as written"] if r.ok), ref.digest)
    mismatch = sorted({k for k, rs in runs.items() for r in rs if r.ok and r.digest != written_digest})
    st = {k: stats(v) for k, v in runs.items()}
    best = max(s["median"] for s in st.values() if s["median"])
    written = st["as written"]["median"]
    measured = st["placer tune"]["median"] / written
    out |= {"configs": {k: (c.args() if c else []) for k, c in configs.items()}, "final": st,
            "score_vs_best": round(st["placer tune"]["median"] / best, 3),
            "claimed": tuned["speedup"], "measured": round(measured, 3),
            "claimed_vs_measured": round(tuned["speedup"] / measured, 3),
            "best_vs_written": round(best / written, 3), "digest_mismatch": mismatch,
            "runs": {k: [r.samples_per_s for r in v] for k, v in runs.items()}}
    log(f"  score {out['score_vs_best']}, claimed {out['claimed']}x, measured {out['measured']}x")
    return out


def table(results: list[dict]) -> list[str]:
    lines = ["| script | recommended | tune time | score vs grid's best | claimed | measured | claimed / measured | "
             "grid's best vs as written | batch digests vs as written |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("tune") is None:
            lines.append(f"| {r['script']} | placer tune failed | {r['tune_s']} s | | | | | | |")
            continue
        rec = flags_of(r["tune"]["recommended"]).label() if r["tune"]["change"] else "keep your settings"
        if (r["tune"]["recommended"].get("cache") or {}).get("method"):
            rec += f", cache {r['tune']['recommended']['cache']['method']} (--apply)"
        lines.append(f"| {r['script']} | {rec} | {r['tune_s']:.0f} s | {r['score_vs_best']:.2f} | {r['claimed']:.2f}x | "
                     f"{r['measured']:.2f}x | {r['claimed_vs_measured']:.2f} | {r['best_vs_written']:.2f}x | "
                     f"{'placer tune: same' if 'placer tune' not in r['digest_mismatch'] else 'placer tune: DIFFER'}"
                     + (f"; differ: {', '.join(r['digest_mismatch'])}" if r['digest_mismatch'] else "") + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default=",".join(SCRIPTS))
    ap.add_argument("--budget-s", type=float, default=120.0, help="placer tune's budget per script")
    ap.add_argument("--rounds", type=int, default=4, help="final interleaved rounds")
    ap.add_argument("--top", type=int, default=2, help="recorded grid configurations re-measured")
    ap.add_argument("--grid", default=str(GRID))
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--machine", default="vm")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    t0 = time.time()
    load0 = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="placer-tune-bench-") as data:
        for s in a.scripts.split(","):
            results.append(bench(s, a, Path(data) / s, lambda m: print(m, file=sys.stderr, flush=True)))
            write(a, t0, load0, results)  # after each script: a stopped run keeps what it measured
    print("\n".join(table(results)))


def write(a: argparse.Namespace, t0: float, load0: tuple, results: list[dict]) -> None:
    head = {"machine": describe(), "load_start": [round(x, 2) for x in load0],
            "load_end": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.time() - t0),
            "command": " ".join(["python", "benchmarks/tune_plain.py", *sys.argv[1:]]), "grid": Path(a.grid).name}
    out = Path(a.out)
    (out / f"tune-plain-{a.machine}.json").write_text(json.dumps({**head, "scripts": results}, indent=1) + "\n")
    md = [f"# placer tune on the plain scripts ({a.machine})", "", head["machine"], "",
          f"Load average at the start {head['load_start']}, at the end {head['load_end']}; {head['seconds']} s in all. "
          f"Command: `{head['command']}`. The grid's best: the recorded grid `{head['grid']}`'s best configurations, "
          f"re-measured in the same interleaved rounds.", "", *table(results), ""]
    (out / f"tune-plain-{a.machine}.md").write_text("\n".join(md))


if __name__ == "__main__":
    main()
