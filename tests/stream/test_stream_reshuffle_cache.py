"""A cache point on a stream whose source reshuffles every epoch: by sample (a Dataset source) or by a declared key.

Each test runs the stream with the cache and without it and asserts the same outputs:
the step collects what it saw, batch by batch, so a stale or misplaced cached batch shows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer import Pipeline, execute
from placer.errors import PlacerError
from placer.stream import StreamConfig

N, B = 24, 4


class Decoded(Dataset):
    """Item i: a deterministic 'decode' of i (calls counted in this process)."""

    calls = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        Decoded.calls += 1
        return torch.tensor([i, i * i], dtype=torch.float32)


def order(epoch: int) -> list[int]:
    return np.random.default_rng(epoch).permutation(N).tolist()


def dataset_stream(epochs: int = 3, loader: bool = False) -> Pipeline:
    p = Pipeline("reshuffled-dataset")

    @p.source(epochs=epochs, batch_size=B)
    def src(batch_info):
        if loader:
            return DataLoader(Decoded(), batch_size=B, sampler=order(batch_info.epoch))
        return torch.utils.data.Subset(Decoded(), order(batch_info.epoch))

    @p.step()
    def seen(src):
        return src.clone()

    return p


def keyed_stream(epochs: int = 3, calls: list | None = None, key=lambda paths: tuple(paths)) -> Pipeline:
    """The source yields the names of its shards in a new order every epoch; ``decode`` reads a shard."""
    p = Pipeline("reshuffled-shards")
    shards = [[f"shard{s}-{j}" for j in range(3)] for s in range(8)]

    @p.source(epochs=epochs, cache_key=key)
    def names(batch_info):
        for s in np.random.default_rng(batch_info.epoch).permutation(len(shards)):
            yield shards[s]

    @p.stage(kind="preprocessing", device="cpu")
    def decode(names):
        if calls is not None:
            calls.append(names[0])
        return np.array([[float(n.split("-")[1]) + 10 * int(n[5:].split("-")[0])] for n in names])

    @p.stage(kind="preprocessing", device="cpu", random=False)
    def scale(decode, batch_info):
        return decode * 2 + batch_info.epoch  # depends on the epoch: after the cache point, so recomputed

    @p.step()
    def seen(scale):
        return np.asarray(scale).tolist()

    return p


def outputs(run):
    return [np.asarray(x).tolist() for x in run.outputs["seen"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_reshuffling_dataset_source_cached_by_sample_gives_the_uncached_outputs(workers):
    Decoded.calls = 0
    plain = execute(dataset_stream(), "all=cpu", stream=StreamConfig(workers=workers))
    assert Decoded.calls == 3 * N
    Decoded.calls = 0
    run = execute(dataset_stream(), "all=cpu", stream=StreamConfig(workers=workers, cache="src"))
    assert outputs(run) == outputs(plain)
    assert outputs(run)[:N // B] != outputs(run)[N // B: 2 * N // B]  # the epochs were reshuffled
    # each item decoded once, plus one check per later epoch that item i is still the same sample
    assert Decoded.calls == N + 2
    assert any(f"cached {N} samples by index" in n for n in run.streams[0].notes)


def test_a_reshuffling_dataloader_source_with_worker_processes_shares_its_cache():
    plain = execute(dataset_stream(loader=True), "all=cpu", stream=StreamConfig(workers=1))
    run = execute(dataset_stream(loader=True), "all=cpu",
                  stream=StreamConfig(workers=1, stage_workers={"src": 2}, cache="src"))
    assert outputs(run) == outputs(plain)
    assert any(f"cached {N} samples by index" in n for n in run.streams[0].notes)


def test_a_source_that_reshuffles_by_reindexing_is_caught_not_fed_stale_items():
    p = Pipeline("reindexed")

    class Shifted(Dataset):
        def __init__(self, shift):
            self.shift = shift

        def __len__(self):
            return N

        def __getitem__(self, i):
            return torch.tensor([float((i + self.shift) % N)])

    @p.source(epochs=2, batch_size=B)
    def src(batch_info):
        return Shifted(batch_info.epoch)  # item i is another sample each epoch

    @p.step()
    def seen(src):
        return src

    with pytest.raises(Exception, match="differs from the one cached"):
        execute(p, "all=cpu", stream=StreamConfig(workers=0, cache="src"))


@pytest.mark.parametrize("workers", [0, 3])
def test_a_declared_key_caches_a_stage_of_a_reshuffling_source(workers):
    calls: list = []
    plain = execute(keyed_stream(), "all=cpu", stream=StreamConfig(workers=workers))
    run = execute(keyed_stream(calls=calls), "all=cpu", stream=StreamConfig(workers=workers, cache="decode"))
    assert outputs(run) == outputs(plain)
    assert len(calls) <= 8 + 2 * workers  # each shard decoded once, but for batches in flight across an epoch's end
    assert len(calls) < 24
    assert any("cached 8 batches by key" in n for n in run.streams[0].notes)


def test_a_cache_after_a_stage_of_a_reshuffling_source_without_a_key_is_refused_naming_the_fixes():
    with pytest.raises(PlacerError, match="cache_key="):
        execute(keyed_stream(key=None), "all=cpu", stream=StreamConfig(cache="decode"))


def test_a_keyed_cache_refuses_the_source_and_stages_that_take_batch_info():
    with pytest.raises(PlacerError, match="read every epoch"):
        execute(keyed_stream(), "all=cpu", stream=StreamConfig(cache="names"))
    with pytest.raises(PlacerError, match="takes batch_info"):
        execute(keyed_stream(), "all=cpu", stream=StreamConfig(cache="scale"))


def test_a_reshuffling_iterable_source_cannot_be_cached_by_sample():
    p = keyed_stream(key=None)
    with pytest.raises(PlacerError, match="not a Dataset or DataLoader"):
        execute(p, "all=cpu", stream=StreamConfig(workers=0, cache="names"))


@pytest.mark.slow
def test_a_declared_key_cache_after_a_stage_in_worker_processes_gives_the_uncached_outputs():
    plain = execute(keyed_stream(), "all=cpu", stream=StreamConfig(workers=0))
    config = StreamConfig(workers=2, worker_kind={"decode": "process"}, cache="decode")
    run = execute(keyed_stream(), "all=cpu", stream=config)
    assert outputs(run) == outputs(plain)
    assert any("cached 8 batches by key" in n for n in run.streams[0].notes)


@pytest.mark.slow
def test_the_profile_counts_stages_before_a_keyed_cache_point_as_cacheable():
    from placer.stream import profile_stream

    keyed = {s.name: s.cacheable for s in profile_stream(keyed_stream(epochs=2), budget_s=1, batches=4).stages}
    assert keyed == {"names": False, "decode": True, "scale": False, "seen": False}
    plain = {s.name: s.cacheable for s in profile_stream(keyed_stream(epochs=2, key=None), budget_s=1,
                                                         batches=4).stages}
    assert not any(plain.values())  # a reshuffling source without a key: nothing after it replays


class SlowDecoded(Decoded):
    """Decoded, at 4 ms an item: the decode a cache at the source saves in later epochs."""

    def __getitem__(self, i):
        import time

        time.sleep(0.004)
        return super().__getitem__(i)


class Noisy(Decoded):
    """Each read draws new noise: its items cannot be kept by index."""

    def __getitem__(self, i):
        return super().__getitem__(i) + torch.rand(2)


def slow_stream(epochs: int, dataset=SlowDecoded) -> Pipeline:
    p = Pipeline("reshuffled-slow")

    @p.source(epochs=epochs, batch_size=B)
    def src(batch_info):
        return DataLoader(dataset(), batch_size=B, sampler=order(batch_info.epoch))

    @p.step()
    def seen(src):
        return src.clone()

    return p


@pytest.mark.slow
def test_the_planner_caches_a_reshuffling_dataset_source_by_sample_and_the_run_gives_the_uncached_outputs():
    """A slow deterministic decode in a Dataset read in a new order every epoch: the profile measures
    reading a batch's samples back from the by-sample store, the plan over several epochs caches at
    the source (its reasons say how), and that run gives the outputs of the uncached one."""
    from placer.stream import plan_stream, profile_stream

    prof = profile_stream(slow_stream(epochs=4), budget_s=3, batches=6)
    src = prof.stage("src")
    assert src.cached_read_s is not None and src.cached_read_s < src.seconds["cpu"] / 4
    plan = plan_stream(slow_stream(epochs=4), profile=prof)
    assert plan.settings.cache == "src"
    assert any("cache at source src, by sample" in r for r in plan.reasons), plan.reasons
    plain = execute(slow_stream(epochs=4), "all=cpu", stream=StreamConfig(workers=0))
    cached = execute(slow_stream(epochs=4), "all=cpu", stream=plan.settings)
    assert outputs(cached) == outputs(plain)
    # one epoch: nothing to cache; items that differ at every read: never kept by index
    assert profile_stream(slow_stream(epochs=1), budget_s=2, batches=4).stage("src").cached_read_s is not None
    assert plan_stream(slow_stream(epochs=1), budget_s=2).settings.cache is None
    noisy = profile_stream(slow_stream(epochs=4, dataset=Noisy), budget_s=2, batches=4)
    assert noisy.stage("src").cached_read_s is None
    assert any("read twice differs" in n for n in noisy.notes)
    # a sampler that draws (index, epoch), each epoch's augmentation seeded by it: never read back
    p = Pipeline("epoch-keys")

    @p.source(epochs=3, batch_size=B)
    def src(batch_info):
        return DataLoader(EpochKeyed(), batch_size=B, sampler=[(i, batch_info.epoch) for i in order(batch_info.epoch)])

    @p.step()
    def seen(src):
        return src.clone()

    keyed = profile_stream(p, budget_s=2, batches=4)
    assert keyed.stage("src").cached_read_s is None
    assert any("second epoch reads samples its first did not" in n for n in keyed.notes), keyed.notes


class EpochKeyed(Decoded):
    """Items keyed by (index, epoch), as a sampler that seeds each epoch's augmentation draws them."""

    def __getitem__(self, key):
        i, epoch = key
        return super().__getitem__(i) + epoch
