"""The executor: routing, transfers, concurrency, failures, numba.cuda and dask paths."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from numba import cuda

from placer import Pipeline, StageFailedError
from placer.digest import assert_outputs_close
from placer.executor import execute


def _source(device, n=1000):
    return torch.arange(n, dtype=torch.float32, device=device)


def test_tensor_used_by_two_gpu_stages_crosses_once():
    p = Pipeline("fan")
    p.add(name="src", fn=_source)
    p.add(name="a", fn=lambda src, device: src * 2, inputs=["src"])
    p.add(name="b", fn=lambda src, device: src + 1, inputs=["src"])
    p.add(name="join", fn=lambda a, b, device: a + b, inputs=["a", "b"])
    run = execute(p, "src=cpu,a=gpu-sim,b=gpu-sim,join=gpu-sim")
    h2d = [t for t in run.transfers if t.direction == "h2d"]
    assert [(t.data, t.src, t.dst, t.bytes) for t in h2d] == [("src", "host", "gpu-sim", 4000)]
    d2h = [t for t in run.transfers if t.direction == "d2h"]
    assert [(t.data, t.dst) for t in d2h] == [("join", "host")]
    assert torch.equal(run.final_outputs["join"], torch.arange(1000.0) * 3 + 1)
    assert run.final_outputs["join"].device.type == "cpu"


def test_no_transfer_when_everything_stays_on_one_device():
    p = Pipeline("chain")
    p.add(name="src", fn=_source)
    p.add(name="sq", fn=lambda src, device: src * src, inputs=["src"])
    run = execute(p, "all=cpu")
    assert run.transfers == []
    assert run.executor == "inline"
    assert [s.name for s in run.stages] == ["src", "sq"]
    assert all(s.device == "cpu" for s in run.stages)


def _sleeper(seconds):
    def fn(src, device):
        time.sleep(seconds)
        return src + seconds

    return fn


def test_cpu_and_gpu_branches_run_at_the_same_time():
    p = Pipeline("branches")
    p.add(name="src", fn=_source)
    p.add(name="cpu_branch", fn=_sleeper(0.4), inputs={"src": "src"})
    p.add(name="gpu_branch", fn=_sleeper(0.4), inputs={"src": "src"})
    p.add(name="merge", fn=lambda a, b, device: a + b, inputs={"a": "cpu_branch", "b": "gpu_branch"})
    run = execute(p, "all=cpu,gpu_branch=gpu-sim", workers=1)
    c, g = run.stage("cpu_branch"), run.stage("gpu_branch")
    assert run.executor == "threads"
    assert c.lane == "cpu/0" and g.lane == "gpu-sim"
    assert c.start_s < g.end_s and g.start_s < c.end_s, "the two branches did not overlap"


def test_one_cpu_worker_serialises_cpu_stages():
    p = Pipeline("two_cpu")
    p.add(name="src", fn=_source)
    p.add(name="a", fn=_sleeper(0.1), inputs={"src": "src"})
    p.add(name="b", fn=_sleeper(0.1), inputs={"src": "src"})
    run = execute(p, "all=cpu", workers=1, executor="threads")
    a, b = run.stage("a"), run.stage("b")
    assert a.end_s <= b.start_s, "with one worker, a (lower priority index) runs before b"


def test_failing_stage_is_named_and_finished_outputs_are_kept():
    p = Pipeline("fails")
    p.add(name="src", fn=_source)
    p.add(name="ok", fn=lambda src, device: src * 2, inputs=["src"])

    def boom(ok, device):
        raise RuntimeError("bad batch")

    p.add(name="boom", fn=boom, inputs=["ok"])
    p.add(name="after", fn=lambda boom, device: boom, inputs=["boom"])
    with pytest.raises(StageFailedError, match="stage 'boom' failed on cpu: RuntimeError: bad batch") as e:
        execute(p, "all=cpu")
    err = e.value
    assert err.stage == "boom"
    assert set(err.outputs) == {"src", "ok"}
    assert torch.equal(err.outputs["ok"], torch.arange(1000.0) * 2)
    assert err.run.failed_stage == "boom"
    assert [s.status for s in err.run.stages] == ["ok", "ok", "failed"]


def _ema_cpu(x, alpha):
    from numba import njit

    @njit(cache=False)
    def ema(a, alpha):
        out = np.empty_like(a)
        acc = a[0]
        for i in range(a.shape[0]):
            acc = alpha * a[i] + (1 - alpha) * acc
            out[i] = acc
        return out

    return ema(x, alpha)


@cuda.jit
def _ema_kernel(a, out, alpha):
    if cuda.grid(1) == 0:
        acc = a[0]
        for i in range(a.shape[0]):
            acc = alpha * a[i] + (1 - alpha) * acc
            out[i] = acc


def _ema_gpu(x, alpha):
    out = cuda.device_array_like(x)
    _ema_kernel[1, 1](x, out, alpha)
    return out


def test_numba_cuda_kernel_stage_matches_njit_stage():
    p = Pipeline("ema")
    p.add(name="src", fn=lambda device: torch.linspace(0, 1, 64, device=device))
    p.add(name="ema", cpu=_ema_cpu, inputs={"x": "src"}, params={"alpha": 0.3},
          gpu={"fn": _ema_gpu, "api": "numba.cuda"})
    p.add(name="total", fn=lambda ema, device: ema * 2, inputs=["ema"])
    cpu = execute(p, "all=cpu")
    gpu = execute(p, "all=cpu,ema=gpu-sim")
    assert gpu.stage("ema").device == "gpu-sim"
    assert_outputs_close(cpu.final_outputs, gpu.final_outputs)
    assert cpu.outputs_digest == gpu.outputs_digest
    assert isinstance(cpu.outputs["ema"], np.ndarray)
    assert isinstance(gpu.outputs["ema"], torch.Tensor)


def test_data_parallel_cpu_stage_is_split_into_partitions_with_dask():
    calls = []
    lock = threading.Lock()

    def rowwise(x):
        with lock:
            calls.append(x.shape[0])
        return np.sqrt(np.abs(x)) * 2

    p = Pipeline("dp")
    p.add(name="src", cpu=lambda: np.linspace(-1, 1, 40_000).reshape(-1, 4), inputs=[])
    p.add(name="rows", cpu=rowwise, inputs={"x": "src"}, data_parallel=True)
    run = execute(p, "all=cpu", workers=2)
    assert sorted(calls) == [5000, 5000]
    expected = np.sqrt(np.abs(np.linspace(-1, 1, 40_000).reshape(-1, 4))) * 2
    np.testing.assert_array_equal(run.final_outputs["rows"], expected)
    calls.clear()
    execute(p, "all=cpu", workers=1)
    assert calls == [10_000]


def test_model_objects_are_copied_not_moved_in_place():
    p = Pipeline("model")
    p.add(name="net", fn=lambda device: torch.nn.Linear(3, 2).to(device))
    p.add(name="use", fn=lambda net, device: net(torch.ones(1, 3, device=device)), inputs=["net"])
    run = execute(p, "net=cpu,use=gpu-sim")
    moved = [t for t in run.transfers if t.data == "net"]
    assert moved and moved[0].bytes == (3 * 2 + 2) * 4
    assert run.outputs["net"] is not None


def test_run_record_serialises_with_required_fields():
    p = Pipeline("rec")
    p.add(name="src", fn=_source)
    p.add(name="twice", fn=lambda src, device: src * 2, inputs=["src"])
    doc = execute(p, "src=cpu,twice=gpu-sim", size=1000).summary()
    assert {"pipeline", "makespan_s", "stages", "transfers", "outputs_digest"} <= set(doc)
    assert {"name", "device", "start_s", "end_s", "seconds"} <= set(doc["stages"][0])
    assert {"src", "dst", "bytes", "seconds"} <= set(doc["transfers"][0])
    assert doc["makespan_s"] >= max(s["end_s"] for s in doc["stages"])
    assert doc["devices"]["gpu-sim"].startswith("simulated test device")
