"""Streams: declaring them, running them in order under any placement and workers, accounting, faults.

Every test pipeline here is tiny and built in the test; ``gpu-sim`` (the labelled
simulated test device, see conftest) stands in for a GPU so that copies between
locations happen.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from placer import Pipeline, execute
from placer.errors import PipelineError, PlacerError, StageFailedError
from placer.stream import StreamConfig

N, B = 96, 8


def pipeline(epochs: int = 2, *, augment_sleep: float = 0.0, step_sleep: float = 0.0, fail_at: int | None = None,
             fail_in: str = "augment", calls: list | None = None, random: bool = True) -> Pipeline:
    """table (once) → source → decode → augment (random, seeded per batch) → train step → weights (once)."""
    p = Pipeline("toy", size=N, size_unit="samples")

    @p.stage(kind="cleaning")
    def table():
        return np.arange(N * 4, dtype=np.float32).reshape(N, 4) / N

    @p.source(epochs=epochs, batch_size=B)
    def batches(table):
        for i in range(0, N, B):
            if fail_in == "source" and fail_at is not None and i // B == fail_at:
                raise ValueError("corrupt record")
            yield table[i:i + B]

    @p.stage(kind="preprocessing", device="cpu")
    def decode(batches):
        if calls is not None:
            calls.append(1)
        return np.sqrt(batches + 1.0)

    @p.stage("decode", device="gpu")
    def decode_gpu(batches, device):
        return torch.sqrt(torch.as_tensor(batches).to(device) + 1.0)

    @p.stage(kind="preprocessing", device="cpu", random=random)
    def augment(decode, batch_info):
        if augment_sleep:
            time.sleep(augment_sleep)
        if fail_in == "augment" and fail_at is not None and batch_info.index == fail_at:
            raise ValueError(f"bad batch {batch_info.index}")
        noise = np.random.default_rng(batch_info.seed).normal(size=decode.shape).astype(np.float32)
        return decode + 0.01 * noise

    @p.stage("augment", device="gpu")
    def augment_gpu(decode, batch_info, device):
        noise = np.random.default_rng(batch_info.seed).normal(size=tuple(decode.shape)).astype(np.float32)
        return decode + 0.01 * torch.from_numpy(noise).to(device)

    def init(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1).to(device)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.05)}

    @p.step(init=init)
    def train(augment, state, device):
        if step_sleep:
            time.sleep(step_sleep)
        x = torch.as_tensor(augment).to(device)
        loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()

    @p.stage(kind="inference")
    def weights(train):
        return train["model"].weight.detach().cpu().numpy().copy()

    return p


def reference(p: Pipeline):
    return execute(p, "all=cpu", stream=StreamConfig(workers=0))


def weights_of(run) -> np.ndarray:
    return np.asarray(run.final_outputs["weights"])


# -- declaring ----------------------------------------------------------------------------------
def test_per_batch_stages_are_found_and_the_stream_listed():
    p = pipeline().validate()
    roles = {n: st.role for n, st in p.stages.items()}
    assert roles == {"table": "once", "batches": "source", "decode": "batch", "augment": "batch",
                     "train": "step", "weights": "once"}
    assert p.streams() == {"batches": ["batches", "decode", "augment", "train"]}


def _bad(kind: str) -> Pipeline:
    p = Pipeline("bad")

    @p.source()
    def src():
        return [np.zeros(2)]

    if kind in ("loose", "two_steps"):
        @p.stage()
        def loose(src):
            return src

    if kind != "loose":
        @p.step(kind="inference")
        def step(src):
            return src

    if kind == "two_steps":
        @p.step(kind="inference")
        def other(loose):
            return loose

    if kind == "two_streams":
        @p.source()
        def src2():
            return [np.zeros(2)]

        @p.step(kind="inference")
        def both(src, src2):
            return src

    return p


@pytest.mark.parametrize("kind, words", [
    ("loose", ["per-batch stage 'loose'", "feeds nothing", "@pipeline.step"]),
    ("two_steps", ["two steps", "'step'", "'other'"]),
    ("two_streams", ["'both'", "two streams"]),
])
def test_malformed_streams_are_refused_naming_the_stage(kind, words):
    with pytest.raises(PipelineError) as err:
        _bad(kind).validate()
    for w in words:
        assert w in str(err.value)


def test_a_step_with_init_must_take_state():
    p = Pipeline("nostate")

    @p.source()
    def src():
        return [np.zeros(2)]

    @p.step(init=lambda: 0)
    def step(src):
        return src

    with pytest.raises(PipelineError, match="takes no 'state' argument"):
        p.validate()


# -- same answer everywhere ----------------------------------------------------------------------
@pytest.mark.parametrize("placement", ["all=cpu", "all=gpu-sim", "all=cpu,augment=gpu-sim",
                                       "all=gpu-sim,decode=cpu", "all=cpu,train=gpu-sim"])
@pytest.mark.parametrize("workers", [1, 3])
def test_outputs_and_model_state_equal_the_sequential_run(placement, workers):
    p = pipeline()
    ref = reference(p)
    run = execute(p, placement, stream=StreamConfig(workers=workers, prefetch=2))
    assert run.outputs_digest == ref.outputs_digest
    np.testing.assert_allclose(weights_of(run), weights_of(ref), rtol=1e-5, atol=1e-6)
    assert run.streams[0].batches == 2 * N // B


def test_batches_keep_their_order_whatever_the_workers():
    p = Pipeline("order")

    @p.source(epochs=2)
    def src():
        return [np.full(3, i, dtype=np.int64) for i in range(20)]

    @p.stage(kind="preprocessing")
    def jitter(src, batch_info, device):
        time.sleep(0.004 * ((batch_info.index * 7) % 5))  # later batches often finish first
        return src

    @p.step(kind="inference")
    def collect(jitter):
        return int(jitter[0])

    run = execute(p, "all=cpu", stream=StreamConfig(workers=4, prefetch=3))
    assert run.final_outputs["collect"] == list(range(20)) * 2


# -- bounds and accounting -----------------------------------------------------------------------
def test_the_queues_bound_the_batches_in_flight():
    p = pipeline(epochs=4, step_sleep=0.01, random=False)
    cfg = StreamConfig(workers=2, prefetch=2)
    run = execute(p, "all=cpu", stream=cfg)
    s = run.streams[0]
    nodes = len(s.stages)
    bound = (nodes - 1) * cfg.prefetch + sum(n.workers for n in s.stages) + 2
    assert s.batches == 4 * N // B
    assert s.peak_inflight_batches <= bound < s.batches
    assert all(max(sizes) <= cfg.prefetch for _, sizes in s.queue_trace)


def test_busy_starved_and_blocked_account_for_each_stages_time():
    p = pipeline(augment_sleep=0.01, step_sleep=0.02, random=False)
    run = execute(p, "all=cpu", stream=StreamConfig(workers=2, prefetch=2))
    s = run.streams[0]
    for n in s.stages:
        total = n.busy_s + n.starved_s + n.blocked_s
        assert total == pytest.approx(n.wall_s * n.workers, rel=0.05, abs=0.01), n
    step = s.stages[-1]
    aug = next(n for n in s.stages if n.name == "augment")
    assert step.busy_s > 0.02 * s.batches * 0.9  # the step slept 20 ms a batch
    assert aug.blocked_s > aug.starved_s  # the step is the bottleneck: augment waits for room
    assert 0.0 <= s.consumer_idle_fraction < 0.5


def test_a_starved_step_shows_as_consumer_idle_time():
    p = pipeline(augment_sleep=0.02, random=False)
    run = execute(p, "all=cpu", stream=StreamConfig(workers=1, prefetch=2))
    assert run.streams[0].consumer_idle_fraction > 0.5


def test_run_json_has_stream_fields_per_stage():
    run = execute(pipeline(), "all=cpu", stream=StreamConfig(workers=2))
    doc = run.summary()
    assert doc["batches"] == 2 * N // B and doc["samples_per_s"] > 0
    rows = {r["name"]: r for r in doc["stages"]}
    for name in ("batches", "decode", "augment", "train"):
        assert {"busy_s", "starved_s", "blocked_s", "workers", "worker_kind"} <= set(rows[name])
    assert rows["decode"]["workers"] == 2 and rows["train"]["workers"] == 1
    assert "busy_s" not in rows["table"]


# -- caching -------------------------------------------------------------------------------------
def test_a_cached_stage_runs_in_the_first_epoch_only_and_changes_nothing():
    calls: list = []
    p = pipeline(epochs=3, calls=calls)
    ref = reference(pipeline(epochs=3))
    run = execute(p, "all=cpu", stream=StreamConfig(workers=2, cache="decode"))
    assert len(calls) == N // B
    assert run.outputs_digest == ref.outputs_digest
    assert any("cached 12 batches" in note for note in run.streams[0].notes)


def test_caching_after_a_random_stage_is_refused():
    with pytest.raises(StageFailedError, match="'augment' is random"):
        execute(pipeline(), "all=cpu", stream=StreamConfig(cache="augment"))


def test_a_cache_over_its_bound_stops_and_says_so():
    calls: list = []
    run = execute(pipeline(epochs=2, calls=calls), "all=cpu", stream=StreamConfig(cache="decode", cache_bytes=100))
    assert len(calls) == 2 * N // B
    assert any("stopped" in n for n in run.streams[0].notes)


# -- sources ------------------------------------------------------------------------------------
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.tensor([float(i), float(i * i)])


def dataset_pipeline(kind: str) -> Pipeline:
    p = Pipeline("ds")

    @p.source(batch_size=8)
    def src():
        ds = Squares()
        return ds if kind == "dataset" else torch.utils.data.DataLoader(ds, batch_size=8)

    @p.step(kind="inference")
    def total(src):
        return float(src.sum())

    return p


@pytest.mark.parametrize("kind", ["dataset", "loader"])
def test_a_dataset_or_dataloader_source_is_batched(kind):
    run = execute(dataset_pipeline(kind), "all=cpu", stream=StreamConfig(workers=1))
    assert run.streams[0].batches == 5 and run.streams[0].samples == 40
    assert sum(run.final_outputs["total"]) == sum(i + i * i for i in range(40))


def test_a_dataset_source_with_worker_processes_gives_the_same_batches():
    ref = execute(dataset_pipeline("dataset"), "all=cpu", stream=StreamConfig(workers=0))
    run = execute(dataset_pipeline("dataset"), "all=cpu", stream=StreamConfig(stage_workers={"src": 2}))
    assert run.final_outputs["total"] == ref.final_outputs["total"]


# -- faults -------------------------------------------------------------------------------------
def _no_stream_threads():
    deadline = time.time() + 5
    while time.time() < deadline:
        if not [t for t in threading.enumerate() if t.name.startswith("placer-") and t.is_alive()]:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_batch_is_named_and_the_state_kept(workers):
    p = pipeline(fail_at=5)
    with pytest.raises(StageFailedError) as err:
        execute(p, "all=cpu", stream=StreamConfig(workers=workers))
    msg = str(err.value)
    assert err.value.stage == "augment"
    assert "batch 5 of epoch 0" in msg and "5 batches done" in msg and "bad batch 5" in msg
    assert "model" in err.value.outputs["train"]
    assert err.value.outputs["table"].shape == (N, 4)
    assert _no_stream_threads()


def test_a_source_failing_mid_epoch_is_named():
    with pytest.raises(StageFailedError) as err:
        execute(pipeline(fail_at=3, fail_in="source"), "all=cpu", stream=StreamConfig(workers=2))
    assert err.value.stage == "batches" and "corrupt record" in str(err.value)
    assert "3 batches done" in str(err.value)
    assert _no_stream_threads()


def test_process_workers_are_refused_for_a_stage_not_on_the_cpu():
    with pytest.raises(PlacerError, match="process workers run per-batch CPU stages only, and 'decode' is a "
                                          "stage on gpu-sim"):
        execute(pipeline(), "all=cpu,decode=gpu-sim", stream=StreamConfig(worker_kind={"decode": "process"}))


@pytest.mark.parametrize("workers", [1, 3])
def test_a_cache_after_a_stage_with_several_workers_replays_the_first_epoch_in_order(workers):
    """Workers finish out of order; the cache must still replay batch i as batch i."""
    p = pipeline(epochs=3, augment_sleep=0.002)
    ref = reference(pipeline(epochs=3))
    for _ in range(2):
        run = execute(p, "all=cpu", stream=StreamConfig(workers=workers, stage_workers={"decode": 3},
                                                        cache="decode"))
        assert run.outputs_digest == ref.outputs_digest
    decode = next(s for s in run.streams[0].stages if s.name == "decode")
    assert decode.batches == N // B  # replayed batches are passed on, not counted as worked on


@pytest.mark.parametrize("workers", [0, 2])
def test_the_source_can_be_the_cache_point(workers):
    calls: list = []
    p = Pipeline("cached-source")

    @p.source(epochs=3)
    def src():
        calls.append(1)
        return [np.full(2, i, dtype=np.float64) for i in range(5)]

    @p.step(kind="inference")
    def collect(src):
        return float(src[0])

    run = execute(p, "all=cpu", stream=StreamConfig(workers=workers, cache="src"))
    assert run.final_outputs["collect"] == [0.0, 1.0, 2.0, 3.0, 4.0] * 3
    assert len(calls) == 1


def test_the_steps_init_is_timed_as_setup_not_hidden():
    p = Pipeline("slow-init")

    @p.source()
    def src():
        return [np.zeros(2)] * 3

    def init():
        time.sleep(0.3)
        return 0.0

    @p.step(kind="training", init=init)
    def acc(src, state):
        return state + float(src.sum())

    s = execute(p, "all=cpu", stream=StreamConfig(workers=1)).streams[0]
    assert s.setup_s >= 0.3 > s.seconds


# -- the steady state and torch threads -------------------------------------------------------------
def test_the_steady_state_leaves_out_the_batches_that_filled_the_queues():
    from placer.executor.stream.runner import steady_rate

    # the first batch leaves the step at 1 s (warm-up); 8 batches read meanwhile then come 10 ms apart;
    # after them the stream makes one every 100 ms: 10 samples a batch
    finished = [(1.0, 10)] + [(1.0 + 0.01 * i, 10) for i in range(1, 9)] + [(1.08 + 0.1 * i, 10) for i in range(1, 25)]
    assert steady_rate(finished, skip=9) == pytest.approx(100.0)
    assert steady_rate(finished, skip=1) > 1.25 * 100.0  # from the first batch on, the filled queues flatter it
    assert steady_rate(finished[:2]) is None


def test_a_run_counts_the_batches_read_while_the_first_was_in_the_step():
    slow_first = {"done": False}
    p = Pipeline("warm", size=64, size_unit="samples")

    @p.source(epochs=1, batch_size=4)
    def rows():
        for i in range(16):
            yield np.full((4, 2), i, dtype=np.float32)

    @p.stage(kind="preprocessing", device="cpu")
    def double(rows):
        time.sleep(0.01)  # the stream makes a batch of 4 every 10 ms at most: 400 samples/s
        return rows * 2.0

    @p.step()
    def total(double):
        if not slow_first["done"]:
            slow_first["done"] = True
            time.sleep(0.3)  # the first step is slow, as a first training step is
        return float(double.sum())

    run = execute(p, "all=cpu", stream=StreamConfig(workers=1, prefetch=4))
    s = run.streams[0]
    assert s.batches == 16
    # about 9 batches were waiting when the first left the step; draining them would read ~1,000 samples/s
    assert s.samples_per_s < 1.4 * 400, s.samples_per_s


def test_torch_threads_are_set_for_the_run_and_restored():
    seen = []
    p = Pipeline("threads", size=32, size_unit="samples")

    @p.source(epochs=1, batch_size=8)
    def rows():
        for i in range(4):
            yield np.full((8, 2), i, dtype=np.float32)

    @p.step()
    def total(rows):
        seen.append(torch.get_num_threads())
        return float(rows.sum())

    before = torch.get_num_threads()
    for workers in (0, 1):
        seen.clear()
        execute(p, "all=cpu", stream=StreamConfig(workers=workers, torch_threads=1))
        assert seen == [1] * 4, (workers, seen)
        assert torch.get_num_threads() == before
    seen.clear()
    execute(p, "all=cpu", stream=StreamConfig(workers=1))
    assert seen == [before] * 4
