"""A cache is found from first principles whatever the Dataset's shape, and never changes a batch.

Each shape as users write it: a sampler handing ``(epoch, index)`` or ``(index, epoch)`` keys
(each sample's random crop seeded by both), a loader of whole chunks (``batch_size=None``), a
``Subset`` split of a dataset with a transforms chain that decodes first and flips at random
last, a ``ConcatDataset`` of shards (of one class, or of two), nested with splits either way,
and a dataset that fetches a batch at a time with ``__getitems__``. In each, a deterministic decode is slow (it waits, as a read from storage does) and the
random part comes after it; the cached loader's batches must equal the uncached loader's over
several reshuffled epochs.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset, Sampler, Subset, random_split

from placer.stream.dataset_cache import digest, find_cache, hit_rate
from placer.timing import Deadline

DELAY = 0.004


class EpochSampler(Sampler):
    """Shuffles the indices per epoch and hands ``(epoch, index)`` keys (or ``(index, epoch)``), with ``set_epoch``."""

    def __init__(self, n, epoch_first=True, seed=0):
        self.n, self.epoch_first, self.seed, self.epoch = n, epoch_first, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        return iter([(self.epoch, int(i)) if self.epoch_first else (int(i), self.epoch) for i in order])


class Crops(Dataset):
    """Decode by index (slow, deterministic), then a random crop seeded by the whole key."""

    def __init__(self, n=32, epoch_first=True):
        self.n, self.epoch_first = n, epoch_first

    def __len__(self):
        return self.n

    def decode(self, index):
        time.sleep(DELAY)
        return np.arange(index, index + 16, dtype=np.float32).reshape(4, 4)

    def __getitem__(self, key):
        epoch, index = key if self.epoch_first else key[::-1]
        img = self.decode(index)
        rng = np.random.default_rng([epoch, index])
        r, c = rng.integers(0, 2, size=2)
        return torch.from_numpy(img[r:r + 3, c:c + 3].copy())


class Parts(Dataset):
    """Each item a whole chunk: a part 'file' parsed and cleaned (slow, deterministic), then its rows shuffled."""

    def __len__(self):
        return 12

    def load_part(self, i):
        time.sleep(DELAY * 4)
        rows = np.arange(i * 10, i * 10 + 10, dtype=np.float32)
        return np.stack([rows, rows * 2], axis=1)

    def __getitem__(self, i):
        part = self.load_part(i)
        return torch.from_numpy(part[np.random.permutation(len(part))])


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Decode:
    def __call__(self, path):
        time.sleep(DELAY)
        k = int(path.split("_")[1].split(".")[0])
        return np.full((3, 3), k, dtype=np.float32) + np.arange(9, dtype=np.float32).reshape(3, 3)


class RandomFlip:
    def __call__(self, x):
        return x[:, ::-1].copy() if torch.rand(1).item() < 0.5 else x


class Files(Dataset):
    def __init__(self, n=40):
        self.paths = [f"img_{i}.png" for i in range(n)]
        self.transform = Compose([Decode(), RandomFlip()])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.from_numpy(self.transform(self.paths[i]))


def epochs_of(loader, epochs=3, seed=0):
    """Every batch's digest over ``epochs`` epochs, each from the same global seeds and epoch number."""
    out = []
    for e in range(epochs):
        torch.manual_seed(seed + e)
        np.random.seed(seed + e)
        for obj in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(e)
        out += [digest(b) for b in loader]
    return out


def offered(loader):
    found = find_cache(loader, None, loader_kwargs={"num_workers": 0}, batches=3, budget_s=20, budget_bytes=1 << 22)
    assert found.recommended, found.reason
    return found


@pytest.mark.parametrize("epoch_first", [True, False], ids=["(epoch, index)", "(index, epoch)"])
def test_a_decode_inside_an_epoch_seeded_key_is_cached_by_its_own_argument(epoch_first):
    def make(ds):
        return DataLoader(ds, batch_size=4, sampler=EpochSampler(32, epoch_first=epoch_first))

    found = offered(make(Crops(epoch_first=epoch_first)))
    assert found.method == "Crops.decode" and found.hit_rate == 1.0
    assert epochs_of(make(found.apply())) == epochs_of(make(Crops(epoch_first=epoch_first)))


