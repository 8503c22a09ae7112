"""Test setup: the simulated test device, numba's CUDA simulator, a private cache.

These must be set before numba or placer.devices are imported, so they are set here,
at collection time. ``gpu-sim`` is a test stand-in: it runs GPU implementations on
the CPU, so routing, transfers and concurrency are exercised without a GPU. Profiles
are cached in a fresh folder per test session, so no test depends on what an earlier
run (or a benchmark) left in ``~/.cache/placer``. The drop-in's runs stay in the test's process
(``PLACER_FRESH_RUNS=0``) unless a test asks for fresh ones. Under ``CI`` hypothesis draws the
same examples every run, so a red run can be reproduced.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("PLACER_TEST_DEVICES", "1")
if os.environ.get("PLACER_REAL_GPU") != "1":
    # on the GPU machine, PLACER_REAL_GPU=1 keeps numba.cuda on the real device
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# the drop-in's unit tests fake its runs or count their steps in their own process; tests/stream/test_dropin_fresh.py
# asks for fresh processes itself
os.environ.setdefault("PLACER_FRESH_RUNS", "0")
_CACHE = os.environ["PLACER_CACHE_DIR"] = tempfile.mkdtemp(prefix="placer-test-cache-")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_sessionfinish(session, exitstatus):
    import shutil

    shutil.rmtree(_CACHE, ignore_errors=True)


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


@pytest.fixture(scope="module")
def client(cluster):
    """A dask Client on the module's own ``cluster`` fixture (127.0.0.1 only), once two workers are up."""
    from distributed import Client

    with Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=60)
        yield c
