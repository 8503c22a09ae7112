"""The one place a DataLoader is rebuilt with other worker settings keeps every argument a user may set."""

from __future__ import annotations

import inspect
import multiprocessing

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler  # noqa: E402

from placer.executor.stream.source import (KEPT_FIELDS, ORDER_FIELDS, WORKER_FIELDS,  # noqa: E402
                                           loader_arguments, rebuild_loader)


def collate(batch):
    return torch.stack(batch)


def init(worker_id):
    pass


def user_loader(**more):
    data = [torch.tensor([float(i)]) for i in range(10)]
    return DataLoader(data, batch_size=3, sampler=RandomSampler(data), drop_last=True, collate_fn=collate,
                      generator=torch.Generator().manual_seed(7), worker_init_fn=init, timeout=5,
                      multiprocessing_context=multiprocessing.get_context("spawn"), num_workers=1,
                      prefetch_factor=3, **more)


def test_every_argument_of_the_installed_dataloader_is_kept_ordered_or_set():
    """A DataLoader argument that none of the three lists names would be dropped by a rebuild."""
    params = [p for p in inspect.signature(DataLoader.__init__).parameters if p != "self"]
    named = set(ORDER_FIELDS) | set(WORKER_FIELDS) | set(KEPT_FIELDS)
    assert set(params) <= named, f"rebuild_loader drops {sorted(set(params) - named)}"
    assert loader_arguments() == tuple(params)


def test_a_rebuilt_loader_keeps_each_field_the_user_set():
    kw = {"in_order": False} if "in_order" in loader_arguments() else {}
    loader = user_loader(**kw)
    out = rebuild_loader(loader, {"num_workers": 2, "prefetch_factor": 4, "pin_memory": False})
    assert (out.num_workers, out.prefetch_factor) == (2, 4)
    for name in [f for f in KEPT_FIELDS if f in loader_arguments()]:
        assert getattr(out, name) == getattr(loader, name), name
    assert out.sampler is loader.sampler and out.batch_size == 3 and out.drop_last
    bare = rebuild_loader(loader, {"num_workers": 0})  # no worker processes: no start method for them
    assert bare.multiprocessing_context is None and bare.timeout == 0 and bare.worker_init_fn is init and len(list(bare)) == 3


def test_a_batch_sampler_and_a_dataset_may_be_given():
    loader = DataLoader(list(range(8)), batch_sampler=BatchSampler(SequentialSampler(range(8)), 4, False))
    out = rebuild_loader(loader, {"num_workers": 0}, dataset=list(range(10, 18)))
    assert [b.tolist() for b in out] == [[10, 11, 12, 13], [14, 15, 16, 17]]
    fixed = rebuild_loader(loader, {"num_workers": 0}, batch_sampler=[[1, 2]])
    assert [b.tolist() for b in fixed] == [[1, 2]]


def test_thread_workers_read_the_same_batches():
    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(3))
    threads = rebuild_loader(loader, {"num_workers": 2, "prefetch_factor": 2}, threads=True)
    again = rebuild_loader(loader, {"num_workers": 0})
    loader.generator.manual_seed(3)
    a = [b.tolist() for b in threads]
    loader.generator.manual_seed(3)
    assert a == [b.tolist() for b in again]


def test_settings_that_name_in_order_or_threads_per_worker_replace_the_users():
    from placer.data.stream import LoaderSettings
    from placer.executor.stream.worker_init import WorkerThreads

    if "in_order" not in loader_arguments():
        pytest.skip("the installed torch's DataLoader has no in_order")
    loader = user_loader()
    s = LoaderSettings(num_workers=2, prefetch_factor=2, in_order=False, threads_per_worker=1)
    out = rebuild_loader(loader, s.kwargs(), threads_per_worker=s.threads_per_worker)
    assert out.in_order is False and isinstance(out.worker_init_fn, WorkerThreads)
    assert out.worker_init_fn.user is init and out.worker_init_fn.threads == 1  # the user's own still runs
    assert s.as_dict()["in_order"] is False and s.as_dict()["threads_per_worker"] == 1
    kept = rebuild_loader(user_loader(in_order=False), LoaderSettings(num_workers=2, prefetch_factor=2).kwargs())
    assert kept.in_order is False  # settings that leave it as it is keep the user's
    assert "in_order" not in LoaderSettings(num_workers=2).as_dict()  # shown only where set
