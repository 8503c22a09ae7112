"""advise_loader leaves the user's process as it found it: the model, optimizer, scheduler it trains,
the random generators, torch's threads, the dataset's attributes (placer.stream.keep)."""

from __future__ import annotations

import copy
import functools
import random
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset

from placer.stream import keep
from placer.stream.dropin import advise_loader


class Points(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
        self.reads = 0

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _script(seed: int = 1):
    """What a training script builds: a model (dropout: it draws from torch's generator), Adam, StepLR."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    loader = DataLoader(Points(), batch_size=8, shuffle=True)
    return model, opt, sched, loader


def _train_step(model, opt, sched):
    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
    return step


def _train(model, opt, sched, loader, epochs=2):
    step = _train_step(model, opt, sched)
    for _ in range(epochs):
        for batch in loader:
            step(batch)
    # a draw after training: the script's generators are where they would be
    return torch.rand(3), np.random.rand(2), random.random()


def _same(a, b):
    (ma, oa, sa), (mb, ob, sb) = a, b
    for (na, ta), (nb, tb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert na == nb and torch.equal(ta, tb), na
    sda, sdb = oa.state_dict(), ob.state_dict()
    assert sda["param_groups"] == sdb["param_groups"]
    assert sda["state"].keys() == sdb["state"].keys()
    for k in sda["state"]:
        for name in sda["state"][k]:
            assert torch.equal(torch.as_tensor(sda["state"][k][name]), torch.as_tensor(sdb["state"][k][name])), name
    assert sa.get_last_lr() == sb.get_last_lr() and sa.last_epoch == sb.last_epoch


def _reference():
    model, opt, sched, loader = _script()
    draws = _train(model, opt, sched, loader)
    return (model, opt, sched), draws


@pytest.mark.parametrize("how", ["closure", "state"])
@pytest.mark.slow
def test_training_after_the_advice_ends_where_training_without_it_ends(how):
    ref, ref_draws = _reference()
    model, opt, sched, loader = _script()
    threads = torch.get_num_threads()
    step = _train_step(model, opt, sched)
    kw = {"state": (model, opt, sched)} if how == "state" else {}
    a = advise_loader(loader, step, batches=4, budget_s=3, cache_bytes=0, fresh=False, **kw)
    assert a.runs_in == "this process"
    assert not any("put back" in n for n in a.notes), a.notes
    assert torch.get_num_threads() == threads
    draws = _train(model, opt, sched, loader)
    _same((model, opt, sched), ref)
    assert torch.equal(draws[0], ref_draws[0]) and np.array_equal(draws[1], ref_draws[1]) and draws[2] == ref_draws[2]


class Trainer:
    def __init__(self):
        self.model, self.opt, self.sched, self.loader = _script()

    def step(self, batch):
        _train_step(self.model, self.opt, self.sched)(batch)


@pytest.mark.slow
def test_a_bound_methods_object_is_looked_into():
    ref, _ = _reference()
    t = Trainer()
    advise_loader(t.loader, t.step, batches=4, budget_s=3, cache_bytes=0, fresh=False)
    _train(t.model, t.opt, t.sched, t.loader)
    _same((t.model, t.opt, t.sched), ref)


MODEL = OPT = None


def _global_step(batch):
    x, y = batch
    OPT.zero_grad()
    torch.nn.functional.mse_loss(MODEL(x), y).backward()
    OPT.step()


def test_globals_the_step_names_are_found():
    global MODEL, OPT
    MODEL = torch.nn.Linear(8, 1)
    OPT = torch.optim.SGD(MODEL.parameters(), lr=0.1, momentum=0.9)
    assert keep.reachable(_global_step) == [MODEL, OPT]


def test_requires_grad_grads_modes_and_dataset_attributes_are_put_back():
    model, opt, sched, loader = _script()
    model[0].weight.requires_grad_(False)  # frozen by the script
    model(torch.randn(2, 8)).sum().backward()  # gradients the script left
    model.eval()
    grad = model[3].weight.grad.clone()
    dataset = loader.dataset

    def step(batch):
        model.train()
        model[0].weight.requires_grad_(True)
        dataset.reads += 1
        dataset.extra = 1
        _train_step(model, opt, sched)(batch)

    advise_loader(loader, step, batches=4, budget_s=3, cache_bytes=0, fresh=False, state=[model, opt, sched])
    assert not model[0].weight.requires_grad and model[0].weight.grad is None
    assert torch.equal(model[3].weight.grad, grad) and not model.training and not model[0].training
    assert dataset.reads == 0 and not hasattr(dataset, "extra")


@pytest.mark.slow
def test_what_cannot_be_put_back_is_said():
    loader = DataLoader(Points(), batch_size=8)
    hidden = {"n": 0}

    a = advise_loader(loader, lambda b: hidden.__setitem__("n", hidden["n"] + 1), batches=4, budget_s=2,
                      cache_bytes=0, fresh=False)
    assert any("found no model, optimizer or scheduler" in n for n in a.notes)
    assert "found no model" in a.to_json()
    a = advise_loader(loader, lambda b: None, batches=4, budget_s=2, cache_bytes=0, fresh=False,
                      state={"model": torch.nn.Linear(8, 1), "counter": hidden})
    assert any("state['counter']['n'] (int)" in n for n in a.notes) and "Note: " in str(a)


def test_restoring_twice_starts_each_time_from_the_snapshot():
    """load_state_dict keeps the tensors it is given where they fit: each restore loads a fresh copy, or the
    next run's training would move the snapshot itself."""
    model, opt, sched, loader = _script()
    step = _train_step(model, opt, sched)
    batch = next(iter(loader))
    step(batch)  # Adam has moments and a step count to put back
    model.register_buffer("seen", torch.zeros(1), persistent=False)
    before = ({k: v.clone() for k, v in model.state_dict().items()}, copy.deepcopy(opt.state_dict()))
    kept = keep.Kept(loader, step, (model, opt, sched))
    for _ in range(2):
        for _ in range(3):
            step(batch)
            model.seen += 1
        kept.restore()
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[0][k]), k
        for i, s in opt.state_dict()["state"].items():
            for name, v in s.items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(before[1]["state"][i][name])), name
        assert float(model.seen) == 0 and sched.last_epoch == 1


def test_the_search_follows_partials_objects_and_containers_and_stops_at_a_bound():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    class Holder:
        def __init__(self):
            self.parts = {"net": [model], "opt": opt}

    def train(holder, batch):
        return holder

    assert keep.reachable(functools.partial(train, Holder())) == [model, opt]
    big = [[list(range(100)) for _ in range(100)] for _ in range(100)]
    t = time.perf_counter()
    assert keep.reachable(lambda b: big) == [] and time.perf_counter() - t < 2


def test_a_schedulers_optimizer_is_put_back_with_it():
    model, opt, sched, loader = _script()

    def step(batch):  # reaches the optimizer only through its scheduler
        x, y = batch
        sched.optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        sched.optimizer.step()
        sched.step()

    kept = keep.Kept(loader, step)
    lr = opt.param_groups[0]["lr"]
    for batch in loader:
        step(batch)
    kept.restore()
    assert opt.param_groups[0]["lr"] == lr and not opt.state and sched.last_epoch == 0
