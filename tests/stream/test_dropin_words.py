"""The drop-in's words agree with what it measured: samples counted right, no advice within noise,
no note that does not apply, nothing an accelerator-less machine cannot use."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer.data.stream import LoaderSettings
from placer.executor.stream.nodes import batch_len, leading_len
from placer.stream import advise_loader, dropin
from placer.stream.dropin import Trial, candidates, draws_unseeded, measure


class Requests(Dataset):
    """Text requests: each sample is a string (and an id), as a serving loop reads them."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return f"request number {i}", i


class Strings(Requests):
    def __getitem__(self, i):
        return f"request number {i}"


class Plain(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((3,), float(i))


class Unseeded(Plain):
    def __getitem__(self, i):
        return torch.full((3,), float(i)) + torch.rand(3)


class SeededPerSample(Plain):
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.full((3,), float(i)) + torch.rand(3, generator=g)


class NumpyUnseeded(Plain):
    def __getitem__(self, i):
        return np.full(3, float(i)) + np.random.rand(3)


def test_a_batch_of_strings_counts_its_strings_not_one_sample():
    loader = DataLoader(Requests(), batch_size=16)
    batch = next(iter(loader))
    assert isinstance(batch[0], (list, tuple)) and isinstance(batch[0][0], str)
    assert batch_len(batch) == 16
    assert batch_len(next(iter(DataLoader(Strings(), batch_size=8)))) == 8
    assert leading_len([["a", "b"], ["c", "d"]]) == 2 and leading_len(object()) is None


def test_samples_come_from_the_batch_size_when_the_batch_does_not_say_and_a_note_when_neither_does():
    class Opaque:
        pass

    with_size = measure(DataLoader(Plain(), batch_size=8, collate_fn=lambda b: Opaque()))
    for _ in with_size:
        pass
    assert with_size.trial().samples == 8 * 7 and not any("counted as batches" in n for n in with_size.advice().notes)
    sizeless = measure(DataLoader(Plain(), batch_size=None, collate_fn=lambda b: Opaque()))
    for _ in sizeless:
        pass
    assert sizeless.trial().samples == 63
    assert any("counted as batches" in n for n in sizeless.advice().notes)


def scripted(monkeypatch, rates: dict[int, float], step_rate: float, loader_rate: float):
    """Measuring returns fixed rates: ``rates`` by num_workers with the step, ``loader_rate`` without."""
    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        # more workers than listed: the rate has stopped rising
        rate = rates.get(loader.num_workers, rates[max(rates)]) if step is not None else loader_rate
        return Trial(settings=dropin.settings_of(loader), samples_per_s=rate, first_batch_s=0.01,
                     fetch_fraction=0.1, batches=10, samples=10 * 8, seconds=80 / rate)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: step_rate)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)


def test_a_consumer_bound_loop_gets_no_loader_recommendation(monkeypatch):
    # one run measured 2 workers 17 % faster, but the step does not wait: that is noise
    scripted(monkeypatch, {0: 1000.0, 1: 1050.0, 2: 1170.0}, step_rate=1010.0, loader_rate=5000.0)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    text = str(advice)
    assert not advice.change and "num_workers=2" not in text.split("Measured")[0]
    assert "fast enough" in text and "within noise" in text


def test_a_step_that_waits_a_large_share_is_not_told_the_loader_is_fast_enough(monkeypatch):
    scripted(monkeypatch, {0: 680.0, 1: 700.0, 2: 690.0}, step_rate=1000.0, loader_rate=5000.0)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    assert advice.wait_fraction == pytest.approx(0.32)
    assert "fast enough" not in str(advice) and "waits for data 32%" in str(advice)


def test_a_clear_speed_up_is_recommended_without_fast_enough_words(monkeypatch):
    scripted(monkeypatch, {0: 500.0, 1: 900.0, 2: 950.0}, step_rate=1000.0, loader_rate=520.0)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    assert advice.change and advice.speedup > 1.5 and "fast enough" not in str(advice)


