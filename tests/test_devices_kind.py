"""Device kinds: the name grammar, and a new kind registered from here running end to end.

The new kind is a fake accelerator, ``acc:N``, whose memory is host memory: its
copy-in wraps an array in a :class:`Box` and its copy-out unwraps it, so every copy
the executor makes is observable, and a stage's GPU implementation runs on the CPU
on the unwrapped array. Its work queues (:meth:`~placer.devices.DeviceKind.work_stream`)
record which threads asked for one. It is profiled, planned for (cost model and
optimizer), run on and reported on, runs a stream (copy nodes on threads of their
own, overlapping the stage's compute) and a pipeline on a dask cluster on
127.0.0.1, without any change to placer.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time

import numpy as np
import pytest
from pydantic import ValidationError

from placer import Pipeline
from placer.costmodel.model import CostModel
from placer.data.cost_table import CostTable
from placer.data.profile import DeviceProfile
from placer.devices import (
    SIM,
    Device,
    DeviceKind,
    canonical_name,
    discover,
    get_kind,
    is_accelerator,
    is_device_name,
    is_real_gpu,
    kind_of,
    kinds,
    refresh,
    register_kind,
    same_device,
    unregister_kind,
    valid_names,
)
from placer.errors import CostTableError, DeviceError, DeviceUnavailableError
from placer.executor import execute
from placer.optimize import plan
from placer.pipeline import device_class
from placer.placement import resolve
from placer.profile import profile
from placer.report import collect, render_markdown


# -- the grammar of the built-in kinds ----------------------------------------------------------
def test_builtin_kinds_are_registered_in_order():
    assert list(kinds())[:3] == ["cpu", "gpu", "sim"]
    assert get_kind("gpu").real_gpu and not get_kind("sim").real_gpu and not get_kind("cpu").accelerator


@pytest.mark.parametrize("spec,name,kind", [
    ("cpu", "cpu", "cpu"), (" CPU ", "cpu", "cpu"), ("gpu", "gpu:0", "gpu"), ("GPU", "gpu:0", "gpu"),
    ("gpu:0", "gpu:0", "gpu"), ("gpu:3", "gpu:3", "gpu"), ("gpu-sim", SIM, "sim"),
])
def test_names_resolve_aliases_and_case(spec, name, kind):
    assert canonical_name(spec) == name
    assert kind_of(spec) == kind


def test_what_a_name_is():
    assert is_accelerator("gpu:1") and is_accelerator(SIM) and not is_accelerator("cpu")
    assert is_real_gpu("gpu") and is_real_gpu("gpu:2")
    assert not is_real_gpu(SIM), "the simulated test device is never a GPU"
    assert not is_accelerator("tpu") and not is_real_gpu("tpu")
    assert same_device("gpu", "gpu:0") and same_device("GPU", "gpu:0") and not same_device("gpu", "gpu:1")
    assert not same_device("h200", "H200")  # names no kind knows must be equal
    assert is_device_name("gpu") and is_device_name("gpu:7") and is_device_name(SIM)
    assert not is_device_name("GPU") and not is_device_name(" gpu") and not is_device_name("gpu:x")
    assert device_class("cpu") == "cpu" and device_class("gpu:1") == "gpu" and device_class(SIM) == "gpu"


@pytest.mark.parametrize("bad", ["tpu", "gpu:", "gpu:x", "cpu0", "gpu-simulated", ""])
def test_unknown_names_say_which_names_are_valid(bad):
    with pytest.raises(DeviceError, match=re.escape(f"unknown device {bad!r}; use cpu, gpu, gpu:N or gpu-sim")):
        canonical_name(bad)
    with pytest.raises(DeviceError, match="unknown device"):
        kind_of(bad)
    assert not is_device_name(bad)


def test_unknown_names_in_a_placement_name_the_stage_and_the_valid_names():
    p = Pipeline("one")
    p.add(name="a", fn=lambda device: 1)
    with pytest.raises(DeviceError, match=r"stage 'a': unknown device 'tpu'; use cpu, gpu, gpu:N or gpu-sim"):
        resolve(p, "all=tpu", discover())


def test_kinds_are_checked_wherever_a_device_is_described():
    with pytest.raises(ValidationError, match="unknown device kind 'tpu'; use one of cpu, gpu, sim"):
        Device(name="tpu:0", kind="tpu", label="")
    with pytest.raises(ValidationError, match="unknown device kind 'tpu'"):
        DeviceProfile(device="tpu:0", kind="tpu")
    doc = ('{"devices": {"cpu": {"kind": "cpu"}, "t": {"kind": "tpu"}},'
           ' "stages": [{"name": "a", "seconds": {"cpu": 1.0}}]}')
    with pytest.raises(CostTableError, match="devices.t.kind: unknown device kind 'tpu'"):
        CostTable.from_json(doc)


def test_registering_a_taken_name_or_removing_an_unknown_one_is_an_error():
    with pytest.raises(DeviceError, match="'gpu' is registered already"):
        register_kind(type(get_kind("gpu"))())
    with pytest.raises(DeviceError, match="no device kind named 'tpu'"):
        unregister_kind("tpu")


@pytest.fixture
def without_test_devices():
    """This process as it is without ``PLACER_TEST_DEVICES=1`` (restored afterwards)."""
    old = os.environ.pop("PLACER_TEST_DEVICES", None)
    try:
        yield refresh()
    finally:
        if old is not None:
            os.environ["PLACER_TEST_DEVICES"] = old
        refresh()


def test_the_simulated_device_exists_only_with_placer_test_devices(without_test_devices):
    inv = without_test_devices
    assert inv.get(SIM) is None and SIM not in valid_names()
    with pytest.raises(DeviceUnavailableError, match="exists only when PLACER_TEST_DEVICES=1 is set"):
        inv.resolve(SIM, stage="a")
    with pytest.raises(DeviceError, match=r"use cpu, gpu or gpu:N$"):
        canonical_name("tpu")
    assert kind_of(SIM) == "sim", "saved runs on gpu-sim are still read without it"


def test_the_simulated_device_is_never_a_gpu():
    sim = refresh().get(SIM)  # the test setup sets PLACER_TEST_DEVICES=1
    assert sim is not None and sim.simulated and sim.is_accelerator and not sim.is_gpu
    assert sim not in discover().gpus and sim.location == SIM
    assert discover().get("cpu").location == "host"


# -- a new kind, registered from this file alone -------------------------------------------------
class Box:
    """An array in the fake accelerator's memory: only its kind reads it."""

    def __init__(self, array: np.ndarray):
        self.array = array

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def nbytes(self) -> int:
        return self.array.nbytes


