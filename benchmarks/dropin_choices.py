"""Whether two versions' drop-in advice differs beyond noise: their chosen settings run as the script's flags.

Usage::

    python benchmarks/dropin_choices.py RECORD.md [--rounds 5] [--out FILE]

``RECORD.md`` is a record of :mod:`dropin_versions` (one or more of its tables). One run of a
plain script whose loop lasts about a second swings by a quarter on a shared 2-core machine, so
comparing the two versions' *advice runs* (each timed once) cannot tell a changed advice from
noise. This asks the question the advice answers instead: for each script where the versions chose
different settings in any pair of the record, every distinct setting either version chose is run as
the script's own flags (``plain_grid.Config``, no placer in the process), in ``--rounds``
interleaved rounds in a shuffled order, and the settings are compared by the rule the drop-in itself
decides by (:func:`placer.stream.rounds.beats`: a median gain of 5 % and a win beyond the runs'
spread or a one-sided sign test over the rounds); where a median gain shows and the rounds do not
decide it, twice as many rounds again are run and the comparison is made over all of them. The advice is *unchanged within noise* for a
script when no setting one version chose beats a setting the other chose, in either direction.
Every run's batch digest is checked against the first: a setting must not change the batches.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from plain_grid import Config, config_from_advice, interleaved  # noqa: E402
from dropin_versions import machine  # noqa: E402
from placer.stream.rounds import beats, faster  # noqa: E402

ROW = re.compile(r"^\| (\w+) \| (before|after) \| (yes|no) \| ([^|]*) \| ([^|]*) \|")


def choice(text: str) -> Config:
    """A table's choice (``num_workers=1, worker_kind=threads, prefetch_factor=4, torch_threads=1``) as flags."""
    advice: dict = {"change": True}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, v = part.split("=", 1)
        advice[k] = True if v == "True" else int(v) if v.isdigit() else v
    return config_from_advice(advice)


def pairs_of(record: Path) -> dict[str, list[tuple[Config, Config]]]:
    """Script -> the (before, after) choices of each of its rows in the record."""
    out: dict[str, list[tuple[Config, Config]]] = {}
    for line in record.read_text().splitlines():
        m = ROW.match(line)
        if m:
            out.setdefault(m.group(1), []).append((choice(m.group(4)), choice(m.group(5))))
    return out


def close(rates: dict[str, list[float]], sides: dict[str, set]) -> bool:
    """Whether a setting of one side is :data:`MIN_GAIN` faster on the median than one of the other's while
    the rounds do not decide it (:func:`beats`)."""
    for x, y in itertools.product(sides["before"], sides["after"]):
        for m, n in ((x.label(), y.label()), (y.label(), x.label())):
            if m != n and rates[m] and rates[n] and faster(statistics.median(rates[m]), statistics.median(rates[n])) \
                    and not beats(rates[m], rates[n]):
                return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=None, help="a Markdown file (and the JSON beside it)")
    a = ap.parse_args()
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="placer-choices-") as tmp:
        for script, pairs in pairs_of(a.record).items():
            if all(b == f for b, f in pairs):
                rows.append({"script": script, "same": True})
                continue
            sides = {"before": {b for b, _ in pairs}, "after": {f for _, f in pairs}}
            configs = {c.label(): c for c in sorted(sides["before"] | sides["after"], key=Config.label)}
            base = ["--data-dir", str(Path(tmp) / script)]
            runs = interleaved(script, configs, a.rounds, base=base, phase="choices", timeout_s=a.timeout_s, seed=0,
                               log=lambda m: print(m, flush=True))
            rates = {k: [r.samples_per_s for r in rs if r.ok] for k, rs in runs.items()}
            if close(rates, sides):
                # a gain the medians show and the rounds do not decide: twice as many rounds again, as the
                # drop-in settles a close comparison
                more = interleaved(script, configs, 2 * a.rounds, base=base, phase="settle", timeout_s=a.timeout_s,
                                   seed=1, log=lambda m: print(m, flush=True))
                runs = {k: runs[k] + more[k] for k in runs}
                rates = {k: [r.samples_per_s for r in rs if r.ok] for k, rs in runs.items()}
            digests = {r.digest for rs in runs.values() for r in rs if r.ok}
            beaten = sorted({(m.label(), n.label()) for x, y in itertools.product(sides["before"], sides["after"])
                             for m, n in ((x, y), (y, x)) if m != n and beats(rates[m.label()], rates[n.label()])})
            rows.append({"script": script, "same": False, "before": sorted(c.label() for c in sides["before"]),
                         "after": sorted(c.label() for c in sides["after"]), "rates": rates,
                         "medians": {k: statistics.median(v) if v else None for k, v in rates.items()},
                         "beaten": beaten, "batches_equal": len(digests) == 1,
                         "errors": [r.error[-300:] for rs in runs.values() for r in rs if not r.ok]})
    lines = [f"# The two versions' chosen settings run as the scripts' flags ({a.record.name})", "",
             f"Machine: {machine()}; {started}, load average {os.getloadavg()[0]:.1f} at the end. "
             f"{a.rounds} interleaved rounds per script, {3 * a.rounds} where a median gain was left undecided "
             "(`benchmarks/dropin_choices.py`).", "",
             "| script | settings chosen before | settings chosen after | median samples/s of each (runs) | "
             "beats another beyond noise | batches equal |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["same"]:
            lines.append(f"| {r['script']} | the same in every pair | | | | |")
            continue
        med = "; ".join(f"{k}: {m:,.0f} ({len(r['rates'][k])})" for k, m in r["medians"].items() if m)
        beat = "; ".join(f"{x} beats {y}" for x, y in r["beaten"]) or "none"
        lines.append(f"| {r['script']} | {'; '.join(r['before'])} | {'; '.join(r['after'])} | {med} | {beat} | "
                     f"{'yes' if r['batches_equal'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out is not None:
        a.out.write_text(text)
        a.out.with_suffix(".json").write_text(json.dumps(rows, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
