"""The drop-in without ``epochs=``: one epoch assumed and said; a cache that pays over more epochs still offered."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from placer.data.stream import LoaderSettings
from placer.stream import advise_loader
from placer.stream.dataset_cache import CacheAdvice
from placer.stream.dropin import whole
from placer.stream.dropin.epochs import epoch_aware, run_epochs
from placer.stream.dropin.trial import Trial
from placer.stream.rounds import MIN_GAIN


def trial(rate: float, first: float = 0.1) -> Trial:
    return Trial(settings=LoaderSettings(num_workers=0, torch_threads=2), samples_per_s=rate, first_batch_s=first,
                 fetch_fraction=0.5, batches=10, samples=80, seconds=80 / rate, close_s=0.0)


def one_epoch_run():
    user = trial(80.0)
    return whole.whole_run(user, user, [user], None, epochs=1, batches=10)


def cache(fill: float = 1.2, hit: float = 0.3) -> CacheAdvice:
    return CacheAdvice("Arrays.load", uncached_s=[1.0], fill_s=fill, cached_s=[hit], recommended=True)


def test_an_assumed_one_epoch_run_still_offers_a_cache_with_the_epochs_it_needs_to_pay():
    run, kept = whole.cache_over_the_run(one_epoch_run(), cache(), assumed=True)
    assert kept.recommended and run is not None and "cache" not in run  # the run's own prediction has no cache
    n = kept.pays_from_epochs
    # the fewest epochs that pay by MIN_GAIN: n does, n - 1 does not
    assert n is not None and n > 1
    assert whole.cache_over_epochs(run, kept, n) >= 1 + MIN_GAIN > whole.cache_over_epochs(run, kept, n - 1)
    assert set(kept.by_epochs) == {1, n, max(n, 10)} and kept.by_epochs[1] < 1 < kept.by_epochs[max(n, 10)]
    words = kept.sentence()
    assert f"pays from {n} epochs" in words and "epochs 2+ 3.3x faster" in words and "pass epochs=" in words
    assert kept.as_dict()["pays_from_epochs"] == n and kept.as_dict()["by_epochs"]["1"] == kept.by_epochs[1]


def test_a_run_said_to_be_one_epoch_gets_no_cache_but_hears_when_it_would_pay():
    run, kept = whole.cache_over_the_run(one_epoch_run(), cache(), assumed=False)
    assert not kept.recommended and "it pays from" in kept.reason
    assert f"it pays from {kept.pays_from_epochs} epochs" in kept.reason


def test_a_cache_that_never_pays_is_not_offered_even_when_the_epochs_were_assumed():
    # reading the cache is as slow as computing: no number of epochs makes it pay
    run, kept = whole.cache_over_the_run(one_epoch_run(), cache(fill=1.2, hit=1.0), assumed=True)
    assert not kept.recommended and kept.pays_from_epochs is None and "pays from" not in kept.reason


@pytest.mark.parametrize("fill,hit", [(1.0, 0.9), (1.3, 0.5), (2.0, 0.1), (1.05, 0.97)])
def test_the_gain_with_a_cache_only_rises_with_the_epochs(fill, hit):
    run = one_epoch_run()
    gains = [whole.cache_over_epochs(run, cache(fill, hit), k) for k in range(1, 40)]
    assert all(b >= a - 1e-12 for a, b in zip(gains, gains[1:]))


class EpochSampler(RandomSampler):
    def set_epoch(self, epoch: int) -> None:
        self.generator = torch.Generator().manual_seed(epoch)


def test_the_assumption_names_a_sampler_meant_for_several_epochs():
    data = list(range(16))
    assert epoch_aware(DataLoader(data, batch_size=4)) is None
    loader = DataLoader(data, batch_size=4, sampler=EpochSampler(data))
    assert epoch_aware(loader) == "EpochSampler"
    epochs, said = run_epochs(loader, None, 4)
    assert epochs == 1 and "EpochSampler has set_epoch" in said and "one epoch of 4 batches" in said
    assert run_epochs(loader, 7, 4) == (7, None)


class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.full((4,), float(i))


@pytest.mark.slow
def test_advice_without_epochs_says_what_it_assumed_and_with_them_does_not():
    loader = DataLoader(Slow(), batch_size=8)
    advice = advise_loader(loader, lambda b: None, batches=4, budget_s=3, cache_bytes=0)
    assert advice.epochs_assumed is not None and advice.epochs_assumed in advice.notes
    assert advice.whole_run is not None and advice.whole_run["epochs"] == 1
    assert json.loads(advice.to_json())["epochs_assumed"] == advice.epochs_assumed
    assert advice.epochs_assumed in str(advice)
    given = advise_loader(loader, lambda b: None, batches=4, budget_s=3, cache_bytes=0, epochs=2)
    assert given.epochs_assumed is None and given.whole_run["epochs"] == 2
