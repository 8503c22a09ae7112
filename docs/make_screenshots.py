"""Regenerate docs/report-<pipeline>.png: advise each bundled pipeline, screenshot the HTML.

Needs headless Chromium (Debian: ``apt-get install chromium``).

    python docs/make_screenshots.py [NAME ...]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPELINES = ["tabular", "requests", "batched_inference", "timeseries", "branches", "cifar_augment",
             "mnist_mlp", "mnist_cnn", "etl_dask"]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1280,3600"]


def main(names: list[str]) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("headless Chromium is needed: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or PIPELINES:
            html = Path(tmp) / f"report-{name}.html"
            subprocess.run([sys.executable, "-m", "placer", "advise", f"pipelines.{name}:build",
                            "-o", str(html), "--budget-s", "10"], check=True, cwd=HERE.parent)
            png = HERE / f"report-{name}.png"
            subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp}/profile-{name}",
                            f"--screenshot={png}", html.as_uri()], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
            print(f"wrote {png}")


if __name__ == "__main__":
    main(sys.argv[1:])
