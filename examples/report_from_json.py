"""Produce a report from saved JSON, without running anything again.

Step 1 saves the results of an advise run (profile, plan, the plan's run, the
baselines' runs, the cost table and the machine's devices) as JSON files in a folder; the command line
does the same with ``placer advise PIPELINE --save FOLDER``. Step 2 reads only
those files and writes an HTML and a Markdown report: it needs neither the
pipeline's code nor a device, so it can run on another machine, later.

    python examples/report_from_json.py [folder]      # default: ./placer-results
"""

import sys
from pathlib import Path

PIPELINE = "pipelines.timeseries:build"


def save_results(folder: Path) -> None:
    """Step 1: profile, plan and run a pipeline here, and save every result as JSON."""
    from placer.advisor import advise

    advise(PIPELINE, size=20_000, budget_s=3.0, target="none").save(folder)


def make_reports(folder: Path) -> None:
    """Step 2: reports from the saved files alone."""
    from placer.report import report

    baselines = {p.stem[len("run-"):]: p for p in sorted(folder.glob("run-*.json"))}
    for name in ("report.html", "report.md"):
        facts = report(folder / name, plan=folder / "plan.json", run=folder / "run.json",
                       baselines=baselines, costs=folder / "costs.json",
                       inventory=folder / "inventory.json")
        print(f"wrote {folder / name}")
    print(facts.summary.headline)


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "placer-results")
    if not (folder / "plan.json").exists():
        save_results(folder)
        print(f"saved {', '.join(sorted(p.name for p in folder.glob('*.json')))} in {folder}")
    make_reports(folder)