def test_more_workers_than_cores_only_while_the_rate_rises_and_no_pinned_memory_without_an_accelerator(
        monkeypatch):
    user = LoaderSettings(num_workers=0, torch_threads=2)
    for s in candidates(user, cores=2, gpu=False, iterable=False):
        assert s.num_workers <= 2 and not s.pin_memory
    # workers are also tried with the step's threads cut to the cores they leave (a CPU step only)
    pairs = {(s.num_workers, s.worker_threads, s.torch_threads) for s in candidates(user, cores=2, gpu=False,
                                                                                     iterable=False)}
    assert {(2, False, 1), (2, True, 1), (1, False, 1), (2, False, 2), (2, True, 2)} <= pairs
    assert all(s.torch_threads == 2 for s in candidates(user, cores=2, gpu=True, iterable=False))
    # 2 workers rose over 1 (so 3 is tried), 3 did not rise (so 4 is not): the advice asks for 2
    scripted(monkeypatch, {0: 500.0, 1: 900.0, 2: 950.0}, step_rate=1000.0, loader_rate=520.0)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    counts = {t.settings.num_workers for t in advice.trials if not t.settings.worker_threads}
    assert 3 in counts and 4 not in counts
    assert advice.recommended.settings.num_workers <= 2
    assert not any(t.settings.pin_memory for t in advice.trials)
    assert "pin_memory=True" not in str(advice) and "GPU" not in str(advice)
    # flat from 1 worker on: nothing above the cores is tried
    scripted(monkeypatch, {0: 500.0, 1: 900.0, 2: 900.0}, step_rate=1000.0, loader_rate=520.0)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    assert max(t.settings.num_workers for t in advice.trials) <= 2
    assert advice.recommended.settings.num_workers == 1


def test_the_random_draw_check_tells_unseeded_draws_from_none_and_per_sample_seeds():
    assert draws_unseeded(Unseeded()) and draws_unseeded(NumpyUnseeded())
    assert not draws_unseeded(Plain()) and not draws_unseeded(SeededPerSample()) and not draws_unseeded(Requests())
    before = torch.get_rng_state()
    draws_unseeded(Unseeded())
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("dataset, noted", [(Plain(), False), (SeededPerSample(), False), (Unseeded(), True)])
def test_the_note_on_random_draws_only_when_the_dataset_draws_unseeded(monkeypatch, dataset, noted):
    scripted(monkeypatch, {0: 500.0, 1: 900.0, 2: 950.0}, step_rate=1000.0, loader_rate=520.0)
    advice = advise_loader(DataLoader(dataset, batch_size=8), lambda b: None)
    assert advice.change
    assert any("draws random numbers" in n for n in advice.notes) is noted


def rated(monkeypatch, rate, *, step_rate: float, fetch: float = 0.5) -> None:
    """Each run with the step measures ``rate(settings)`` samples/s (its torch threads included); the
    loader alone 5000; the step alone ``step_rate``; 2 cores."""
    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        s = dropin.settings_of(loader)
        r = rate(s) if step is not None else 5000.0
        return Trial(settings=s, samples_per_s=r, first_batch_s=0.01, fetch_fraction=fetch, batches=10, samples=80,
                     seconds=80 / r)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: step_rate)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)


def advise_at_two_threads(loader, **kw):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return advise_loader(loader, lambda b: None, **kw)
    finally:
        torch.set_num_threads(before)


def test_fewer_step_threads_are_tried_with_the_best_workers_of_each_kind(monkeypatch):
    """On few cores the loader's workers and the step's threads compete: thread workers that lose to
    the user's settings at 2 torch threads win at 1, though neither knob wins alone."""
    def rate(s):
        if s.num_workers == 0:
            return 100.0 if s.torch_threads == 2 else 90.0
        if s.worker_threads:
            return 95.0 if s.torch_threads == 2 else 140.0
        return 98.0 if s.torch_threads == 2 else 99.0

    rated(monkeypatch, rate, step_rate=10_000.0)
    advice = advise_at_two_threads(DataLoader(Plain(), batch_size=8), epochs=1)
    tried = {(t.settings.num_workers > 0, t.settings.worker_threads, t.settings.torch_threads) for t in advice.trials}
    assert (True, True, 1) in tried  # thread workers at one torch thread were measured
    rec = advice.recommended.settings
    assert advice.change and rec.worker_threads and rec.torch_threads == 1


