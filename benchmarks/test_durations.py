"""The test suite's time per file, from the output of ``pytest --durations=0``.

    python benchmarks/test_durations.py before.txt [after.txt]

prints a Markdown table of each test file's seconds (setup, call and teardown of its tests summed),
largest first, with the run's wall time from its last line; with two outputs, both side by side.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

LINE = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S+?)::")
TOTAL = re.compile(r"in ([\d.]+)s")


def per_file(path: str) -> tuple[Counter, float | None]:
    files: Counter = Counter()
    wall = None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line)
        if m:
            files[m.group(3)] += float(m.group(1))
        elif (" passed" in line or " failed" in line) and (t := TOTAL.search(line)):
            wall = float(t.group(1))
    return files, wall


def main(paths: list[str]) -> None:
    runs = [per_file(p) for p in paths]
    names = sorted(set().union(*(r[0] for r in runs)), key=lambda f: -runs[0][0].get(f, 0.0))
    head = ["file", *[f"run {i + 1} (s)" for i in range(len(runs))]]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for f in names:
        print(f"| {f} | " + " | ".join(f"{r[0].get(f, 0.0):.1f}" for r in runs) + " |")
    print("| **sum of the files** | " + " | ".join(f"**{sum(r[0].values()):.0f}**" for r in runs) + " |")
    print("| **wall time** | " + " | ".join(f"**{r[1]:.0f}**" if r[1] else "?" for r in runs) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
