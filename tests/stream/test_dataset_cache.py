"""Caching found inside a user's Dataset: what may be cached, the shared store, same batches, the drop-in's offer."""

from __future__ import annotations

import multiprocessing
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer.executor.stream.store import SampleStore, plain_key
from placer.stream import advise_loader
from placer.stream.dataset_cache import CacheAdvice, CachedItems, cached, check, digest, find_cache, hit_rate, judge
from placer.timing import Deadline

PLAIN = Path(__file__).resolve().parents[2] / "benchmarks" / "plain"


class Decoded(Dataset):
    """A deterministic decode by index (``delay`` seconds of waiting), then a random flip (numpy's global generator)."""

    def __init__(self, n: int = 32, delay: float = 0.004, fail: bool = False):
        self.n, self.delay, self.fail = n, delay, fail

    def __len__(self):
        return self.n

    def decode(self, index):
        if self.fail:
            raise AssertionError(f"decode({index}) ran: the cache should have answered")
        time.sleep(self.delay)
        return np.arange(index, index + 6, dtype=np.float32)

    def __getitem__(self, index):
        x = self.decode(index)
        if np.random.random() < 0.5:
            x = x[::-1].copy()
        return torch.from_numpy(x), index


class Seeded(Dataset):
    """Everything seeded by (index, epoch): deterministic per key, but the key changes every epoch."""

    def __len__(self):
        return 16

    def __getitem__(self, key):
        index, epoch = key
        rng = np.random.default_rng([index, epoch])
        time.sleep(0.002)
        return torch.tensor(rng.normal(size=4), dtype=torch.float32)


class Unseeded(Dataset):
    """A 'decode' that draws from a fresh unseeded generator: not deterministic."""

    def __len__(self):
        return 16

    def decode(self, index):
        return np.random.default_rng().normal(size=3) + index

    def __getitem__(self, index):
        return torch.tensor(self.decode(index))


class Mover(Dataset):
    """A method whose output is fixed but which draws from torch's global generator: caching it moves later draws."""

    def __len__(self):
        return 16

    def load(self, index):
        torch.rand(1)
        return np.full(3, index, dtype=np.float32)

    def __getitem__(self, index):
        return torch.from_numpy(self.load(index)) + torch.rand(3)


class EpochKeys(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter([(i, self.epoch) for i in range(self.n)])


def batches_of(loader, epochs=2, seed=0):
    out = []
    for epoch in range(epochs):
        torch.manual_seed(seed + epoch)
        np.random.seed(seed + epoch)
        out += [digest(b) for b in loader]
    return out


# -- the store ------------------------------------------------------------------------------------
def _put_in_child(store, key, value):
    store.put(key, value)


@pytest.mark.slow
def test_the_store_is_shared_with_another_process_and_bounded():
    store = SampleStore(1 << 16)
    try:
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_put_in_child, args=(store, ("decode", 3), np.arange(4.0)))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        found, value = store.get(("decode", np.int64(3)))  # a numpy index is the same key
        assert found and np.array_equal(value, np.arange(4.0))
        assert not store.put(("big", 1), np.zeros(1 << 14))  # 128 KiB: over the 64 KiB bound
        assert store.get(("big", 1)) == (False, None)
        assert 0 < store.bytes < 1 << 16
    finally:
        store.close()
    assert not Path(store.folder).exists()


def test_a_key_that_is_not_plain_data_is_refused():
    assert plain_key([np.int64(2), Path("/a/b")]) == (2, "/a/b")
    with pytest.raises(TypeError, match="plain data"):
        plain_key((1, object()))


# -- what may be cached ---------------------------------------------------------------------------
def test_a_deterministic_method_is_cacheable_and_the_random_item_around_it_is_not():
    ds = Decoded(delay=0)
    keys = list(range(8))
    why, values = check(ds, "decode", keys)
    assert why is None and len(values) == 3
    why, _ = check(ds, "__getitem__", keys)
    assert "random" in why


