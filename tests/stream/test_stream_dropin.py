"""The drop-in for an existing training script: advice on its DataLoader, measured against its step."""

from __future__ import annotations

import json
import time

import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler, TensorDataset

from placer.stream import LoaderSettings, advise_loader, measure
from placer.stream.dropin import choose, rebuild, Trial


class SlowDataset(Dataset):
    """Each sample waits ``delay`` seconds: a loader-bound script when the step is quick."""

    def __init__(self, n: int, delay: float = 0.004):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.full((4,), float(i)), i


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(40))


def quick_step(batch):
    x, _ = batch
    return (x * 2).sum()


def slow_step(batch):
    time.sleep(0.025)


def tensors(n=200):
    return TensorDataset(torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n))


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert all(torch.equal(u, v) for u, v in zip(x, y))


def children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def no_new_children():
    """Fails a test that leaves a process behind (processes of earlier tests do not count)."""
    before = children()
    yield
    left = children() - before
    assert not left, f"worker processes outlived the advice: {sorted(left)}"


@pytest.mark.slow
def test_a_loader_bound_script_is_told_to_use_worker_processes_and_gains(no_new_children):
    loader = DataLoader(SlowDataset(400, delay=0.002), batch_size=16, shuffle=False, num_workers=0)
    advice = advise_loader(loader, quick_step, batches=10, budget_s=12)
    assert advice.bottleneck == "loader"
    assert advice.wait_fraction > 0.5
    assert advice.loader_samples_per_s < advice.step_samples_per_s
    rec = advice.recommended.settings
    # the samples sleep (the GIL is free): worker processes or threads, perhaps more than the cores
    assert advice.change and rec.num_workers > 0 and rec.worker_kind in ("processes", "threads")
    assert rec.persistent_workers is (rec.worker_kind == "processes")
    assert rec.prefetch_factor in (1, 2, 4, 8) and not rec.pin_memory
    assert advice.speedup > 1.3 and advice.confirmed["held"]
    text = str(advice)
    assert "the loader caps you at" in text and "x yours" in text and "Confirmed by longer runs" in text
    assert ("DataLoader(..., num_workers=" if rec.worker_kind == "processes" else "ThreadLoader(") in text


@pytest.mark.slow
def test_a_step_bound_script_is_told_its_loader_is_fast_enough(no_new_children):
    loader = DataLoader(tensors(), batch_size=10, num_workers=0)
    advice = advise_loader(loader, slow_step, batches=12, budget_s=5)
    assert advice.bottleneck == "step"
    assert advice.wait_fraction < 0.2
    assert advice.loader_samples_per_s > 5 * advice.step_samples_per_s
    assert not advice.change and advice.recommended is advice.user and advice.speedup == 1.0
    assert "fast enough" in str(advice) and "keep your settings" in str(advice)


@pytest.mark.slow
def test_a_step_bound_script_with_workers_keeps_them_or_is_told_fewer_do(no_new_children):
    loader = DataLoader(tensors(), batch_size=10, num_workers=2)
    advice = advise_loader(loader, slow_step, batches=12, budget_s=5)
    assert advice.bottleneck == "step"
    assert advice.recommended.settings.num_workers <= 2
    assert advice.speedup > 0.8


def test_the_choice_prefers_the_users_settings_unless_another_is_clearly_faster():
    def trial(w, rate):
        s = LoaderSettings(num_workers=w, prefetch_factor=2 if w else None, pin_memory=False,
                           persistent_workers=False, torch_threads=1)
        return Trial(settings=s, samples_per_s=rate, first_batch_s=0.0, fetch_fraction=0.0, batches=1, samples=1,
                     seconds=1.0)

    mine, w1, w2 = trial(0, 100.0), trial(1, 103.0), trial(2, 104.5)  # within MIN_GAIN (5 %)
    assert choose(mine, [mine, w1, w2]) is mine
    fast1, fast2 = trial(1, 190.0), trial(2, 199.0)
    assert choose(mine, [mine, fast1, fast2]) is fast1  # within 5 % of the best with fewer workers
    many, few = trial(4, 100.0), trial(1, 98.0)
    assert choose(many, [many, few]) is few


def test_the_tuned_loader_yields_the_same_batches_in_order_with_a_seeded_shuffle():
    g = torch.Generator().manual_seed(7)
    loader = DataLoader(SlowDataset(120, delay=0.003), batch_size=8, shuffle=True, generator=g, num_workers=0)
    before = g.get_state()
    # ten epochs: starting workers once pays (one epoch of 15 batches may not repay it); no cache in the
    # dataset (with one, no workers can be as fast, and the advice then keeps yours: tests/stream/test_dataset_cache.py)
    advice = advise_loader(loader, quick_step, batches=6, budget_s=4, epochs=10, cache_bytes=0)
    assert torch.equal(g.get_state(), before), "measuring moved the loader's generator"
    # whatever the runs chose under this machine's load, the advice's loader reads the same batches; the
    # rebuild with worker processes below checks the same where workers are chosen
    expected = list(loader)
    g.set_state(before)
    tuned = advice.loader()
    assert tuned.num_workers == advice.recommended.settings.num_workers
    same_batches(list(tuned), expected)
    g.set_state(before)
    two = rebuild(loader, LoaderSettings(num_workers=2, prefetch_factor=4, pin_memory=False,
                                         persistent_workers=False, torch_threads=1))
    same_batches(list(two), expected)
    assert sorted(torch.cat([y for _, y in expected]).tolist()) == list(range(120))