class FakeAccelerator(DeviceKind):
    """``acc:N`` (``acc`` means ``acc:0``): host memory, every copy wraps or unwraps a Box."""

    name = "acc"
    forms = ("acc", "acc:N")
    title = "fake accelerator"

    def __init__(self):
        self.lock = threading.Lock()
        self.copied_in = 0
        self.copied_out = 0
        self.copy_delay_s = 0.0  # a slow bus, to see copies overlap compute
        self.copy_spans: list[tuple[float, float]] = []
        self.queue_threads: set[str] = set()

    def parse(self, key):
        m = re.fullmatch(r"acc(?::(\d+))?", key)
        return None if m is None else (key if m.group(1) else "acc:0")

    def holds(self, leaf):
        return isinstance(leaf, Box)

    def copy_in(self, leaf, device, state):
        if isinstance(leaf, Box):
            return leaf
        if not isinstance(leaf, np.ndarray):
            return leaf
        t0 = time.perf_counter()
        if self.copy_delay_s:
            time.sleep(self.copy_delay_s)
        with self.lock:
            self.copied_in += 1
            self.copy_spans.append((t0, time.perf_counter()))
        return Box(leaf.copy())

    def copy_out(self, leaf):
        with self.lock:
            self.copied_out += 1
        return leaf.array.copy()

    def unwrap(self, leaf):
        return leaf.array if isinstance(leaf, Box) else leaf

    def wrap(self, leaf):
        return Box(np.asarray(leaf)) if isinstance(leaf, np.ndarray) else leaf

    @contextlib.contextmanager
    def work_stream(self, device):
        with self.lock:
            self.queue_threads.add(threading.current_thread().name)
        yield

    def discover(self, host):
        return [Device(name="acc:0", kind="acc", index=0, label="fake accelerator (host memory)",
                       memory_bytes=1 << 30, backends=["numpy"])], {}


@pytest.fixture
def acc():
    kind = register_kind(FakeAccelerator())
    try:
        yield kind
    finally:
        unregister_kind("acc")


def _make(n):
    return np.arange(n * 4, dtype=np.float64).reshape(n, 4) / n