@pytest.mark.parametrize("epoch_first", [True, False], ids=["(epoch, index)", "(index, epoch)"])
def test_the_whole_epoch_seeded_item_hits_nothing_and_its_index_decode_every_time(epoch_first):
    loader = DataLoader(Crops(epoch_first=epoch_first), batch_size=4, sampler=EpochSampler(32, epoch_first))
    assert hit_rate(loader.dataset, "__getitem__", loader, Deadline(10))[0] == 0.0
    assert hit_rate(loader.dataset, "decode", loader, Deadline(10))[0] == 1.0
    assert loader.sampler.epoch == 0


@pytest.mark.slow
def test_chunks_with_batch_size_none_are_cached_and_their_batches_unchanged():
    def make(ds):
        return DataLoader(ds, batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(5))

    found = offered(make(Parts()))
    assert found.method == "Parts.load_part" and found.hit_rate == 1.0
    assert epochs_of(make(found.apply())) == epochs_of(make(Parts()))


@pytest.mark.slow
def test_a_subset_split_is_searched_inside_and_the_cache_kept_inside_the_subset():
    train, _ = random_split(Files(), [32, 8], generator=torch.Generator().manual_seed(1))

    def make(ds):
        return DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2))

    found = offered(make(train))
    assert found.method == "Files.transform[:1]" and found.steps == ["Decode"]
    assert found.as_dict()["inside"] == ["Subset"]
    applied = found.apply()
    assert type(applied).__name__ == "Subset" and list(applied.indices) == list(train.indices)
    assert epochs_of(make(applied)) == epochs_of(make(train))


def test_an_iterable_dataset_is_told_why_no_cache_is_offered():
    class Lines(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(8.0))

    found = find_cache(DataLoader(Lines(), batch_size=2), None, loader_kwargs={"num_workers": 0}, batches=2,
                       budget_s=5)
    assert found.method is None and "IterableDataset" in found.reason and "no key" in found.reason


class Shard(Dataset):
    """One folder of a sharded set: ``decode(i)`` reads the shard's own ``i``-th file (slow, deterministic), then
    a random flip from torch's global generator. Two shards' ``decode(3)`` are different files."""

    def __init__(self, first, n):
        self.first, self.n = first, n

    def __len__(self):
        return self.n

    def decode(self, i):
        time.sleep(DELAY)
        return np.arange(9, dtype=np.float32).reshape(3, 3) + self.first + i

    def __getitem__(self, i):
        img = self.decode(i)
        return torch.from_numpy(img[:, ::-1].copy() if torch.rand(1).item() < 0.5 else img)


class Noise(Dataset):
    """Cheap synthetic items beside the shards: random all through, nothing to cache."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(3, 3)


def shuffled(ds, seed=2):
    return DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))


SHAPES = {
    "two shards": lambda: ConcatDataset([Shard(0, 20), Shard(100, 12)]),
    "a shard and another class": lambda: ConcatDataset([Shard(0, 24), Noise()]),
    "a split of a concatenation": lambda: Subset(ConcatDataset([Shard(0, 20), Shard(100, 20)]), list(range(4, 36))),
    "a concatenation of splits": lambda: ConcatDataset([Subset(Shard(0, 40), list(range(0, 40, 2))),
                                                        Subset(Shard(100, 20), list(range(12)))]),
}


@pytest.mark.parametrize("shape", [s if s == "two shards" else pytest.param(s, marks=pytest.mark.slow) for s in SHAPES])
def test_a_concatenation_is_searched_in_its_datasets_and_cached_in_copies_of_them(shape):
    user = SHAPES[shape]()
    found = offered(shuffled(user))
    assert found.method == "Shard.decode" and found.hit_rate == 1.0
    assert "ConcatDataset" in found.as_dict()["inside"]
    shards = [d for d in _leaves(user) if isinstance(d, Shard)]
    assert found.as_dict()["leaves"][0] == len(shards)
    applied = found.apply()
    assert type(applied) is type(user) and len(applied) == len(user)
    cached = [d for d in _leaves(applied) if isinstance(d, Shard)]
    assert all("decode" in vars(d) for d in cached)
    assert not any("decode" in vars(d) for d in shards)  # the user's datasets are not changed
    assert epochs_of(shuffled(applied)) == epochs_of(shuffled(user))


def test_a_concatenation_of_two_classes_caches_the_one_that_holds_the_time_and_says_so():
    found = offered(shuffled(SHAPES["a shard and another class"]()))
    assert found.as_dict()["leaves"] == (1, 2)
    assert "in 1 of the 2 datasets inside the ConcatDataset" in found.sentence()


def _leaves(ds):
    if isinstance(ds, Subset):
        return _leaves(ds.dataset)
    if isinstance(ds, ConcatDataset):
        return [leaf for d in ds.datasets for leaf in _leaves(d)]
    return [ds]


class Rows(Dataset):
    """A dataset that fetches a batch at a time, as Hugging Face datasets do: ``__getitems__`` decodes each
    row (slow, deterministic) and then flips each at random; ``__getitem__`` is never the loader's way in."""

    def __len__(self):
        return 32

    def decode(self, i):
        time.sleep(DELAY)
        return np.arange(6, dtype=np.float32) + 10 * i

    def __getitems__(self, indices):
        rows = [self.decode(i) for i in indices]
        flips = torch.rand(len(rows)) < 0.5
        return [torch.from_numpy(r[::-1].copy() if f else r) for r, f in zip(rows, flips)]

    def __getitem__(self, i):
        raise AssertionError("the loader fetches a batch with __getitems__")


