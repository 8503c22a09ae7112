"""The drop-in's advice on the plain scripts, by two versions of placer, interleaved script by script.

Usage::

    python benchmarks/dropin_versions.py --before DIR --after DIR [--scripts a,b] [--out FILE]

``DIR`` is a checkout of placer (``git worktree add DIR COMMIT``). Each plain script of
``benchmarks/plain/`` (taken from this checkout, so both versions advise on the same script)
runs once with ``--placer-advice`` under each version (``PYTHONPATH=DIR``), the two runs of a
script back to back, the version that goes first alternating from script to script so that
the machine's drift falls on both alike. Each run's last line is the script's own JSON: the
settings the advice chose, its claimed speed-up, whether it offered a cache, and the script's
loop timed with the advice applied. The table says, per script, whether the two versions
chose the same settings, and the ratio of their loops' samples/s (one run each: a ratio
within the scripts' run-to-run spread, about ±10 % on this machine's quiet runs in
``benchmarks/results/plain-*``, is noise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLAIN = HERE / "plain"
SCRIPTS = ["images_train", "table_train", "text_infer", "audio_cache_train", "mlp_big_train", "numpy_augment_infer"]
KEYS = ("num_workers", "worker_kind", "prefetch_factor", "persistent_workers", "pin_memory", "torch_threads",
        "in_order", "threads_per_worker", "cache")


def run(script: str, placer_dir: Path, data: Path, timeout_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(placer_dir), "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(PLAIN / f"{script}.py"), "--placer-advice", "--data-dir", str(data)],
                         env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout)[-800:], "wall_s": round(wall, 1)}
    doc = json.loads(lines[-1])
    return {**doc, "wall_s": round(wall, 1)}


def chosen(doc: dict) -> dict:
    advice = doc.get("advice") or {}
    return {k: advice.get(k) for k in KEYS if k in advice}


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--after", required=True, type=Path)
    ap.add_argument("--scripts", default=",".join(SCRIPTS))
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=None, help="a Markdown file (and the JSON beside it)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="placer-versions-") as tmp:
        for i, script in enumerate(a.scripts.split(",")):
            data = Path(tmp) / script
            order = [("before", a.before), ("after", a.after)]
            if i % 2:
                order.reverse()
            got = {}
            for name, where in order:
                load = os.getloadavg()[0]
                got[name] = {**run(script, where, data, a.timeout_s), "load": round(load, 2)}
                print(script, name, json.dumps({k: got[name].get(k) for k in ("samples_per_s", "wall_s", "load")}),
                      chosen(got[name]), flush=True)
            rows.append({"script": script, "first": order[0][0], **got})
    lines = [f"# The drop-in's advice on the plain scripts: {a.before.name} against {a.after.name}", "",
             f"Machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One run of each script "
             "with `--placer-advice` per version, the two back to back (`benchmarks/dropin_versions.py`).", "",
             "| script | first | same choice | before: choice | after: choice | claimed before / after | "
             "loop samples/s before / after | after ÷ before | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, f = r["before"], r["after"]
        if "error" in b or "error" in f:
            lines.append(f"| {r['script']} | {r['first']} | error | {b.get('error', '')[:80]} | "
                         f"{f.get('error', '')[:80]} | | | | |")
            continue
        cb, cf = chosen(b), chosen(f)
        # a setting one version has no word for counts as its default (in_order True, no threads per worker)
        default = {"in_order": True, "threads_per_worker": None}
        same = all(cb.get(k, default.get(k)) == cf.get(k, default.get(k)) for k in set(cb) | set(cf))
        ratio = f["samples_per_s"] / max(b["samples_per_s"], 1e-12)

        def short(c):
            return ", ".join(f"{k}={v}" for k, v in c.items() if v not in (None, False) or k == "num_workers")
        lines.append(f"| {r['script']} | {r['first']} | {'yes' if same else 'no'} | {short(cb)} | {short(cf)} | "
                     f"{b['advice']['claimed_speedup']:.2f} / {f['advice']['claimed_speedup']:.2f} | "
                     f"{b['samples_per_s']:,.0f} / {f['samples_per_s']:,.0f} | {ratio:.2f} | "
                     f"{b['load']:.1f} / {f['load']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out is not None:
        a.out.write_text(text)
        a.out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