def _heavy_cpu(make):
    time.sleep(0.02)  # the CPU is slow at this stage...
    return make * 2.0 + 1.0


def _heavy_acc(make):
    assert isinstance(make, np.ndarray), "the kind unwraps a Box before the implementation sees it"
    return make * 2.0 + 1.0  # ...the accelerator is not


def _total(heavy):
    return heavy.sum(axis=0)


def build(size=None):
    n = int(size or 256)
    p = Pipeline("acc-demo", size=n)
    p.add(name="make", kind="cleaning", cpu=_make, params={"n": n})
    p.add(name="heavy", kind="training", cpu=_heavy_cpu, gpu={"fn": _heavy_acc, "api": "numpy"}, inputs=["make"])
    p.add(name="total", kind="other", cpu=_total, inputs=["heavy"])
    return p


def test_a_registered_kind_has_names_and_devices(acc):
    assert canonical_name("ACC") == "acc:0" and kind_of("acc:2") == "acc"
    assert is_accelerator("acc:0") and not is_real_gpu("acc:0") and device_class("acc:0") == "gpu"
    assert valid_names().endswith("gpu-sim, acc or acc:N")
    dev = discover().get("acc:0")
    assert dev is not None and dev.driver is acc and dev.location == "acc:0" and not dev.is_gpu
    devs = resolve(build(64), "all=cpu,heavy=acc", discover())
    assert devs["heavy"].name == "acc:0"


def test_unregistering_a_kind_forgets_its_names_and_devices(acc):
    assert discover().get("acc:0") is not None
    unregister_kind("acc")
    try:
        assert discover().get("acc:0") is None and not is_device_name("acc")
        with pytest.raises(DeviceError, match="unknown device 'acc'"):
            canonical_name("acc")
    finally:
        register_kind(acc)


def test_a_new_kind_is_profiled_planned_run_and_reported(acc):
    size = 256
    prof = profile(build, sizes=[64, 128, 256], devices=["cpu", "acc:0"], budget_s=12, cache=False,
                   progress=False, count_work_for_absent=False)
    assert prof.devices["acc:0"]["kind"] == "acc"
    assert prof.stages["heavy"].devices["acc:0"].kind == "acc" and prof.stages["heavy"].devices["acc:0"].points
    assert "acc:0" not in prof.stages["make"].devices  # make has no GPU implementation
    assert "acc:0" in prof.transfer and prof.transfer["acc:0"].links["h2d"]
    assert acc.copied_in > 0 and acc.copied_out > 0  # profiling copied through the kind

    table = CostModel(prof).table(size)
    assert table.devices["acc:0"].kind == "acc" and table.accelerators == ["acc:0"]
    chosen = plan(table, size=size)
    assert chosen.placement == {"make": "cpu", "heavy": "acc:0", "total": "cpu"}
    assert chosen.devices["acc:0"] == "acc"
    heavy = next(s for s in chosen.stages if s.name == "heavy")
    assert heavy.predicted_s["acc:0"] < heavy.predicted_s["cpu"]

    p = build(size)
    cpu = execute(p, "all=cpu")
    before_in, before_out = acc.copied_in, acc.copied_out
    run = execute(p, chosen.placement)
    assert run.stage("heavy").device == "acc:0" and run.stage("heavy").lane == "acc:0"
    assert [(t.data, t.src, t.dst, t.bytes) for t in run.transfers] == [
        ("make", "host", "acc:0", size * 4 * 8), ("heavy", "acc:0", "host", size * 4 * 8)]
    assert (acc.copied_in - before_in, acc.copied_out - before_out) == (1, 1)
    assert run.devices["acc:0"] == "fake accelerator (host memory)"
    assert run.outputs_digest == cpu.outputs_digest
    np.testing.assert_array_equal(run.final_outputs["total"], cpu.final_outputs["total"])

    md = render_markdown(collect(plan=chosen, run=run, baselines={"all_cpu": cpu}, pipeline=p, costs=table))
    assert "acc:0" in md
    assert re.search(r"\*\*heavy\*\*[^\n]*acc:0", md), "the stage table shows heavy on acc:0"


# -- the same kind in a stream and on a cluster ------------------------------------------------
BATCHES, ROWS = 8, 16
#: (start, end) of each call of the stream's accelerator stage
COMPUTE_SPANS: list[tuple[float, float]] = []


def _scale_cpu(rows):
    return rows * 3.0 - 1.0


