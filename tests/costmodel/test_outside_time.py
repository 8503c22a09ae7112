"""The time a counted call spends outside torch ops (``Work.outside_s``): read per gap between ops.

The host time a described GPU pays includes it, so it must not move with noise (a stall in
one counting run, the counter's own first calls) nor grow with the size of a stage made of
torch ops alone (:func:`placer.costmodel.counts.count_work`).
"""

from __future__ import annotations

import statistics

import pytest

from placer.costmodel import counts
from placer.costmodel.counts import LUMP_S, outside_of_gaps


def _run(values: list[float], ops: tuple[str, ...] = ("a", "b", "c", "d")) -> list[tuple[str, str, float]]:
    names = ["<start>", *ops, "<end>"]
    return [(names[i], names[i + 1], v) for i, v in enumerate(values)]


def test_a_stall_in_one_run_does_not_move_the_reading():
    own = [20e-6, 5e-6, 5e-6, 5e-6, 30e-6]  # the stage's own Python between its ops
    runs = [_run(own) for _ in range(5)]
    runs[1] = _run([20e-6, 5e-6, 4e-3, 5e-6, 30e-6])  # a preemption's cache refill in one gap
    runs[3] = _run([900e-6, 5e-6, 5e-6, 5e-6, 30e-6])  # the counter's first calls
    assert outside_of_gaps(runs) == pytest.approx(sum(own))
    # the median of the runs' sums kept a share of both
    assert statistics.median(sum(g[2] for g in r) for r in runs) == pytest.approx(sum(own))
    runs[4] = _run([20e-6, 5e-6, 5e-6, 2e-3, 30e-6])
    assert outside_of_gaps(runs) == pytest.approx(sum(own))
    assert statistics.median(sum(g[2] for g in r) for r in runs) > 10 * sum(own)


def test_two_runs_keep_the_lesser_reading_of_a_stalled_gap_and_the_mean_of_the_others():
    a = _run([20e-6, 6e-6, 3e-3, 4e-6, 30e-6])
    b = _run([22e-6, 4e-6, 5e-6, 6e-6, 30e-6])
    assert 3e-3 - 5e-6 > LUMP_S
    assert outside_of_gaps([a, b]) == pytest.approx(21e-6 + 5e-6 + 5e-6 + 5e-6 + 30e-6)


def test_one_run_of_a_loop_reads_each_kind_of_gap_by_its_median():
    """A loop repeats the same gaps (the same ops on either side): a stall in one of them is one
    occurrence among many."""
    step = ["mm", "add", "relu", "sum"]
    ops = tuple(step * 50)
    values = [5e-6] * (len(ops) + 1)
    values[77] = 5e-3
    got = outside_of_gaps([_run(values, ops)])
    assert got == pytest.approx(5e-6 * (len(ops) + 1))
    assert outside_of_gaps([]) is None
    assert outside_of_gaps([_run([-9e-6, 1e-6, 1e-6, 1e-6, 1e-6])] * 3) == 0.0


def test_the_gaps_of_a_run_add_up_to_its_time_outside_ops():
    torch = pytest.importorskip("torch")
    x = torch.ones(1000)

    def stage():
        y = x + 1
        s = sum(range(50_000))  # Python between ops: about a millisecond
        return (y * s).sum()

    gaps: list = []
    _, work = counts._count_once(stage, gaps=gaps)
    assert [g[0] for g in gaps][0] == "<start>" and gaps[-1][1] == "<end>"
    assert len(gaps) == work.calls + 1
    assert max(sum(g[2] for g in gaps), 0.0) == pytest.approx(work.outside_s, abs=1e-9)
    python = max(gaps, key=lambda g: g[2])
    assert "add" in python[0] and "mul" in python[1]  # the Python ran between the add and the mul


def test_torch_ops_alone_read_no_time_that_grows_with_the_size():
    """Elementwise ops on 1 K and on 4 M floats (16 MB intermediates freed between ops): the compute
    grows 4,000x, the time outside ops stays a fraction of a millisecond, far below the
    compute, and no more than a small multiple of the small size's (measured as the least of a
    few counts: noise on a shared machine only adds)."""
    torch = pytest.importorskip("torch")

    def outside(n: int) -> tuple[float, float]:
        x = torch.rand(n)

        def stage():
            y = x * 2.0 + 1.0
            z = torch.sqrt(y) - x
            return z.sum()

        stage()
        _, work = counts.count_work(stage, repeats=5, budget_s=2.0)
        reads = [work.outside_s] + [counts.count_work(stage, repeats=5, budget_s=2.0)[1].outside_s for _ in range(2)]
        return min(reads), work.calls

    small, calls_small = outside(1 << 10)
    large, calls_large = outside(1 << 22)
    assert calls_small == calls_large
    assert large < 5e-4
    assert large < 3 * small + 1e-4