@pytest.mark.slow
def test_an_unseeded_shuffle_follows_torchs_global_seed_and_advice_leaves_it_as_found():
    loader = DataLoader(tensors(60), batch_size=6, shuffle=True)
    torch.manual_seed(3)
    expected = list(loader)
    torch.manual_seed(3)
    advise_loader(loader, quick_step, batches=4, budget_s=10)
    same_batches(list(loader), expected)  # as if the advice had not run
    torch.manual_seed(3)
    tuned = rebuild(loader, LoaderSettings(num_workers=1, prefetch_factor=2, pin_memory=False,
                                           persistent_workers=False, torch_threads=1))
    same_batches(list(tuned), expected)


def test_a_batch_sampler_is_kept():
    ds = tensors(50)
    loader = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), batch_size=7, drop_last=True))
    tuned = rebuild(loader, LoaderSettings(num_workers=2, prefetch_factor=2, pin_memory=False,
                                           persistent_workers=False, torch_threads=1))
    same_batches(list(tuned), list(loader))
    assert len(list(tuned)) == 7


def test_an_iterable_dataset_keeps_its_workers():
    loader = DataLoader(Stream(), batch_size=4)
    advice = advise_loader(loader, lambda b: None, batches=5, budget_s=10)
    assert all(t.settings.num_workers == 0 for t in advice.trials)
    assert [b.tolist() for b in advice.loader()] == [b.tolist() for b in loader]


@pytest.mark.slow
def test_the_json_has_the_documented_keys():
    loader = DataLoader(SlowDataset(80, delay=0.001), batch_size=8)
    data = json.loads(advise_loader(loader, quick_step, batches=4, budget_s=10).to_json())
    assert {"bottleneck", "wait_fraction", "samples_per_s", "stages", "user", "recommended", "change", "speedup",
            "threads", "trials", "notes", "seconds"} <= set(data)
    assert data["stages"] == {"loader": "cpu", "step": "cpu"}
    assert set(data["samples_per_s"]) == {"pipeline", "loader", "step"}
    keys = {"num_workers", "worker_kind", "prefetch_factor", "pin_memory", "persistent_workers", "torch_threads",
            "samples_per_s", "first_batch_s", "fetch_fraction", "batches", "samples", "seconds"}
    assert keys <= set(data["recommended"]) and all(keys <= set(t) for t in data["trials"])
    assert data["user"]["worker_kind"] == "main process" and data["user"]["prefetch_factor"] is None
    assert data["trials"][0] == data["user"]


@pytest.mark.slow
def test_the_budget_bounds_the_runs(no_new_children):
    loader = DataLoader(SlowDataset(2000, delay=0.005), batch_size=32)
    advice = advise_loader(loader, quick_step, batches=50, budget_s=3)
    assert advice.seconds < 3 + 4  # each run stops at its share; starting workers is not cut short
    assert all(t.batches < 49 for t in advice.trials)


@pytest.mark.slow
def test_a_step_on_the_simulated_device_is_synchronised_there_and_gets_no_pinned_memory():
    loader = DataLoader(tensors(), batch_size=20)
    advice = advise_loader(loader, quick_step, batches=4, budget_s=10, device="gpu-sim")
    assert advice.step_device == "gpu-sim"
    assert not any(t.settings.pin_memory for t in advice.trials)
    assert "the GPU" not in str(advice)


def test_measure_reports_the_wait_in_the_users_own_loop():
    loader = DataLoader(SlowDataset(96, delay=0.004), batch_size=8)
    seen = []
    wrapped = measure(loader)
    for x, y in wrapped:
        quick_step((x, y))
        seen.append(y)
    assert torch.equal(torch.cat(seen), torch.arange(96)) and len(wrapped) == 12
    advice = wrapped.advice()
    assert advice.bottleneck == "loader" and advice.wait_fraction > 0.5
    assert advice.user.batches == 11 and advice.user.samples == 88
    assert not advice.change and "measured in your loop" in str(advice)


def test_measure_sees_a_slow_step():
    wrapped = measure(DataLoader(tensors(40), batch_size=10))
    for batch in wrapped:
        slow_step(batch)
    advice = wrapped.advice()
    assert advice.bottleneck == "step" and advice.wait_fraction < 0.2


def test_a_loader_too_short_to_measure_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="too few batches"):
        advise_loader(DataLoader(tensors(5), batch_size=5), quick_step, batches=4)


@pytest.mark.gpu
def test_on_a_gpu_pinned_memory_is_tried_and_the_step_is_waited_for(no_new_children):
    model = torch.nn.Linear(4, 4).cuda()

    def step(batch):
        x, _ = batch
        model(x.cuda(non_blocking=True)).sum().backward()

    loader = DataLoader(SlowDataset(200, delay=0.002), batch_size=16)
    advice = advise_loader(loader, step, batches=8, budget_s=30, device="gpu")
    assert advice.step_device == "gpu:0" and "the gpu waits" in str(advice).lower(), str(advice)
    assert any(t.settings.pin_memory for t in advice.trials)
    assert advice.recommended.settings.num_workers > 0


def test_a_trial_keeps_every_wait_on_the_loader_as_one_measurement():
    from placer.devices import discover
    from placer.stream.dropin import run_loader
    from placer.timing import Deadline

    loader = DataLoader(SlowDataset(48, delay=0.002), batch_size=4)
    trial = run_loader(loader, quick_step, batches=8, warmup=1, device=discover().resolve("cpu"),
                       deadline=Deadline(30))
    assert trial.fetch.reps == trial.batches == 7  # the warm-up batch is not counted
    assert min(trial.fetch.raw_times) >= 4 * 0.002 * 0.9  # each wait: four samples of 2 ms
    assert trial.fetch_fraction == pytest.approx(sum(trial.fetch.raw_times) / trial.seconds)
    assert trial.fetch.median_s > 0 and trial.fetch.iqr_s >= 0
    assert "fetch" not in trial.as_dict()  # the saved advice keeps its keys
