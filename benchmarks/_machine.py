"""The machine a benchmark ran on, for the header of its recorded results."""

from __future__ import annotations

import datetime
import os
import platform


def describe() -> str:
    """One line: CPU model, cores, GPU (if any), Python, torch, date."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        tv = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:
        tv, gpu = "not installed", "unknown"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"machine: {model}, {os.cpu_count()} cores, {gpu}; Python {platform.python_version()}, "
            f"torch {tv}; {now}")
