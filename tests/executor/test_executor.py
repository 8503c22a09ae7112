"""The executor's behaviours, each on every kind of lanes: inline, threads and dask.

- ``inline``: every stage and copy runs in the calling thread (``InlineLanes``);
- ``threads``: a pool of threads per lane (``ThreadLanes``);
- ``dask``: ``DaskLanes`` on a dask.distributed cluster inside this process, started
  once for the module: a CPU worker and a worker that declares ``GPU=1`` (and so
  runs ``gpu-sim`` stages), two threads each. The two workers differ, so the
  cluster is a ``SpecCluster`` of in-process ``Worker``\\ s rather than a
  ``LocalCluster``.

A behaviour that does not apply to a kind of lanes is skipped there with the
reason. What only a cluster does (connecting, faults, worker processes, the CLI)
is tested in test_distributed.py.

The diamond pipeline (also run on worker processes there)::

    load ──▶ left ──▶ join
      └────▶ right ───┘

``left`` has separate numpy (CPU) and torch (GPU) implementations; the others are
device-agnostic torch functions.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from numba import cuda

from placer import Pipeline, StageFailedError
from placer.digest import assert_outputs_close
from placer.executor import execute

LANES = ["inline", "threads", "dask"]
#: the ``executor`` a run of each kind of lanes records
RECORDED = {"inline": "inline", "threads": "threads", "dask": "distributed"}


# -- the diamond ----------------------------------------------------------------------------
def _load(device, n: int):
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 8, generator=g).to(device)


def _left_cpu(load):
    return np.tanh(load) * 2.0


def _left_gpu(load):
    return torch.tanh(load) * 2.0


def _right(load, device, marker: str | None = None, sleep_s: float = 0.0):
    if marker:
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(sleep_s)
    return (load**2).sum(1, keepdim=True)


def _join(left, right, device):
    left = torch.as_tensor(left, device=device)
    return {"mixed": left * right, "total": (left.sum() + right.sum()).reshape(1)}


def diamond(n: int = 2000, marker: str | None = None, sleep_s: float = 0.0) -> Pipeline:
    """The diamond; ``right`` appends its process id to ``marker`` and sleeps, when given."""
    p = Pipeline("diamond", size=n)
    p.add(name="load", fn=_load, params={"n": n})
    p.add(name="left", cpu=_left_cpu, gpu=_left_gpu, inputs=["load"])
    p.add(name="right", fn=_right, inputs=["load"], params={"marker": marker, "sleep_s": sleep_s})
    p.add(name="join", fn=_join, inputs=["left", "right"])
    return p


#: the diamond with its GPU implementations on the simulated device
GPU_STAGES = "all=cpu,left=gpu-sim,join=gpu-sim"


# -- lanes ------------------------------------------------------------------------------------
class Lanes:
    """Runs pipelines on one kind of lanes (``client``: the cluster's, for ``dask``)."""

    def __init__(self, kind: str, client=None):
        self.kind = kind
        self.client = client

    def run(self, p: Pipeline, placement: str, **kwargs):
        if self.client is not None:
            run = execute(p, placement, scheduler=self.client, **kwargs)
        else:
            run = execute(p, placement, executor=self.kind, **kwargs)
        assert run.executor == RECORDED[self.kind]
        return run

    @property
    def returns_every_output(self) -> bool:
        """Whether every stage's output comes back (on a cluster only the final ones do)."""
        return self.kind != "dask"

    def skip(self, kinds: str, why: str) -> None:
        if self.kind in kinds.split():
            pytest.skip(f"{self.kind} lanes: {why}")

    def workers(self) -> dict[str, str]:
        """Cluster worker name -> address."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return {str(w["name"]): a for a, w in info.items()}


@pytest.fixture(scope="module")
def cluster_client():
    pytest.importorskip("distributed")
    from distributed import Client, Scheduler, SpecCluster, Worker

    opts = {"nthreads": 2, "memory_limit": "2GiB", "host": "127.0.0.1"}
    workers = {"cpu0": {"cls": Worker, "options": dict(opts)},
               "gpu0": {"cls": Worker, "options": {**opts, "resources": {"GPU": 1}}}}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False,
                                               "dashboard_address": "127.0.0.1:0"}}
    with SpecCluster(workers=workers, scheduler=scheduler, asynchronous=False) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture(params=LANES)
def lanes(request) -> Lanes:
    if request.param == "dask":
        return Lanes("dask", request.getfixturevalue("cluster_client"))
    return Lanes(request.param)


@pytest.fixture(scope="module")
def local():
    """The diamond run all on the CPU, inline: the reference outputs."""
    return execute(diamond(), "all=cpu", executor="inline")


def _source(device, n=1000):
    return torch.arange(n, dtype=torch.float32, device=device)


def _sleeper(seconds):
    def fn(src, device):
        time.sleep(seconds)
        return src + seconds

    return fn


# -- routing and copies --------------------------------------------------------------------------
def test_tensor_used_by_two_gpu_stages_crosses_once(lanes):
    p = Pipeline("fan")
    p.add(name="src", fn=_source)
    p.add(name="a", fn=lambda src, device: src * 2, inputs=["src"])
    p.add(name="b", fn=lambda src, device: src + 1, inputs=["src"])
    p.add(name="join", fn=lambda a, b, device: a + b, inputs=["a", "b"])
    run = lanes.run(p, "src=cpu,a=gpu-sim,b=gpu-sim,join=gpu-sim")
    h2d = [t for t in run.transfers if t.direction == "h2d"]
    assert [(t.data, t.src, t.dst, t.bytes) for t in h2d] == [("src", "host", "gpu-sim", 4000)]
    d2h = [t for t in run.transfers if t.direction == "d2h"]
    assert [(t.data, t.dst) for t in d2h] == [("join", "host")]
    assert torch.equal(run.final_outputs["join"], torch.arange(1000.0) * 3 + 1)
    assert run.final_outputs["join"].device.type == "cpu"


def test_no_transfer_when_everything_stays_on_one_device(lanes):
    p = Pipeline("chain")
    p.add(name="src", fn=_source)
    p.add(name="sq", fn=lambda src, device: src * src, inputs=["src"])
    run = lanes.run(p, "all=cpu")
    assert run.transfers == []
    assert [s.name for s in run.stages] == ["src", "sq"]
    assert all(s.device == "cpu" for s in run.stages)


def test_diamond_data_moves_as_placed_with_the_same_outputs(lanes, local):
    run = lanes.run(diamond(), GPU_STAGES)
    by = {s.name: s for s in run.stages}
    moves = {(t.data, t.direction) for t in run.transfers}
    # load goes to the device for left; right goes to the device for join; join comes home
    assert moves == {("load", "h2d"), ("right", "h2d"), ("join", "d2h")}
    assert all(t.bytes > 0 for t in run.transfers)
    assert by["load"].output_bytes == 2000 * 8 * 4
    # the timeline is ordered by the dependencies
    assert by["load"].end_s <= by["left"].start_s and by["left"].end_s <= by["join"].start_s
    assert_outputs_close(run.final_outputs, local.final_outputs)
    assert run.outputs_digest == local.outputs_digest


def test_stages_run_on_the_lanes_of_their_devices(lanes):
    run = lanes.run(diamond(), GPU_STAGES)
    by = {s.name: s for s in run.stages}
    assert {n for n, s in by.items() if s.device == "gpu-sim"} == {"left", "join"}
    if lanes.kind == "dask":
        names = lanes.workers()
        assert by["left"].worker == by["join"].worker == names["gpu0"]
        assert {s.worker for s in run.stages} <= set(names.values())
        assert by["left"].lane == f"gpu-sim@{names['gpu0']}"
        assert by["load"].lane.startswith("cpu@")
    else:
        assert by["left"].lane == by["join"].lane == "gpu-sim"
        assert by["load"].lane.startswith("cpu/") and by["right"].lane.startswith("cpu/")
        assert all(s.worker is None for s in run.stages)


@pytest.mark.parametrize("placement", ["all=cpu", "all=gpu-sim", "all=cpu,right=gpu-sim"])
def test_same_digest_on_every_placement(lanes, local, placement):
    run = lanes.run(diamond(), placement)
    assert run.outputs_digest == local.outputs_digest
    assert (all(s.worker for s in run.stages) if lanes.kind == "dask"
            else all(s.worker is None for s in run.stages))


def test_which_outputs_come_back(lanes):
    """Every stage's output; on a cluster only the final ones (the rest are released)."""
    run = lanes.run(diamond(), "all=cpu,right=gpu-sim")
    assert set(run.final_outputs) == {"join"}
    assert set(run.outputs) == ({"load", "left", "right", "join"} if lanes.returns_every_output else {"join"})


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor:UserWarning")  # dask pickling a module
def test_model_objects_are_copied_with_their_parameters(lanes):
    p = Pipeline("model")
    p.add(name="net", fn=lambda device: torch.nn.Linear(3, 2).to(device))
    p.add(name="use", fn=lambda net, device: net(torch.ones(1, 3, device=device)), inputs=["net"])
    run = lanes.run(p, "net=cpu,use=gpu-sim")
    moved = [t for t in run.transfers if t.data == "net"]
    assert moved and moved[0].bytes == (3 * 2 + 2) * 4
    assert run.final_outputs["use"].shape == (1, 2)


# -- concurrency ----------------------------------------------------------------------------------
def test_cpu_and_gpu_branches_run_at_the_same_time(lanes):
    lanes.skip("inline", "runs one stage at a time, in the calling thread, by design")
    p = Pipeline("branches")
    p.add(name="src", fn=_source)
    p.add(name="cpu_branch", fn=_sleeper(0.4), inputs={"src": "src"})
    p.add(name="gpu_branch", fn=_sleeper(0.4), inputs={"src": "src"})
    p.add(name="merge", fn=lambda a, b, device: a + b, inputs={"a": "cpu_branch", "b": "gpu_branch"})
    run = lanes.run(p, "all=cpu,gpu_branch=gpu-sim", workers=1)
    c, g = run.stage("cpu_branch"), run.stage("gpu_branch")
    assert c.lane.startswith("cpu") and g.lane.startswith("gpu-sim")
    assert c.start_s < g.end_s and g.start_s < c.end_s, "the two branches did not overlap"


def test_one_cpu_worker_serialises_cpu_stages(lanes):
    p = Pipeline("two_cpu")
    p.add(name="src", fn=_source)
    p.add(name="a", fn=_sleeper(0.1), inputs={"src": "src"})
    p.add(name="b", fn=_sleeper(0.1), inputs={"src": "src"})
    run = lanes.run(p, "all=cpu", workers=1)
    a, b = run.stage("a"), run.stage("b")
    assert a.end_s <= b.start_s, "with one worker, a (lower priority index) runs before b"


def test_auto_runs_a_chain_inline_and_other_graphs_on_threads():
    chain = Pipeline("chain")
    chain.add(name="src", fn=_source)
    chain.add(name="sq", fn=lambda src, device: src * src, inputs=["src"])
    assert execute(chain, "all=cpu").executor == "inline"
    assert execute(diamond(), "all=cpu").executor == "threads"


# -- failures ---------------------------------------------------------------------------------------
def _failing() -> Pipeline:
    p = Pipeline("fails")
    p.add(name="src", fn=_source)
    p.add(name="ok", fn=lambda src, device: src * 2, inputs=["src"])

    def boom(ok, device):
        raise RuntimeError("bad batch")

    p.add(name="boom", fn=boom, inputs=["ok"])
    p.add(name="after", fn=lambda boom, device: boom, inputs=["boom"])
    return p


def test_failing_stage_is_named_with_the_partial_timeline(lanes):
    with pytest.raises(StageFailedError, match="stage 'boom' failed on cpu: RuntimeError: bad batch") as e:
        lanes.run(_failing(), "all=cpu")
    err = e.value
    assert err.stage == "boom"
    assert err.run.failed_stage == "boom"
    assert [(s.name, s.status) for s in err.run.stages] == [("src", "ok"), ("ok", "ok"), ("boom", "failed")]
    assert "after" not in err.outputs


def test_failing_stage_keeps_the_finished_outputs(lanes):
    lanes.skip("dask", "outputs stay on the workers and are released; only final outputs come back")
    with pytest.raises(StageFailedError) as e:
        lanes.run(_failing(), "all=cpu")
    err = e.value
    assert set(err.outputs) == {"src", "ok"}
    assert torch.equal(err.outputs["ok"], torch.arange(1000.0) * 2)


# -- implementations ----------------------------------------------------------------------------------
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


def _ema_pipeline() -> Pipeline:
    p = Pipeline("ema")
    p.add(name="src", fn=lambda device: torch.linspace(0, 1, 64, device=device))
    p.add(name="ema", cpu=_ema_cpu, inputs={"x": "src"}, params={"alpha": 0.3},
          gpu={"fn": _ema_gpu, "api": "numba.cuda"})
    p.add(name="total", fn=lambda ema, device: ema * 2, inputs=["ema"])
    return p


def test_numba_cuda_kernel_stage_matches_njit_stage(lanes):
    cpu = lanes.run(_ema_pipeline(), "all=cpu")
    gpu = lanes.run(_ema_pipeline(), "all=cpu,ema=gpu-sim")
    assert gpu.stage("ema").device == "gpu-sim"
    assert_outputs_close(cpu.final_outputs, gpu.final_outputs)
    assert cpu.outputs_digest == gpu.outputs_digest


def test_outputs_are_in_each_devices_canonical_form(lanes):
    lanes.skip("dask", "only final outputs come back from a cluster")
    cpu = lanes.run(_ema_pipeline(), "all=cpu")
    gpu = lanes.run(_ema_pipeline(), "all=cpu,ema=gpu-sim")
    assert isinstance(cpu.outputs["ema"], np.ndarray)
    assert isinstance(gpu.outputs["ema"], torch.Tensor)


def _rowwise(x):
    """Each row, and in the last column the row count of the partition it was computed in."""
    return np.column_stack([np.sqrt(np.abs(x)) * 2, np.full(x.shape[0], float(x.shape[0]))])


def test_data_parallel_cpu_stage_is_split_into_partitions(lanes):
    p = Pipeline("dp")
    p.add(name="src", cpu=lambda: np.linspace(-1, 1, 40_000).reshape(-1, 4), inputs=[])
    p.add(name="rows", cpu=_rowwise, inputs={"x": "src"}, data_parallel=True)
    expected = np.sqrt(np.abs(np.linspace(-1, 1, 40_000).reshape(-1, 4))) * 2
    for workers in (2, 1):
        out = lanes.run(p, "all=cpu", workers=workers).final_outputs["rows"]
        np.testing.assert_array_equal(out[:, :4], expected)
        # locally a stage splits over the run's CPU workers; on a cluster over the
        # threads of the worker that runs it (two each here)
        parts = 2 if lanes.kind == "dask" else workers
        assert set(out[:, 4]) == {10_000 / parts}


# -- the record ---------------------------------------------------------------------------------------
def test_run_record_serialises_with_required_fields(lanes):
    p = Pipeline("rec")
    p.add(name="src", fn=_source)
    p.add(name="twice", fn=lambda src, device: src * 2, inputs=["src"])
    doc = lanes.run(p, "src=cpu,twice=gpu-sim", size=1000).summary()
    assert {"pipeline", "makespan_s", "stages", "transfers", "outputs_digest"} <= set(doc)
    assert {"name", "device", "start_s", "end_s", "seconds"} <= set(doc["stages"][0])
    assert {"src", "dst", "bytes", "seconds"} <= set(doc["transfers"][0])
    assert doc["makespan_s"] >= max(s["end_s"] for s in doc["stages"])
    assert doc["devices"]["gpu-sim"].startswith("simulated test device")