def test_random_draws_end_what_can_be_cached():
    assert "random" in check(Unseeded(), "decode", list(range(4)))[0]  # another output for the same index
    assert "generator moved" in check(Mover(), "load", list(range(4)))[0]  # same output, but moves torch's


def test_an_item_keyed_by_index_and_epoch_does_not_recur():
    """Whether a call's arguments recur is measured on the sampler's next two epochs, whatever the keys look like."""
    loader = DataLoader(Seeded(), batch_size=4, sampler=EpochKeys(16))
    rate, seen = hit_rate(Seeded(), "__getitem__", loader, Deadline(10))
    assert rate == 0.0 and seen > 16  # the sampler's epoch attribute advanced: every key is new
    assert loader.sampler.epoch == 0  # drawn from a copy: the user's sampler is where it was
    plain = DataLoader(Decoded(n=16), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    state = plain.generator.get_state()
    assert hit_rate(plain.dataset, "decode", plain, Deadline(10))[0] == 1.0
    assert torch.equal(plain.generator.get_state(), state)  # the user's generator did not move


# -- same batches ---------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_the_cached_loader_gives_the_uncached_batches_in_every_epoch(workers):
    ds = Decoded(n=24, delay=0)
    kw = dict(batch_size=4, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(3))
    plain = batches_of(DataLoader(ds, **kw))
    store = SampleStore(1 << 20)
    try:
        cds = cached(ds, "decode", store)
        kw["generator"] = torch.Generator().manual_seed(3)
        assert batches_of(DataLoader(cds, **kw)) == plain
        assert len(store) == 24  # every decode kept, by whichever process computed it
        cds.fail = True  # from now on only the cache may answer
        kw |= {"generator": torch.Generator().manual_seed(3), "num_workers": 0}
        in_main = batches_of(DataLoader(cds, **kw))
        kw["generator"] = torch.Generator().manual_seed(3)
        assert in_main == batches_of(DataLoader(ds, **kw))  # the flips drawn in this process, as uncached
    finally:
        store.close()


def test_whole_items_are_cached_when_the_item_depends_only_on_its_index():
    class Clean(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.arange(3) * i

    store = SampleStore(1 << 20)
    try:
        items = cached(Clean(), "__getitem__", store)
        assert isinstance(items, CachedItems) and len(items) == 10
        assert [digest(items[i]) for i in range(10)] == [digest(Clean()[i]) for i in range(10)]
        assert [digest(items[i]) for i in range(10)] == [digest(Clean()[i]) for i in range(10)]  # read back
        assert len(store) == 10
    finally:
        store.close()


# -- the offer ------------------------------------------------------------------------------------
def test_a_dominant_deterministic_decode_is_offered_with_its_gain():
    loader = DataLoader(Decoded(n=32, delay=0.004), batch_size=8, shuffle=True)
    found = find_cache(loader, lambda b: None, loader_kwargs={"num_workers": 0}, batches=4, budget_s=20,
                       budget_bytes=1 << 20)
    assert found.method == "Decoded.decode" and found.share > 0.5, found
    assert found.recommended, found.reason
    assert found.epoch_speedup > 2 and found.bytes == pytest.approx(32 * 150, rel=0.5)
    assert "`Decoded.decode` is" in found.sentence() and "depends only on the index" in found.sentence()


@pytest.mark.slow
def test_a_caches_gain_is_read_from_up_to_four_interleaved_pairs_of_passes_while_the_budget_lasts():
    """The cached epochs' share of an uncached one is read from the medians of several passes of each."""
    from placer.stream.dataset_cache import CACHE_PAIRS

    loader = DataLoader(Decoded(n=32, delay=0.004), batch_size=8, shuffle=True)
    found = find_cache(loader, lambda b: None, loader_kwargs={"num_workers": 0}, batches=4, budget_s=20,
                       budget_bytes=1 << 20)
    assert found.recommended, found.reason
    assert len(found.uncached_s) == len(found.cached_s) == CACHE_PAIRS == 4


def test_the_first_epoch_with_a_cache_is_priced_at_the_median_of_as_many_fills_as_uncached_passes(monkeypatch):
    """Each round fills a new, empty cache: one filling pass the machine stalled does not price a useful
    cache out of a run of three epochs (one CI run: 0.30 s with the audio script's cache, 0.28 s without)."""
    from placer.stream import dataset_cache
    from placer.stream.dataset_cache import CACHE_PAIRS

    real, fills = dataset_cache._pass, iter([0.37, 0.15, 0.16, 0.14])

    def scripted(make, ds, step, sync, deadline=None):  # real passes (their batches), scripted seconds
        store = getattr(getattr(ds, "decode", None), "store", None)
        filling = store is not None and len(store) == 0
        _, got = real(make, ds, step, sync, deadline)
        return (0.13 if store is None else next(fills) if filling else 0.03), got

    monkeypatch.setattr(dataset_cache, "_pass", scripted)
    loader = DataLoader(Decoded(n=32, delay=0.0005), batch_size=8, shuffle=True)
    found = find_cache(loader, lambda b: None, loader_kwargs={"num_workers": 0}, batches=4, budget_s=20,
                       budget_bytes=1 << 20)
    assert found.recommended, found.reason
    assert found.fills_s == [0.37, 0.15, 0.16, 0.14] and len(found.uncached_s) == CACHE_PAIRS
    assert found.fill_s == pytest.approx(0.155) and found.as_dict()["fills_s"] == found.fills_s
    # four fills read: every round's store was empty when its filling pass began
    assert found.two_epoch_speedup == pytest.approx(2 * 0.13 / (0.155 + 0.03))


@pytest.mark.slow
def test_the_cache_is_measured_again_with_the_settings_recommended_beside_it():
    """The passes the whole run's claim is read from are those of the settings the cache runs with: a
    step that costs more under the recommended settings makes a cached epoch a larger share of an
    uncached one (an audio script's cached epochs: 0.16x at torch's two threads, 0.31x at one)."""
    from placer.stream.dataset_cache import measure_at

    loader = DataLoader(Decoded(n=32, delay=0.004), batch_size=8, shuffle=True)
    found = find_cache(loader, lambda b: None, loader_kwargs={"num_workers": 0}, batches=4, budget_s=20,
                       budget_bytes=1 << 20)
    assert found.recommended, found.reason
    slower = measure_at(found, loader, lambda b: time.sleep(0.02), loader_kwargs={"num_workers": 0}, batches=4,
                        budget_s=20)
    assert slower is not found and slower.method == found.method and slower.batches == found.batches
    hit = lambda a: min(a.cached_s) / min(a.uncached_s)  # noqa: E731
    assert hit(slower) > 1.5 * hit(found)  # the step's 20 ms a batch stays when the decode is cached
    assert "with the recommended settings" in slower.reason
    nothing = replace(found, recommended=False)
    assert measure_at(nothing, loader, None, loader_kwargs={"num_workers": 0}, batches=4, budget_s=5) is nothing


def test_no_cache_is_offered_where_the_item_work_is_random_or_changes_every_epoch():
    loader = DataLoader(Seeded(), batch_size=4, sampler=EpochKeys(16))
    found = find_cache(loader, None, loader_kwargs={"num_workers": 0}, batches=2, budget_s=10)
    assert found.method is None and not found.recommended and "change between epochs" in found.reason


def test_a_cache_over_the_memory_budget_is_not_offered():
    loader = DataLoader(Decoded(n=32, delay=0.001), batch_size=8)
    found = find_cache(loader, None, loader_kwargs={"num_workers": 0}, batches=2, budget_s=10, budget_bytes=100)
    assert found.method == "Decoded.decode" and not found.recommended and "memory budget" in found.reason


# -- the bundled script where caching decides -------------------------------------------------------
@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    sys.path.insert(0, str(PLAIN))
    try:
        import audio_cache_train
    finally:
        sys.path.remove(str(PLAIN))
    folder = tmp_path_factory.mktemp("clips") / "clips"
    audio_cache_train.write_clips(folder, 64)  # passes of 8 batches: a 0.1 s stall in one is not the gain
    return audio_cache_train, folder


@pytest.mark.slow
def test_the_drop_in_offers_to_cache_the_audio_decode_and_its_loader_gives_the_same_batches(audio):
    mod, folder = audio
    ds = mod.Clips(folder)
    sampler = mod.EpochShuffle(len(ds), 0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    model = mod.make_model()

    def step(batch):
        with torch.no_grad():
            model(batch[0])

    random.seed(0)
    advice = advise_loader(loader, step, batches=8, budget_s=8, epochs=3)
    assert advice.cache is not None and advice.cache.method == "Clips.features", advice.cache
    assert advice.cache.recommended, advice.cache.reason
    assert "`Clips.features` is" in str(advice) and "makes epochs 2+" in str(advice)
    assert advice.as_dict()["cache"]["recommended"] is True
    # the whole run it claims (3 epochs) has the cache in it: filled in the first, read in the other two
    w = advice.whole_run
    assert w["cache"]["hit"] < 1 and w["speedup"] == pytest.approx(
        w["settings_speedup"] * w["settings_recommended_s"] / w["recommended_s"], rel=1e-2)
    assert w["recommended_s"] < w["settings_recommended_s"] and "with the cache (advice.loader())" in str(advice)
    tuned = advice.loader()
    assert isinstance(tuned.dataset, mod.Clips) and tuned.dataset is not ds

    def epochs(loader):
        out = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            out += [digest(b) for b in loader]
        return out

    assert epochs(tuned) == epochs(rebuild_plain(loader))


def rebuild_plain(loader):
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=loader.sampler)


# -- a composed transform: its deterministic prefix ---------------------------------------------------
class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Load:
    """'Reads' the file a name points to: deterministic, slow."""

    def __call__(self, name):
        time.sleep(0.004)
        return np.full(4, float(name.split("-")[1]), dtype=np.float32)


class Scale:
    def __call__(self, x):
        return x * 2


class RandomFlip:
    def __call__(self, x):
        return x[::-1].copy() if torch.rand(1).item() < 0.5 else x


class Files(Dataset):
    """A list of names and a composed transform applied to each (load, scale, then a random flip)."""

    def __init__(self, n=32):
        self.names = [f"file-{i}" for i in range(n)]
        self.transform = Compose([Load(), Scale(), RandomFlip()])

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return torch.from_numpy(self.transform(self.names[i]))


@pytest.mark.slow
def test_the_deterministic_prefix_of_a_composed_transform_is_offered_and_gives_the_same_batches():
    loader = DataLoader(Files(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    found = find_cache(loader, None, loader_kwargs={"num_workers": 0}, batches=4, budget_s=20, budget_bytes=1 << 20)
    assert found.method == "Files.transform[:2]" and found.steps == ["Load", "Scale"], found
    assert found.recommended, found.reason
    assert "first 2 steps" in found.sentence() and "Load, Scale" in found.sentence()
    cached_files = found.apply()

    def epochs(ds):
        torch.manual_seed(5)
        dl = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
        return [digest(b) for _ in range(2) for b in dl]

    assert epochs(cached_files) == epochs(Files())
    assert len(cached_files.transform.store) == 32


class RandomAugment(Dataset):
    """Slow per-sample work that draws from torch's global generator: nothing to cache."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.full((4,), float(i)) + torch.rand(4)


@pytest.mark.slow
def test_the_drop_in_offers_no_cache_where_the_item_work_is_random_and_its_words_say_nothing_of_one():
    advice = advise_loader(DataLoader(RandomAugment(), batch_size=8), lambda b: None, batches=4, budget_s=4)
    assert advice.cache is not None and not advice.cache.recommended
    assert "random" in advice.cache.reason
    assert "cach" not in str(advice).lower()
    assert advice.as_dict()["cache"]["method"] is None


def test_a_call_with_arguments_unlike_the_checked_ones_is_computed_not_kept():
    class Mixed(Decoded):
        def decode(self, index):
            return super().decode(int(np.asarray(index).ravel()[0]))

    store = SampleStore(1 << 20)
    try:
        ds = cached(Mixed(n=4, delay=0), "decode", store)
        assert np.array_equal(ds.decode(np.array([2])), np.arange(2, 8, dtype=np.float32))  # an array: not a key
        assert len(store) == 0
        ds.decode(3)
        assert len(store) == 1
    finally:
        store.close()


def test_one_slow_cached_pass_of_four_does_not_make_a_large_gain_noise():
    # one advising run on a 2-core VM: three cached passes at a fifth of the uncached ones, one as slow
    run = CacheAdvice("Clips.features", uncached_s=[0.48, 0.14, 0.14, 0.13], cached_s=[0.03, 0.03, 0.03, 0.13])
    judge(run)
    assert run.recommended, run.reason
    # two slow cached passes of four, or the only one of two, are not apart from the uncached passes
    for uncached, cached_ in (([0.48, 0.14, 0.14, 0.13], [0.03, 0.13, 0.03, 0.14]), ([0.14, 0.13], [0.03, 0.13])):
        run = CacheAdvice("Clips.features", uncached_s=uncached, cached_s=cached_)
        judge(run)
        assert not run.recommended and "within noise" in run.reason, run.reason
    # a gain of a few percent is not worth a cache however apart the passes are
    run = CacheAdvice("Clips.features", uncached_s=[0.140, 0.141, 0.142], cached_s=[0.133, 0.134, 0.135])
    judge(run)
    assert not run.recommended and "too little" in run.reason
    run = CacheAdvice("Clips.features", uncached_s=[0.14, 0.14], cached_s=[0.15, 0.16])
    judge(run)
    assert not run.recommended and "slower than computing it" in run.reason


def _slow_start(worker_id):
    time.sleep(0.4)


@pytest.mark.slow
def test_with_persistent_workers_the_cached_epochs_are_priced_on_the_workers_that_filled_the_cache():
    """A script whose workers persist starts them once: its later epochs, cached or not, pay no start-up.
    The passes run as its epochs do (each loader twice, on the same workers), so a cached epoch is set
    against an uncached later epoch, not against one that starts the workers; a first pass of each
    starts them and prices the filling epoch. The random flip after the decode draws other numbers in
    the workers' second pass than in their first: the cached passes are checked against the uncached
    pass of the same rank."""
    from placer.stream.dropin import with_cache

    loader = DataLoader(Decoded(n=32, delay=0.02), batch_size=4, worker_init_fn=_slow_start)
    found = find_cache(loader, lambda b: None, batches=3, budget_s=12, budget_bytes=1 << 20,
                       loader_kwargs={"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2})
    assert found.recommended, found.reason
    assert len(found.uncached_first_s) == len(found.uncached_s) >= 1
    # the workers' 0.4 s start in the first passes only
    assert min(found.uncached_first_s) > max(found.uncached_s) + 0.3, found
    assert min(found.fills_s) > max(found.cached_s) + 0.3, found
    costs = {"start_s": 0.6, "per_batch_s": 0.08, "close_s": 0.0, "refill_s": 0.08, "persistent": True}
    run = {"epochs": 3, "batches": 8, "user_s": 3.0, "recommended_s": 2.4, "speedup": 1.25, "user_samples_per_s": 32,
           "recommended_costs": costs}
    cache = with_cache(run, found)["cache"]
    # a cached later epoch: the decode's 0.24 s gone, not diluted by a start-up it does not pay
    assert cache["hit"] < 0.4, found
    assert cache["fill"] < 1.5, found  # filling set against an uncached pass that also started the workers


@pytest.mark.slow
def test_without_persistent_workers_every_pass_starts_its_workers():
    loader = DataLoader(Decoded(n=32, delay=0.004), batch_size=4)
    found = find_cache(loader, lambda b: None, batches=3, budget_s=8, budget_bytes=1 << 20,
                       loader_kwargs={"num_workers": 1, "persistent_workers": False})
    assert found.uncached_s and found.uncached_first_s == [] and found.first_uncached_s == pytest.approx(
        float(np.median(found.uncached_s)))