@pytest.mark.parametrize("split", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["whole", "a split"])
def test_a_batched_getitems_is_fetched_as_the_loader_fetches_and_its_decode_cached(split):
    user = Subset(Rows(), list(range(4, 28))) if split else Rows()
    found = offered(shuffled(user))
    assert found.method == "Rows.decode" and found.hit_rate == 1.0
    assert epochs_of(shuffled(found.apply())) == epochs_of(shuffled(user))


class Reads(Rows):
    """``__getitems__`` reads the batch's rows in one call (slow, deterministic), then flips each at random."""

    def read_many(self, indices):
        time.sleep(DELAY * len(indices))
        return [np.arange(6, dtype=np.float32) + 10 * i for i in indices]

    def __getitems__(self, indices):
        rows = self.read_many(indices)
        flips = torch.rand(len(rows)) < 0.5
        return [torch.from_numpy(r[::-1].copy() if f else r) for r, f in zip(rows, flips)]


def test_a_getitems_that_reads_the_whole_batch_at_once_is_told_why_nothing_is_cached():
    found = find_cache(shuffled(Reads()), None, loader_kwargs={"num_workers": 0}, batches=3, budget_s=20,
                       budget_bytes=1 << 22)
    assert found.method is None
    assert "Reads.__getitems__: it takes a whole batch of keys" in found.reason
    assert "Reads.read_many: its arguments change between epochs" in found.reason


@pytest.mark.slow
def test_shards_keep_their_own_outputs_in_the_store_that_worker_processes_share():
    """Two shards' ``decode(3)`` are two files: with two worker processes filling and reading one store, every
    batch of every epoch is the uncached loader's."""
    user = SHAPES["two shards"]()
    found = offered(shuffled(user))

    def workers(ds):
        return DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(4))

    assert epochs_of(workers(found.apply()), epochs=2) == epochs_of(workers(user), epochs=2)


def test_a_concatenation_of_torch_datasets_alone_is_told_whose_code_it_is():
    from torch.utils.data import TensorDataset

    user = ConcatDataset([TensorDataset(torch.arange(8.0)), TensorDataset(torch.arange(4.0))])
    found = find_cache(shuffled(user), None, loader_kwargs={"num_workers": 0}, batches=2, budget_s=5)
    assert found.method is None and found.reason == "TensorDataset.__getitem__ is not the dataset's own code"


def test_the_drop_in_reads_a_getitems_dataset_sample_by_sample_as_the_loader_would():
    """The drop-in's other checks read samples one by one too: through ``__getitems__([key])``, never a
    ``__getitem__`` the loader does not use."""
    from placer.stream.dropin.guards import draws_unseeded
    from placer.stream.dropin.samples import time_samples

    timed = time_samples(shuffled(Rows()), 2, Deadline(10))
    assert timed is not None and timed.samples == 8 and all(c >= DELAY for b in timed.costs for c in b)
    assert draws_unseeded(Rows())  # its flips draw from torch's global generator
