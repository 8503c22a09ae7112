"""Slow samples that hold batches back: in_order=False predicted, measured, and recommended only where allowed."""

import collections
import random
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer.errors import ArgumentTypeError
from placer.stream import advise_loader
from placer.stream.dropin import phases, reorder, samples
from placer.stream.dropin.measuring import rebuild
from placer.stream.dropin.runs import Budget
from placer.timing import Deadline


class Skewed(Dataset):
    """One sample in 20 costs 20x the others (a sleep: a slow read, not CPU the other tests contend for)."""

    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.04 if i % 20 == 0 else 0.002)
        return torch.tensor([float(i)])


def _epoch(loader):
    """One epoch's batches as a multiset of their contents."""
    return collections.Counter(tuple(b.flatten().tolist()) for b in loader)


def test_the_replayed_hand_out_predicts_a_gain_for_a_heavy_tail_only():
    slow = [0.04] + [0.002] * 19
    ordered = reorder.delivery_s(slow * 8, 2, 2, 0.0, in_order=True)
    free = reorder.delivery_s(slow * 8, 2, 2, 0.0, in_order=False)
    assert ordered / free > 1.3  # the slow batch holds the window: the other worker idles in order
    even = [0.003] * 160
    assert reorder.delivery_s(even, 2, 2, 0.0, in_order=True) == pytest.approx(
        reorder.delivery_s(even, 2, 2, 0.0, in_order=False))
    # a step slower than the loader sets the pace either way
    assert reorder.delivery_s(slow * 8, 2, 2, 0.05, in_order=True) == pytest.approx(
        reorder.delivery_s(slow * 8, 2, 2, 0.05, in_order=False), rel=0.05)
    rng = random.Random(0)
    for _ in range(20):  # handing over the first finished never takes longer than waiting in order
        costs = [rng.expovariate(1.0) for _ in range(50)]
        assert reorder.delivery_s(costs, 3, 2, 0.0, in_order=False) <= \
            reorder.delivery_s(costs, 3, 2, 0.0, in_order=True) + 1e-9


def _advising(loader, budget_s):
    """The user's settings measured, as the search leaves them where it recommends them."""
    a = phases.start(loader, lambda b: None, device=None, batches=40, budget_s=budget_s, epochs=1)
    a.budget = Budget(2.0, runs=3)
    a.budget.shape = (1, a.per_epoch)
    phases.measure_yours(a)
    a.best = a.mine
    return a, samples.time_samples(loader, a.batches, Deadline(0.5))


@pytest.mark.slow
def test_in_order_false_is_recommended_where_allowed_with_its_measured_gain():
    loader = DataLoader(Skewed(), batch_size=1, num_workers=2)
    # a budget whose quarter (the check's share) holds its rounds where worker processes fork from a large
    # process (the whole suite's) and start slower than from a small one
    a, timed = _advising(loader, 24)
    assert max(c for b in timed.costs for c in b) > 10 * sorted(c for b in timed.costs for c in b)[timed.samples // 2]
    out = reorder.consider(a, timed, allow=True)
    assert out["predicted_gain"] >= 1.2
    assert out["recommended"] and out["faster"] and out["measured_gain"] >= 1.2, \
        {k: out.get(k) for k in ("rounds", "measured_gain", "predicted_gain", "faster", "why_not")}
    assert a.best.settings.in_order is False and a.best.as_dict()["in_order"] is False
    assert any("varies from run to run" in n and "in_order=False" in n for n in a.notes)
    reordered = rebuild(loader, a.best.settings)
    assert reordered.in_order is False
    assert _epoch(reordered) == _epoch(loader)  # the same batches each epoch, in another order


def test_without_permission_in_order_false_is_not_recommended_and_its_gain_is_said():
    loader = DataLoader(Skewed(), batch_size=1, num_workers=2)
    a, timed = _advising(loader, 8)
    trials = list(a.trials)
    out = reorder.consider(a, timed, allow=False)
    assert not out["recommended"] and a.best is a.mine and a.best.settings.in_order is True
    assert a.trials == trials and "measured_gain" not in out  # no rounds run: they could not change the advice
    assert out["predicted_gain"] >= 1.2
    note = next(n for n in a.notes if "allow_reorder=True" in n)
    assert f"in_order=False would be {out['predicted_gain']:.2f}x (estimated from the timed samples, not measured)" \
        in note and "varies from run to run" in note


@pytest.mark.slow
def test_the_advice_applies_in_order_false_only_when_it_recommends_it():
    loader = DataLoader(Skewed(), batch_size=1, num_workers=2)
    advice = advise_loader(loader, lambda b: None, batches=20, budget_s=6, cache_bytes=0, allow_reorder=True)
    r = advice.reorder
    assert r["allowed"] is True and "recommended" in r
    rec = advice.as_dict()["recommended"]
    if r["recommended"]:  # the rule: measured faster in its rounds; the loader it builds hands over out of order
        assert r["faster"] and rec["in_order"] is False and advice.loader().in_order is False
    else:
        assert "in_order" not in rec and advice.recommended.settings.in_order is True
    assert _epoch(advice.loader()) == _epoch(loader)


def test_allow_reorder_must_be_a_bool():
    with pytest.raises(ArgumentTypeError, match="allow_reorder='yes': allow_reorder must be True or False"):
        advise_loader(DataLoader(Skewed(), batch_size=1), lambda b: None, allow_reorder="yes")