def test_fewer_step_threads_are_tried_without_workers_too(monkeypatch):
    # a step whose threads contend for loaded cores: 1 thread measures 4x faster, with no workers
    rated(monkeypatch, lambda s: 400.0 if s.torch_threads == 1 else 100.0, step_rate=101.0, fetch=0.01)
    advice = advise_at_two_threads(DataLoader(Plain(), batch_size=8))
    assert advice.recommended.settings.num_workers == 0 and advice.recommended.settings.torch_threads == 1
    assert advice.threads["helped"] and advice.steady_speedup == pytest.approx(4.0)
    # the whole run (8 batches, the first after 0.01 s): 0.01 + 7 x 80 ms against 0.01 + 7 x 20 ms
    assert advice.speedup == pytest.approx((0.01 + 7 * 0.08) / (0.01 + 7 * 0.02))
    text = str(advice)
    assert "torch.set_num_threads(1)" in text and "fast enough" not in text
    assert dropin.thread_counts(2, 0, 2) == [1] and dropin.thread_counts(8, 2, 4) == [2, 1]
    assert dropin.thread_counts(1, 0, 2) == []


# -- measuring enough to decide ------------------------------------------------------------------
def sequenced(monkeypatch, rates: dict[int, list[float]], *, step_rate=10_000.0, sleep=0.0):
    """Each run of ``num_workers=w`` returns the next rate of ``rates[w]``; the calls are recorded."""
    import time

    calls, runs = [], {w: iter(r * 10) for w, r in rates.items()}

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        time.sleep(sleep)
        if keep is not None:
            keep.append(next(iter(loader)))
        if step is None:
            rate = 1e6
        elif getattr(loader, "worker_threads", False) or loader.num_workers not in runs:
            rate = 1.0  # thread workers, and more workers than listed: slow (not what these tests are about)
        else:
            calls.append(loader.num_workers)
            rate = next(runs[loader.num_workers])
        return Trial(settings=dropin.settings_of(loader), samples_per_s=rate, first_batch_s=0.01,
                     fetch_fraction=0.5, batches=10, samples=80, seconds=1e-4)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: step_rate)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    monkeypatch.setattr(dropin.space, "thread_counts", lambda *a: [])
    monkeypatch.setattr(dropin.space, "prefetch_depths", lambda *a: [])
    # the calls counted here are the workers' at the user's step threads; the pairs with fewer step
    # threads are tested in test_more_workers_than_cores_only_while_the_rate_rises...
    first = dropin.candidates
    monkeypatch.setattr(dropin.space, "candidates",
                        lambda user, **kw: [s for s in first(user, **kw) if s.torch_threads == user.torch_threads])
    return calls


def test_finalists_run_repeatedly_and_interleaved_and_a_clear_gain_is_recommended(monkeypatch):
    calls = sequenced(monkeypatch, {0: [100.0, 104.0, 98.0], 1: [150.0, 155.0, 148.0], 2: [200.0, 190.0, 205.0]})
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    # the first round (yours, then workers 1 at prefetch 2 and 4, 2 at 2 and 4), then rounds over the finalists,
    # then the confirming longer runs: yours and the recommended, in turn
    assert calls[:5] == [0, 1, 1, 2, 2]
    confirming = 2 * dropin.CONFIRM_AGREED  # runs that agree: CONFIRM_AGREED rounds
    assert calls[-confirming:] == [0, 2] * dropin.CONFIRM_AGREED
    rounds = calls[5:-confirming]
    half = len(rounds) // 2
    assert len(rounds) == 2 * half and rounds[:half] == rounds[half:]
    assert rounds[0] == 0
    assert advice.change and advice.recommended.settings.num_workers == 2
    assert len(advice.recommended.rates) == 3 and len(advice.user.rates) == 3
    assert advice.user.samples_per_s == 100.0 and advice.recommended.samples_per_s == 200.0
    doc = json.loads(advice.to_json())
    assert doc["user"]["repeats"] == [100.0, 104.0, 98.0] and doc["within_noise"] is None
    assert len(doc["user"]["reads"]) == 3  # each run's batches, seconds and first batch, kept through merging
    assert {"bottleneck", "wait_fraction", "samples_per_s", "user", "recommended", "change", "speedup", "threads",
            "trials", "notes", "seconds", "budget_s"} <= set(doc)


