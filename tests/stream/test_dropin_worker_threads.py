"""Threads inside worker processes: one per worker measured where workers x threads pass the cores, applied by
advice.loader() through a worker_init_fn composed with the user's."""

import os
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer.executor.stream.source import rebuild_loader
from placer.executor.stream.worker_init import WorkerThreads, blas_control, blas_threads
from placer.stream.dropin import headtohead, phases, samples, worker_threads
from placer.stream.dropin.measuring import rebuild
from placer.stream.dropin.runs import Budget
from placer.stream.dropin.trial import Trial
from placer.stream.rounds import MIN_GAIN, REPEATS
from placer.timing import Deadline


def mark_worker(worker_id):
    os.environ["PLACER_TEST_WORKER_INIT"] = f"ran {worker_id}"


class Threads(Dataset):
    """Each item: the threads torch and BLAS run with in the worker, and whether the user's init ran there."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([torch.get_num_threads(), blas_threads(),
                             float(os.environ.get("PLACER_TEST_WORKER_INIT", "").startswith("ran"))])


class Matmul(Dataset):
    """BLAS work per sample (numpy's matrix products), as augmentation or feature code does."""

    def __init__(self):
        self.m = np.random.default_rng(0).standard_normal((256, 256))

    def __len__(self):
        return 60

    def __getitem__(self, i):
        x = self.m
        for _ in range(2):
            x = np.tanh(x @ self.m / 16)
        return torch.from_numpy(x[:2, :2].copy() + i)


def test_the_worker_init_fn_sets_the_threads_then_calls_the_users_and_pickles():
    loader = DataLoader(Threads(), batch_size=1, num_workers=2, worker_init_fn=mark_worker)
    one = rebuild_loader(loader, {"num_workers": 2, "prefetch_factor": 2}, threads_per_worker=1)
    assert isinstance(one.worker_init_fn, WorkerThreads) and one.worker_init_fn.user is mark_worker
    # spawned or forkserver workers receive it pickled
    assert pickle.loads(pickle.dumps(one.worker_init_fn)).threads == 1
    for torch_n, blas_n, user_ran in (b[0].tolist() for b in one):
        assert torch_n == 1 and user_ran == 1.0
        if blas_control() != "none":
            assert blas_n == 1
    assert rebuild_loader(loader, {"num_workers": 2}).worker_init_fn is mark_worker  # without it: the user's own


def _advising(loader):
    # the check's rounds take a quarter of budget_s more: 4 s
    a = phases.start(loader, lambda b: None, device=None, batches=10, budget_s=16, epochs=1)
    a.budget = Budget(2.0, runs=3)
    a.budget.shape = (1, a.per_epoch)
    phases.measure_yours(a)
    a.best = a.mine
    a.trials = [a.mine]
    return a


def _trial(settings, rates, started):
    return Trial(settings=settings, samples_per_s=float(np.median(rates)), first_batch_s=0.01, fetch_fraction=0.5,
                 batches=10, samples=20, seconds=0.1, repeats=tuple(rates), started=tuple(started))


@pytest.mark.parametrize("other_rates, recommended", [((150.0, 160.0, 170.0), True),   # every round won
                                                      ((150.0, 90.0, 170.0), False),   # a round lost
                                                      ((150.0, 160.0), False)])        # too few rounds
def test_one_thread_per_worker_is_recommended_iff_its_rounds_beat_the_settings(monkeypatch, other_rates,
                                                                               recommended):
    a = _advising(DataLoader(torch.arange(64.0), batch_size=4, num_workers=2))
    timed = samples.Timed(((0.01, 0.01),), own_cpu_s=1.0, other_cpu_s=1.0)  # reading a sample ran two threads

    def rounds(adv, base, other):
        n = len(other_rates)
        return (_trial(base, [100.0] * n, range(0, 2 * n, 2)), _trial(other, other_rates, range(1, 2 * n, 2)))

    monkeypatch.setattr(headtohead, "side_by_side", rounds)
    monkeypatch.setattr(worker_threads, "blas_threads", lambda: 2)
    monkeypatch.setattr(a, "cores", 2)
    out = worker_threads.consider(a, timed)
    assert out["recommended"] is recommended and out["faster"] is recommended
    assert (a.best.settings.threads_per_worker == 1) is recommended
    assert any(("one thread per worker" in n) for n in a.notes)
    if recommended:
        assert a.best.as_dict()["threads_per_worker"] == 1 and "worker_init_fn" in a.notes[-1]


@pytest.mark.slow
def test_blas_work_in_two_workers_is_measured_and_the_batches_are_unchanged():
    loader = DataLoader(Matmul(), batch_size=1, num_workers=2)
    a = _advising(loader)
    # CPU seconds are read in clock ticks (10 ms): all 60 samples (a few ms each), not the 10 of the runs' batches,
    # keep the threads' CPU ratio above the ticks' grain
    timed = samples.time_samples(loader, len(loader), Deadline(3.0))
    if blas_control() == "none" or blas_threads() < 2 or a.cores > 2:
        pytest.skip("needs a BLAS pool of 2 threads or more that can be set, and at most 2 cores")
    assert timed.threads_busy > worker_threads.BUSY  # numpy's products ran in the BLAS pool's threads too
    out = worker_threads.consider(a, timed)
    assert out["measured_gain"] is not None and out["rounds"] >= 1
    # the rule, whatever this loaded machine measured: recommended exactly where its rounds beat the settings
    assert out["recommended"] == out["faster"]
    if out["faster"]:
        assert out["rounds"] >= REPEATS and out["measured_gain"] > 1 + MIN_GAIN
    assert (a.best.settings.threads_per_worker == 1) == out["recommended"]
    one = rebuild(loader, a.mine.settings.model_copy(update={"threads_per_worker": 1}))
    assert [b.tolist() for b in one] == [b.tolist() for b in loader]  # the same batches, in the same order
