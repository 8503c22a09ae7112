"""Real-GPU checks (marked ``gpu``; skipped with the reason where no CUDA GPU exists).

Run on a GPU machine with ``PLACER_REAL_GPU=1 python -m pytest -m gpu`` so that numba.cuda
uses the real device instead of its simulator.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from placer import Pipeline
from placer.devices import refresh
from placer.digest import assert_outputs_close
from placer.executor import execute
from placer.executor.transfer import PIN_THRESHOLD, to_location
from placer.loader import load_pipeline

pytestmark = pytest.mark.gpu


def test_gpu_is_discovered_as_a_gpu():
    inv = refresh()
    gpus = inv.gpus
    assert gpus and gpus[0].name == "gpu:0" and gpus[0].kind == "gpu"
    assert gpus[0].memory_bytes > 0
    assert "torch" in gpus[0].backends


def test_large_host_to_gpu_copy_is_pinned_and_exact():
    dev = refresh().get("gpu:0")
    a = np.arange(PIN_THRESHOLD // 4 * 2, dtype=np.float32)
    moved, nb, pinned = to_location(a, dev)
    assert pinned and nb == a.nbytes and moved.device.type == "cuda"
    back, nb2, _ = to_location(moved, refresh().get("cpu"))
    np.testing.assert_array_equal(back.numpy(), a)
    small, _, pinned_small = to_location(np.ones(16, np.float32), dev)
    assert not pinned_small and small.device.type == "cuda"


@pytest.mark.parametrize("ref,size", [("pipelines/tabular.py", 4000), ("pipelines/requests.py", 64)])
def test_bundled_pipelines_same_outputs_on_every_placement_with_a_real_gpu(ref, size):
    p = load_pipeline(ref, size)
    base = execute(p, "all=cpu")
    names = p.order()
    for devs in itertools.product(("cpu", "gpu"), repeat=len(names)):
        run = execute(p, dict(zip(names, devs)))
        assert_outputs_close(base.final_outputs, run.final_outputs, rtol=2e-3, atol=2e-4)
        assert all(t.src in ("host", "gpu:0") and t.dst in ("host", "gpu:0") for t in run.transfers)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
                    reason="numba.cuda is in simulator mode; set PLACER_REAL_GPU=1 to use the GPU")
def test_numba_cuda_kernel_on_the_real_gpu():
    from numba import cuda

    @cuda.jit
    def double(a, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = 2 * a[i]

    def gpu_impl(x):
        out = cuda.device_array_like(x)
        double[(x.shape[0] + 255) // 256, 256](x, out)
        return out

    p = Pipeline("k")
    p.add(name="src", fn=lambda device: torch.arange(10_000, dtype=torch.float32, device=device))
    p.add(name="dbl", cpu=lambda x: 2 * x, gpu={"fn": gpu_impl, "api": "numba.cuda"}, inputs={"x": "src"})
    cpu = execute(p, "all=cpu")
    gpu = execute(p, "all=gpu")
    assert gpu.stage("dbl").device == "gpu:0"
    assert_outputs_close(cpu.final_outputs, gpu.final_outputs)


def test_a_copy_without_pinning_stays_pageable():
    dev = refresh().get("gpu:0")
    a = np.arange(PIN_THRESHOLD // 4 * 2, dtype=np.float32)
    moved, nb, pinned = to_location(a, dev, pin=False)
    assert not pinned and nb == a.nbytes and moved.device.type == "cuda"


@pytest.mark.parametrize("placement", ["all=gpu", "all=cpu,train=gpu", "all=cpu,augment=gpu"])
def test_a_stream_on_a_real_gpu_matches_the_sequential_cpu_run(placement):
    from placer.stream import StreamConfig

    p = load_pipeline("pipelines/stream_images.py", 128)
    base = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    for pin in (True, False):
        run = execute(p, placement, stream=StreamConfig(workers=2, pin_memory=pin))
        assert run.streams[0].batches == base.streams[0].batches
        assert_outputs_close(base.final_outputs, run.final_outputs, rtol=2e-3, atol=2e-4)
