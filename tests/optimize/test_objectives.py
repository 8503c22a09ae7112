"""Objectives as objects: the built-in three's wording, the registry, and a new objective
added from this file alone, planned with exactly as the built-in ones are."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
from typer.testing import CliRunner

from placer.cli import app
from placer.errors import PlacerError
from placer.optimize import CostTable, Plan, plan
from placer.optimize.exact import branch_and_bound
from placer.optimize.explain import fmt_s
from placer.optimize.heuristic import heuristic
from placer.optimize.objectives import (
    Objective,
    UnknownObjectiveError,
    get_objective,
    known,
    names,
    register,
    unregister,
)
from placer.optimize.problem import Problem
from tests.synthetic import random_table

TABLE = {
    "devices": {"cpu": {"kind": "cpu", "workers": 2, "price_per_hour": 0.2},
                "gpu": {"kind": "gpu", "price_per_hour": 2.5}},
    "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10},
             "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10}},
    "stages": [
        {"name": "load", "kind": "cleaning", "input_bytes": 6.4e8, "output_bytes": 6.4e8,
         "seconds": {"cpu": 0.05}},
        {"name": "clean", "kind": "cleaning", "inputs": ["load"], "output_bytes": 6.4e8,
         "seconds": {"cpu": 0.4, "gpu": 0.002}},
        {"name": "embed", "kind": "inference", "inputs": ["clean"], "output_bytes": 1e6,
         "seconds": {"gpu": 0.3}},
        {"name": "train", "kind": "training", "inputs": ["embed"], "output_bytes": 1e6,
         "seconds": {"cpu": 4.0, "gpu": 0.1}},
    ],
}


def on_accelerator(pb: Problem, d: int) -> bool:
    return pb.kinds[d] != "cpu"


class GpuSeconds(Objective):
    """Seconds of stage work on accelerators, whichever they are."""

    name, what, unit = "gpu_seconds", "accelerator time", "s on accelerators"

    def evaluate(self, pb, place, deadline_s=None):
        return sum(pb.time[v][d] for v, d in enumerate(place) if on_accelerator(pb, d))

    def bound(self, partial):
        pb, k = partial.pb, partial.placed
        done = self.evaluate(pb, partial.place[:k])
        rest = sum(min(0.0 if not on_accelerator(pb, d) else pb.time[v][d] for d in pb.allowed[v])
                   for v in range(k, pb.n))
        return done + rest


@pytest.fixture
def gpu_seconds():
    objective = register(GpuSeconds())
    yield objective
    unregister(objective.name)


def brute_force(pb: Problem) -> float:
    """The least accelerator seconds over every placement, computed on its own."""
    return min(
        sum(pb.time[v][d] for v, d in enumerate(p) if pb.kinds[d] != "cpu")
        for p in itertools.product(*pb.allowed)
    )


@pytest.mark.parametrize("method", ["exact", "heuristic"])
def test_a_registered_objective_plans_optimally(gpu_seconds, method):
    rng = random.Random(3)
    for k in range(12):
        table = random_table(rng, rng.randint(2, 6), accelerators=rng.choice([1, 2]), chain=k % 3 == 0)
        pb = Problem(table)
        p = plan(table, objective="gpu_seconds", method=method)
        best = brute_force(pb)
        assert p.objective == "gpu_seconds" and p.method == method
        assert math.isclose(p.objective_value, best, rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(gpu_seconds.evaluate(pb, pb.encode(p.placement)), best,
                            rel_tol=1e-12, abs_tol=1e-15)
        if method == "exact":  # the chain DP minimises makespan, so not used for this objective
            assert p.algorithm == "branch and bound"
            value, place = branch_and_bound(pb, "gpu_seconds")  # its bound alone, no incumbent
        else:
            (excess, value), place = heuristic(pb, "gpu_seconds")
            assert excess == 0.0
        assert math.isclose(value, best, rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(gpu_seconds.evaluate(pb, place), best, rel_tol=1e-12, abs_tol=1e-15)


def test_a_registered_objective_changes_the_plan_and_is_recorded_by_name(gpu_seconds):
    table = CostTable.model_validate(TABLE)
    fast = plan(table)
    frugal = plan(table, objective="gpu_seconds")
    assert fast.placement == {"load": "cpu", "clean": "gpu", "embed": "gpu", "train": "gpu"}
    assert frugal.placement == {"load": "cpu", "clean": "cpu", "embed": "gpu", "train": "cpu"}
    assert frugal.objective_value == pytest.approx(0.3)
    again = Plan.model_validate_json(frugal.to_json())
    assert again.objective == "gpu_seconds" and json.loads(frugal.to_json())["objective"] == "gpu_seconds"
    assert gpu_seconds.summary(frugal) == "accelerator time: 0.3 s on accelerators"


def test_a_registered_objective_is_offered_by_the_command_line(gpu_seconds, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TABLE))
    r = CliRunner().invoke(app, ["plan", "--costs", str(path), "--objective", "gpu_seconds"])
    assert r.exit_code == 0, r.output
    assert "gpu_seconds plan" in r.output and "accelerator time: 0.3 s on accelerators" in r.output
    assert known() == "makespan, throughput, cost or gpu_seconds"


def test_unknown_objective_names_the_known_ones(tmp_path):
    with pytest.raises(UnknownObjectiveError) as info:
        get_objective("speed")
    assert isinstance(info.value, PlacerError) and isinstance(info.value, ValueError)
    assert str(info.value) == "unknown objective 'speed'; use one of makespan, throughput, cost"
    with pytest.raises(ValueError, match="unknown objective 'speed'; use one of makespan"):
        plan(CostTable.model_validate(TABLE), objective="speed")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TABLE))
    r = CliRunner().invoke(app, ["plan", "--costs", str(path), "--objective", "gpu_seconds"])
    assert r.exit_code == 2  # a usage error
    assert "unknown --objective 'gpu_seconds'; use makespan, throughput or cost" in r.stderr


def test_a_name_is_registered_once(gpu_seconds):
    with pytest.raises(ValueError, match="'gpu_seconds' is already registered"):
        register(GpuSeconds())
    assert register(gpu_seconds, replace=True) is gpu_seconds
    with pytest.raises(UnknownObjectiveError):
        unregister("speed")


def test_the_built_in_objectives_wording():
    makespan, throughput, cost = (get_objective(n) for n in ("makespan", "throughput", "cost"))
    assert names()[:3] == ("makespan", "throughput", "cost")
    assert [o.unit for o in (makespan, throughput, cost)] == ["s per run", "s per batch", "$ per run"]
    assert [o.what for o in (makespan, throughput, cost)] == ["run", "time per batch", "cost per run"]
    assert makespan.format(1.234) == "1.23 s per run"
    assert throughput.format(0.25) == "250 ms per batch"
    assert cost.format(0.01234) == "$0.0123 per run"
    assert makespan.worse_by(0.012) == "12 ms longer"
    assert cost.worse_by(0.5) == "$0.5 higher"
    assert makespan.chain_dp and not throughput.chain_dp and not cost.chain_dp
    assert not throughput.critical_first and makespan.critical_first


def test_the_built_in_objectives_summaries_and_reasons():
    table = CostTable.model_validate(TABLE)
    by_time = plan(table)
    assert get_objective("makespan").summary(by_time) is None
    per_batch = plan(table, objective="throughput")
    assert get_objective("throughput").summary(per_batch) == (
        f"time per batch (busiest resource): {fmt_s(per_batch.predicted_period_s)}")
    cheap = plan(table, objective="cost", deadline_s=10.0)
    assert get_objective("cost").summary(cheap) == f"cost per run: ${cheap.predicted_cost:.4g}"
    assert cheap.placement["train"] == "gpu"
    assert cheap.stages[3].reason == "cheaper on GPU: $6.94e-05 per run against $0.000111 on CPU"