def _scale_acc(rows):
    assert isinstance(rows, np.ndarray), "the kind unwraps a Box before the implementation sees it"
    t0 = time.perf_counter()
    time.sleep(0.03)
    COMPUTE_SPANS.append((t0, time.perf_counter()))
    return rows * 3.0 - 1.0


def build_stream():
    """source (host) → scale (per batch; CPU or accelerator code) → total (the step, a fold on the CPU)."""
    p = Pipeline("acc-stream", size=BATCHES * ROWS, size_unit="samples")

    @p.source(batch_size=ROWS)
    def rows():
        return [np.full((ROWS, 4), float(i)) + np.arange(4.0) for i in range(BATCHES)]

    p.add(name="scale", kind="preprocessing", cpu=_scale_cpu, gpu={"fn": _scale_acc, "api": "numpy"},
          inputs=["rows"])

    @p.step(init=lambda: {"sum": np.zeros(4)}, device="cpu")
    def total(scale, state):
        state["sum"] = state["sum"] + scale.sum(axis=0)

    return p


def test_a_new_kind_runs_a_stream_with_copy_nodes_that_overlap_its_compute(acc):
    from placer.stream import StreamConfig

    p = build_stream()
    reference = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    acc.copy_delay_s = 0.03
    COMPUTE_SPANS.clear()
    run = execute(p, {"scale": "acc:0"}, stream=StreamConfig(prefetch=4))

    stats = {s.name: s for s in run.streams[0].stages}
    assert stats["scale"].device == "acc:0" and stats["scale"].batches == BATCHES
    copies = [s for s in run.streams[0].stages if s.kind == "copy"]
    assert [(c.device, c.batches) for c in copies] == [("acc:0", BATCHES), ("cpu", BATCHES)], \
        "a copy node into the accelerator before scale, and one out of it before the step"
    assert len(acc.copy_spans) == BATCHES and len(COMPUTE_SPANS) == BATCHES
    assert acc.copied_out >= BATCHES
    overlaps = sum(1 for c0, c1 in acc.copy_spans for s0, s1 in COMPUTE_SPANS if c0 < s1 and s0 < c1)
    assert overlaps >= BATCHES // 2, ("copies into the accelerator run on their own thread, beside the "
                                      f"stage's compute: {overlaps} overlaps")
    assert len(acc.queue_threads) >= 2, f"the copy node and the stage each asked the kind for a queue: {acc.queue_threads}"
    np.testing.assert_allclose(run.final_outputs["total"]["sum"], reference.final_outputs["total"]["sum"])
    assert run.outputs_digest == reference.outputs_digest


@pytest.fixture(scope="module")
def cluster():
    """A scheduler and two in-process workers on 127.0.0.1; ``gpu0`` declares GPU=1.

    The workers run in this process, so the kind registered here is theirs too: a
    worker in its own process would import the kind's module the same way.
    """
    distributed = pytest.importorskip("distributed")

    opts = {"nthreads": 1, "host": "127.0.0.1"}
    workers = {"cpu0": {"cls": distributed.Worker, "options": dict(opts)},
               "gpu0": {"cls": distributed.Worker, "options": {**opts, "resources": {"GPU": 1}}}}
    scheduler = {"cls": distributed.Scheduler,
                 "options": {"host": "127.0.0.1", "port": 0, "dashboard": False, "dashboard_address": ":0"}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler, asynchronous=False) as c:
        yield c


def test_a_new_kind_runs_a_pipeline_on_a_cluster(acc, client):
    from placer.executor.distributed import cluster_devices

    inv = cluster_devices(client)
    dev = inv.get("acc:0")
    assert dev is not None and dev.kind == "acc" and dev.is_accelerator and not dev.is_gpu
    assert inv.gpus == [] and "acc:0" not in (d.name for d in inv.gpus)

    p = build(128)
    local = execute(p, "all=cpu")
    before = acc.copied_in, acc.copied_out
    run = execute(p, {"heavy": "acc:0"}, scheduler=client)
    heavy = run.stage("heavy")
    gpu_worker = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items() if w["name"] == "gpu0")
    assert heavy.device == "acc:0" and heavy.worker == gpu_worker
    assert acc.copied_in - before[0] >= 1 and acc.copied_out - before[1] >= 1, "the workers copied through the kind"
    assert run.outputs_digest == local.outputs_digest
    np.testing.assert_array_equal(run.final_outputs["total"], local.final_outputs["total"])