def test_confirming_runs_that_disagree_get_more_rounds_and_agreeing_ones_do_not(monkeypatch):
    # your settings' runs spread by 60 % (70 to 130): three confirming rounds cannot pin your whole run down
    calls = sequenced(monkeypatch, {0: [100.0, 70.0, 130.0], 1: [150.0, 155.0, 148.0], 2: [200.0, 190.0, 205.0]})
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    rounds = dropin.CONFIRM_MAX_ROUNDS
    assert rounds > dropin.CONFIRM_ROUNDS
    assert calls[-2 * rounds:] == [0, 2] * rounds
    assert advice.confirmed["runs"] == rounds
    assert "Confirmed by longer runs (%d each" % rounds in str(advice)
    # runs that agree (within CONFIRM_SPREAD) stop at CONFIRM_AGREED: more than three rounds side by side,
    # as three that agree may share one period of the machine's speed
    calls = sequenced(monkeypatch, {0: [100.0, 104.0, 98.0], 1: [150.0, 155.0, 148.0], 2: [200.0, 190.0, 205.0]})
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    assert dropin.CONFIRM_ROUNDS < dropin.CONFIRM_AGREED < dropin.CONFIRM_MAX_ROUNDS
    assert advice.confirmed["runs"] == dropin.CONFIRM_AGREED
    assert calls[-2 * dropin.CONFIRM_AGREED:] == [0, 2] * dropin.CONFIRM_AGREED


def test_a_gain_within_the_spread_keeps_your_settings_and_says_so(monkeypatch):
    # 2 workers' median is 20 % faster, but its runs overlap yours: noise
    sequenced(monkeypatch, {0: [100.0, 150.0, 90.0], 1: [100.0, 101.0, 99.0], 2: [120.0, 140.0, 110.0]})
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    assert not advice.change and advice.within_noise and "within noise" in advice.within_noise
    assert "keep your settings" in str(advice) and "within noise" in str(advice)
    assert "Recommended:   num_workers" not in str(advice)


def test_the_budget_is_respected_when_each_run_has_a_fixed_start_up_cost(monkeypatch):
    sequenced(monkeypatch, {0: [100.0], 1: [150.0], 2: [200.0]}, sleep=0.15)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None, budget_s=0.8)
    # without the check every run would start: about 14 of them, 2 s
    assert advice.seconds < 0.8 + 0.15 + 0.1
    assert advice.budget_s == 0.8 and "of a 0.8 s budget" in str(advice)


def test_a_step_that_waits_within_noise_keeps_its_loader_and_may_get_fewer_threads(monkeypatch):
    # the first run of yours was slow (so the first round picked workers), your median is not:
    # the step waits within noise, so only the step's threads change, on your loader
    seen = {"user": 0}

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        if step is None:
            rate = 5000.0
        elif torch.get_num_threads() == 1:
            rate = 400.0
        elif loader.num_workers == 0:
            seen["user"] += 1
            rate = 50.0 if seen["user"] == 1 else 100.0
        else:
            rate = 1e6
        return Trial(settings=dropin.settings_of(loader), samples_per_s=rate, first_batch_s=0.01,
                     fetch_fraction=0.01, batches=10, samples=80, seconds=80 / rate)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: 101.0)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    finally:
        torch.set_num_threads(before)
    assert advice.user.samples_per_s == 100.0 and advice.wait_fraction < dropin.WAIT_NOISE
    assert advice.recommended.settings.num_workers == 0 and advice.recommended.settings.torch_threads == 1
    assert len(advice.recommended.rates) == 3


def test_a_wait_smaller_than_the_spread_of_your_runs_is_noise(monkeypatch):
    # your runs spread 60 % around their median: a 20 % wait cannot be told from noise
    sequenced(monkeypatch, {0: [100.0, 140.0, 80.0], 1: [150.0, 150.0, 150.0], 2: [90.0]}, step_rate=125.0)
    advice = advise_loader(DataLoader(Plain(), batch_size=8), lambda b: None)
    assert advice.wait_fraction == pytest.approx(0.2) and advice.user.spread == pytest.approx(0.6)
    assert not advice.change and "fast enough" in str(advice) and "within noise" in str(advice)
