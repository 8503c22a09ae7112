"""Test setup: the simulated test device and numba's CUDA simulator.

Both must be set before numba or placer.devices are imported, so they are set here,
at collection time. ``gpu-sim`` is a test stand-in: it runs GPU implementations on
the CPU, so routing, transfers and concurrency are exercised without a GPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("PLACER_TEST_DEVICES", "1")
if os.environ.get("PLACER_REAL_GPU") != "1":
    # on the GPU machine, PLACER_REAL_GPU=1 keeps numba.cuda on the real device
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (none on this machine); run with the gpu marker on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sim_env(monkeypatch):
    """Environment for CLI subprocesses: the simulated device and CUDA simulator on."""
    env = dict(os.environ)
    env["PLACER_TEST_DEVICES"] = "1"
    env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    return env
