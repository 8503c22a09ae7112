"""Tests of the placement optimizer: cost tables, the schedule model, search, explanations.

Exact search is checked against exhaustive enumeration, and the fast simulator
against a step-by-step reference simulator written from docs/schedule.md, on
hypothesis-generated pipelines.
"""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.optimize import CostTable, CostTableError, InfeasibleError, Plan, plan, simulate
from placer.optimize.exact import branch_and_bound, chain_dp, exhaustive
from placer.optimize.heuristic import heuristic
from placer.optimize.objectives import evaluate
from placer.optimize.problem import Problem

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

times = st.floats(1e-4, 2.0, allow_nan=False, allow_infinity=False)
nbytes = st.one_of(st.just(0.0), st.floats(1e3, 2e9, allow_nan=False, allow_infinity=False))


@st.composite
def tables(draw, min_n=1, max_n=7, chain=False, max_acc=2, twins=False, shuffle=True) -> CostTable:
    """A random valid cost table; ``twins`` makes the accelerators identical."""
    n = draw(st.integers(min_n, max_n))
    n_acc = draw(st.integers(1, max_acc))
    kind = draw(st.sampled_from(["gpu", "sim"]))
    accs = ["gpu-sim"] if kind == "sim" else [f"gpu:{k}" for k in range(n_acc)]
    devices = {"cpu": {"kind": "cpu", "workers": draw(st.integers(1, 3)),
                       "price_per_hour": draw(st.floats(0.01, 1.0))}}
    for a in accs:
        devices[a] = {"kind": kind, "price_per_hour": draw(st.floats(0.5, 4.0))}
    if twins:
        for a in accs[1:]:
            devices[a] = devices[accs[0]]
    link = {d: {"latency_s": draw(st.sampled_from([0.0, 1e-5, 1e-3])),
                "bandwidth_Bps": draw(st.floats(1e8, 1e11))} for d in ("h2d", "d2h")}
    stages = []
    for i in range(n):
        if chain:
            inputs = [f"s{i - 1}"] if i else []
        else:
            inputs = sorted(draw(st.sets(st.sampled_from([f"s{j}" for j in range(i)]), max_size=3))
                            if i else set())
        where = draw(st.sampled_from(["both", "both", "both", "cpu", "acc"]))
        seconds = {}
        if where != "acc":
            seconds["cpu"] = draw(times)
        if where != "cpu":
            first = draw(times)
            for a in accs:
                seconds[a] = first if twins else draw(times)
        stages.append({
            "name": f"s{i}",
            "kind": draw(st.sampled_from(["cleaning", "preprocessing", "training", "inference", "other"])),
            "inputs": inputs,
            "input_bytes": draw(nbytes),
            "output_bytes": draw(nbytes),
            "seconds": seconds,
        })
    if shuffle and not chain:
        stages = draw(st.permutations(stages))
    return CostTable.model_validate({"devices": devices, "link": link, "stages": stages})


def reference_makespan(table: CostTable, placement: dict[str, str]) -> float:
    """The schedule model of docs/schedule.md, simulated step by step."""
    pos = {s.name: i for i, s in enumerate(table.stages)}
    g = nx.DiGraph()
    g.add_nodes_from(pos)
    g.add_edges_from((u, s.name) for s in table.stages for u in s.inputs)
    prio = {v: i for i, v in enumerate(nx.lexicographical_topological_sort(g, key=pos.get))}
    stage = {s.name: s for s in table.stages}
    link = table.link

    def loc(dev):
        return "host" if table.devices[dev].kind == "cpu" else dev

    def arrival(end, b, src, dst):
        if src == dst:
            return end
        if src == "host":
            return end + link.h2d.seconds(b)
        if dst == "host":
            return end + link.d2h.seconds(b)
        return end + link.d2h.seconds(b) + link.h2d.seconds(b)

    def ready_time(v):
        s = stage[v]
        here = loc(placement[v])
        t = [0.0 if here == "host" or s.input_bytes == 0 else link.h2d.seconds(s.input_bytes)]
        for u in s.inputs:
            if u not in finish:
                return None
            t.append(arrival(finish[u], stage[u].output_bytes, loc(placement[u]), here))
        return max(t)

    finish: dict[str, float] = {}
    running: dict[str, float] = {}
    now = 0.0
    while len(finish) < len(stage):
        for v, end in list(running.items()):
            if end <= now:
                finish[v] = end
                del running[v]
        for dev, spec in table.devices.items():
            waiting = sorted(
                (v for v in stage if placement[v] == dev and v not in finish and v not in running
                 and (r := ready_time(v)) is not None and r <= now),
                key=prio.get)
            busy = sum(1 for v in running if placement[v] == dev)
            for v in waiting[: spec.workers - busy]:
                running[v] = now + table.seconds(v, dev)
        upcoming = list(running.values()) + [
            r for v in stage if v not in finish and v not in running
            and (r := ready_time(v)) is not None and r > now]
        if upcoming:
            now = min(upcoming)
    return max(arrival(finish[v], stage[v].output_bytes, loc(placement[v]), "host")
               for v in stage if g.out_degree(v) == 0)


def rel_eq(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def hand_table(**overrides) -> dict:
    """A small hand-written table (the example of docs/costs.md), as a dict."""
    doc = {
        "devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu": {"kind": "gpu", "memory_bytes": 8.0e10}},
        "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10},
                 "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10}},
        "size": 4096,
        "stages": [
            {"name": "load", "kind": "cleaning", "input_bytes": 6.4e8, "output_bytes": 6.4e8,
             "seconds": {"cpu": 0.1}},
            {"name": "clean", "kind": "cleaning", "inputs": ["load"], "output_bytes": 6.4e8,
             "seconds": {"cpu": 0.4, "gpu": 0.002}, "peak_bytes": {"gpu": 1.3e9}},
            {"name": "train", "kind": "training", "inputs": ["clean"], "output_bytes": 1e6,
             "seconds": {"cpu": 3.0, "gpu": 0.1}},
        ],
    }
    doc.update(overrides)
    return doc


def unit_link(table: dict) -> dict:
    """Copies take exactly ``bytes / 1e9`` seconds."""
    table["link"] = {d: {"latency_s": 0.0, "bandwidth_Bps": 1e9} for d in ("h2d", "d2h")}
    return table


# -- the cost table ----------------------------------------------------------------------


def _mutate(doc, path, value):
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("stages", 1, "inputs"), ["lod"], ["'clean'", "unknown input 'lod'", "add a stage named"]),
        (("stages", 2, "name"), "clean", ["'clean' appears twice"]),
        (("stages", 0, "inputs"), ["train"], ["stages form a cycle", "load -> clean", "clean -> train", "remove one"]),
        (("stages", 2, "seconds"), {"gpu:3": 0.1}, ["no device can run stage 'train'", "add gpu:3 to devices"]),
        (("stages", 2, "pin"), "gpu:1", ["'train' is pinned to 'gpu:1'", "not among the devices"]),
        (("stages", 2, "seconds"), {"cpu": 1.0, "gpuu": 0.1}, ["'train'", "unknown device 'gpuu'"]),
        (("stages", 2, "seconds"), {"cpu": -1.0}, ["'train'", "give a finite time"]),
        (("stages", 1, "output_bytes"), -5, ["stage 'clean'.output_bytes", "greater than or equal to 0"]),
        (("devices", "gpu", "workers"), 2, ["devices.gpu", "one stage at a time"]),
        (("link",), _DELETE, ["link: missing"]),
        (("devices", "cpu", "kind"), "gpu", ["exactly one device of kind 'cpu'"]),
    ],
)
def test_bad_tables_get_errors_naming_the_stage_or_field_and_the_fix(path, value, expected):
    text = json.dumps(_mutate(hand_table(), path, value))
    with pytest.raises(CostTableError) as info:
        CostTable.from_json(text, source="t.json")
    msg = str(info.value)
    assert msg.startswith("t.json: ")
    for part in expected:
        assert part in msg, msg


def test_gpu_only_stage_over_memory_is_an_error_but_with_a_cpu_version_goes_to_cpu():
    over = _mutate(hand_table(), ("stages", 1, "peak_bytes"), {"gpu": 9e10})
    p = plan(CostTable.model_validate(over))
    assert p.placement["clean"] == "cpu"
    assert "needs 9" in p.stages[1].reason and "which has 80.0 GB" in p.stages[1].reason
    only_gpu = _mutate(over, ("stages", 1, "seconds"), {"gpu": 0.002})
    with pytest.raises(CostTableError, match="no device can run stage 'clean'.*needs"):
        CostTable.from_json(json.dumps(only_gpu))
    pinned = _mutate(over, ("stages", 1, "pin"), "gpu")
    with pytest.raises(CostTableError, match="'clean' is pinned to gpu but needs"):
        CostTable.from_json(json.dumps(pinned))


def test_memory_counts_resident_inputs_and_defaults_peak_to_the_output():
    doc = hand_table()
    doc["devices"]["gpu"]["memory_bytes"] = 1.5e9
    t = CostTable.model_validate(doc)
    assert t.memory_need("train", "gpu") == 1e6 + 6.4e8  # output as peak, plus its input
    assert t.memory_need("clean", "gpu") == 1.3e9 + 6.4e8  # > 1.5e9: cannot run there
    assert t.allowed("clean") == ["cpu"] and t.allowed("train") == ["cpu", "gpu"]


def test_save_and_load_round_trip(tmp_path):
    t = CostTable.model_validate(hand_table())
    path = tmp_path / "t.json"
    t.save(path)
    assert CostTable.load(path) == t
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CostTableError, match="bad.json: not valid JSON"):
        CostTable.load(tmp_path / "bad.json")


# -- the schedule model ------------------------------------------------------------------


def test_chain_makespan_is_stage_times_plus_boundary_copies():
    t = CostTable.model_validate(unit_link(hand_table()))
    s = simulate(t, {"load": "cpu", "clean": "gpu", "train": "cpu"})
    # ext input on host; load 0.1, copy 0.64, clean 0.002, copy back 0.64, train 3.0
    assert rel_eq(s.makespan_s, 0.1 + 0.64 + 0.002 + 0.64 + 3.0)
    assert [(x.src, x.dst) for x in s.transfers] == [("host", "gpu"), ("gpu", "host")]
    s = simulate(t, {"load": "cpu", "clean": "gpu", "train": "gpu"})
    assert rel_eq(s.makespan_s, 0.1 + 0.64 + 0.002 + 0.1 + 1e6 / 1e9)  # sink output comes home


def _fan(workers: int, dev: str = "cpu") -> CostTable:
    """src -> a, b, c -> (sinks); a, b, c take 1 s each."""
    stages = [{"name": "src", "output_bytes": 1e9, "seconds": {"cpu": 1.0, "gpu": 1.0}}]
    stages += [{"name": n, "inputs": ["src"], "output_bytes": 0.0, "seconds": {"cpu": 1.0, "gpu": 1.0}}
               for n in "abc"]
    doc = unit_link({"devices": {"cpu": {"kind": "cpu", "workers": workers}, "gpu": {"kind": "gpu"}},
                     "stages": stages})
    return CostTable.model_validate(doc)


def test_cpu_runs_workers_stages_at_once_and_a_gpu_one():
    place = {"src": "cpu", "a": "cpu", "b": "cpu", "c": "cpu"}
    assert simulate(_fan(1), place).makespan_s == 4.0
    assert simulate(_fan(2), place).makespan_s == 3.0
    assert simulate(_fan(3), place).makespan_s == 2.0
    gpu = simulate(_fan(3), {"src": "gpu", "a": "gpu", "b": "gpu", "c": "gpu"})
    assert rel_eq(gpu.makespan_s, 4.0)  # one at a time; empty outputs come home in 0 s
    starts = {e.name: e.start_s for e in gpu.stages}
    assert starts["a"] < starts["b"] < starts["c"]  # dispatch priority: table order


def test_one_copy_per_destination_and_gpu_to_gpu_goes_through_the_host():
    doc = _fan(3).model_dump()
    doc["devices"]["gpu:1"] = {"kind": "gpu"}
    for s in doc["stages"]:
        s["seconds"]["gpu:1"] = 1.0
    t = CostTable.model_validate(doc)
    s = simulate(t, {"src": "gpu", "a": "gpu:1", "b": "gpu:1", "c": "cpu"})
    copies = [(x.data, x.src, x.dst, x.seconds) for x in s.transfers]
    assert ("src", "gpu", "gpu:1", 2.0) in copies and ("src", "gpu", "host", 1.0) in copies
    assert len([c for c in copies if c[0] == "src"]) == 2
    assert rel_eq(s.makespan_s, 1.0 + 2.0 + 2.0)  # a and b share gpu:1


def test_external_input_copies_start_at_zero_and_overlap_earlier_work():
    doc = unit_link(hand_table())
    doc["stages"][2]["input_bytes"] = 2e9  # 2 s to copy to the GPU, from t=0
    t = CostTable.model_validate(doc)
    s = simulate(t, {"load": "cpu", "clean": "cpu", "train": "gpu"})
    ext = [x for x in s.transfers if x.external]
    assert [(x.data, x.start_s, x.end_s) for x in ext] == [("train", 0.0, 2.0)]
    train = next(e for e in s.stages if e.name == "train")
    assert train.start_s == 2.0  # clean's output arrives at 0.5 + 0.64, the external at 2.0


def test_simulate_rejects_impossible_placements_naming_the_stage():
    t = CostTable.model_validate(hand_table())
    with pytest.raises(InfeasibleError, match="'load' cannot run on gpu.*place it on cpu"):
        simulate(t, {"load": "gpu", "clean": "gpu", "train": "gpu"})
    with pytest.raises(InfeasibleError, match="'train' has no device"):
        simulate(t, {"load": "cpu", "clean": "gpu"})


@FAST
@given(tables(max_n=7), st.data())
def test_fast_simulator_matches_the_reference(table, data):
    pb = Problem(table, pins=False)
    place = {n: pb.devices[data.draw(st.sampled_from(pb.allowed[i]))] for i, n in enumerate(pb.names)}
    assert rel_eq(simulate(table, place).makespan_s, reference_makespan(table, place))


@FAST
@given(tables(min_n=2, max_n=9), st.data())
def test_a_timeline_resimulates_moves_to_the_same_makespan_bit_for_bit(table, data):
    """Moves near a followed placement, resumed from a saved state, equal a full simulation."""
    from placer.optimize.simulate import Timeline, following, makespan

    pb = Problem(table, pins=False)
    base = [data.draw(st.sampled_from(al)) for al in pb.allowed]
    line = Timeline(pb, base, saves=data.draw(st.sampled_from([1, 3, pb.n])))
    view = following(pb, base)
    assert line.makespan(base) == makespan(pb, base) == makespan(view, base)
    for _ in range(6):
        place = base[:]
        for v in data.draw(st.sets(st.integers(0, pb.n - 1), min_size=1, max_size=3)):
            place[v] = data.draw(st.sampled_from(pb.allowed[v]))
        assert line.makespan(place) == makespan(pb, place) == makespan(view, place)
    assert view.timeline.place == base and pb.timeline is None  # the table's problem is untouched
    runs: list = []
    makespan(pb, base, runs)
    assert line.record() == runs


def test_a_timeline_re_times_inputs_that_arrived_before_its_saved_state():
    """``w`` reads ``a`` (done at 1 s, 8 GB) and ``b`` (done at 3 s): moved to the GPU after
    ``a`` is done, it still waits for ``a``'s 8 s copy."""
    from placer.optimize.simulate import Timeline, makespan

    table = CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu": {"kind": "gpu"}},
        "link": {"h2d": {"latency_s": 0.0, "bandwidth_Bps": 1e9}, "d2h": {"latency_s": 0.0, "bandwidth_Bps": 1e9}},
        "stages": [{"name": "a", "output_bytes": 8e9, "seconds": {"cpu": 1.0}},
                   {"name": "b", "seconds": {"cpu": 3.0}},
                   {"name": "w", "inputs": ["a", "b"], "seconds": {"cpu": 1.0, "gpu": 1.0}}]})
    pb = Problem(table)
    cpu, gpu = pb.dev_index["cpu"], pb.dev_index["gpu"]
    line = Timeline(pb, [cpu, cpu, cpu], saves=pb.n)
    assert line.makespan([cpu, cpu, cpu]) == 4.0
    assert line.makespan([cpu, cpu, gpu]) == makespan(pb, [cpu, cpu, gpu]) == 10.0  # 1 + 8 + 1
    assert line.saved[-1][0] >= 2  # there is a state saved after ``a`` completed


def test_a_timeline_resumes_late_moves_from_a_saved_state():
    """On a long chain a move of the last stage replays only the last rounds (counted here)."""
    import importlib
    import random

    from tests.synthetic import random_table

    sim = importlib.import_module("placer.optimize.simulate")  # the package's name is the function

    pb = Problem(random_table(random.Random(5), 200, chain=True))
    base = [al[0] for al in pb.allowed]
    line = sim.Timeline(pb, base, saves=20)
    line.makespan(base)  # simulates the followed placement once
    rounds = []
    real = sim._simulate

    def counting(pb_, place, loc, record=None, state=None, round0=0, **kw):
        rounds.append(round0)
        return real(pb_, place, loc, record, state, round0, **kw)

    sim._simulate = counting
    try:
        last = [v for v in range(pb.n) if len(pb.allowed[v]) > 1][-1]
        place = base[:]
        place[last] = pb.allowed[last][1]
        assert line.makespan(place) == real(pb, place, [pb.loc[d] for d in place])
    finally:
        sim._simulate = real
    assert rounds and rounds[0] >= line.every * 10  # resumed past the first half of the saves


def test_the_timeline_changes_no_plan(monkeypatch):
    """The same search with and without resuming moves gives the same plan (a counting clock
    stands in for the time budget, so both searches make the same moves)."""
    import random

    import placer.optimize.heuristic as heuristic_module
    from tests.synthetic import random_table

    class Clock:
        t = 0.0

        def perf_counter(self):
            self.t += 1e-3
            return self.t

    table = random_table(random.Random(11), 120, accelerators=2, max_inputs=2)
    plans = []
    for first in (heuristic_module.TIMELINE_MIN, 10**9):
        monkeypatch.setattr(heuristic_module, "time", Clock())
        monkeypatch.setattr(heuristic_module, "TIMELINE_MIN", first)
        doc = json.loads(plan(table, method="heuristic").to_json())
        doc.pop("planning_s")
        plans.append(doc)
    assert plans[0] == plans[1]


# -- search ------------------------------------------------------------------------------


def chain_formula(pb: Problem, place: list[int]) -> float:
    """A chain's makespan: times plus boundary copies, external inputs copied from t=0."""
    t = 0.0
    for v, d in enumerate(place):
        ext = pb.ext_h2d[v] if pb.loc[d] else 0.0
        arrive = t + (pb.tr(v - 1, pb.loc[place[v - 1]], pb.loc[d]) if v else 0.0)
        t = max(arrive, ext) + pb.time[v][d]
    return t + (pb.d2h[pb.n - 1] if pb.loc[place[-1]] else 0.0)


@FAST
@given(tables(min_n=2, max_n=9, chain=True))
def test_chain_dp_is_the_optimum_and_plan_uses_it(table):
    pb = Problem(table)
    value, place = chain_dp(pb)
    best, _ = exhaustive(pb)
    assert rel_eq(value, best)
    assert rel_eq(chain_formula(pb, place), value)
    p = plan(table, method="exact")
    assert p.algorithm.startswith("dynamic programming")
    assert rel_eq(p.predicted_makespan_s, best)
    assert rel_eq(simulate(table, p.placement).makespan_s, best)


@FAST
@given(tables(max_n=7), st.sampled_from(["makespan", "throughput", "cost"]), st.floats(1.0, 3.0))
def test_exact_plan_equals_exhaustive_search(table, objective, slack):
    pb = Problem(table)
    deadline = exhaustive(pb, "makespan")[0] * slack if objective == "cost" else None
    best, _ = exhaustive(pb, objective, deadline_s=deadline)
    p = plan(table, objective=objective, method="exact", deadline_s=deadline)
    assert p.method == "exact"
    assert rel_eq(p.objective_value, best)
    assert rel_eq(evaluate(pb, pb.encode(p.placement), objective, deadline), best)


@settings(max_examples=15, deadline=None)
@given(tables(min_n=5, max_n=8, max_acc=3, twins=True))
def test_branch_and_bound_with_identical_gpus_equals_exhaustive(table):
    pb = Problem(table)
    assert rel_eq(branch_and_bound(pb)[0], exhaustive(pb)[0])


@FAST
@given(tables(max_n=9), st.data())
def test_pins_are_respected_by_every_method(table, data):
    name = data.draw(st.sampled_from([s.name for s in table.stages]))
    options = table.allowed(name)
    dev = data.draw(st.sampled_from(options))
    doc = table.model_dump()
    next(s for s in doc["stages"] if s["name"] == name)["pin"] = dev
    pinned = CostTable.model_validate(doc)
    for method in ("exact", "heuristic"):
        p = plan(pinned, method=method)
        assert p.placement[name] == dev
        assert next(s for s in p.stages if s.name == name).reason.startswith("pinned to")
    pb = Problem(pinned)
    assert rel_eq(plan(pinned, method="exact").objective_value, exhaustive(pb)[0])


@FAST
@given(tables(min_n=3, max_n=9))
def test_heuristic_plans_are_feasible_and_predicted_consistently(table):
    p = plan(table, method="heuristic")
    assert p.method == "heuristic"
    for s in p.stages:
        assert p.placement[s.name] in table.allowed(s.name)
    assert rel_eq(simulate(table, p.placement).makespan_s, p.predicted_makespan_s)
    assert p.predicted_makespan_s >= plan(table, method="exact").predicted_makespan_s * (1 - 1e-9)


def test_heuristic_finds_the_optimum_on_a_random_sample():
    import random

    from tests.synthetic import random_table

    rng = random.Random(7)
    gaps = []
    for _ in range(15):
        pb = Problem(random_table(rng, rng.randint(6, 10)))
        (_, value), _ = heuristic(pb)
        gaps.append(value / exhaustive(pb)[0] - 1)
    assert max(gaps) <= 0.05 and sum(gaps) / len(gaps) <= 0.01


def test_cost_objective_meets_the_deadline_or_says_it_cannot():
    t = CostTable.model_validate(hand_table())
    t.devices["cpu"].price_per_hour = 0.1
    t.devices["gpu"].price_per_hour = 4.0
    fastest = plan(t).predicted_makespan_s
    loose = plan(t, objective="cost", deadline_s=100.0)
    tight = plan(t, objective="cost", deadline_s=fastest * 1.01)
    assert loose.predicted_cost < tight.predicted_cost
    assert tight.predicted_makespan_s <= fastest * 1.01 < loose.predicted_makespan_s
    with pytest.raises(InfeasibleError, match="no placement meets the deadline.*fastest takes"):
        plan(t, objective="cost", deadline_s=fastest / 2)


def test_throughput_balances_resources_that_makespan_would_not():
    # two independent 1 s stages, each 0.6 s on the GPU: latency wants both on the GPU
    # only if they cannot overlap; the stream wants the busiest resource minimal
    stages = [{"name": n, "output_bytes": 0.0, "seconds": {"cpu": 1.0, "gpu": 0.6}} for n in "ab"]
    t = CostTable.model_validate(unit_link(
        {"devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}}, "stages": stages}))
    p = plan(t, objective="throughput")
    assert sorted(p.placement.values()) == ["cpu", "gpu"]
    assert rel_eq(p.objective_value, 1.0) and rel_eq(p.predicted_period_s, 1.0)


# -- the plan ----------------------------------------------------------------------------


def test_plan_json_round_trip_and_required_fields():
    p = plan(CostTable.model_validate(hand_table()))
    again = Plan.model_validate_json(p.to_json())
    assert again == p
    doc = json.loads(p.to_json())
    for key in ("objective", "method", "predicted_makespan_s", "stages", "baselines", "planning_s",
                "placement", "schedule", "size"):
        assert key in doc
    assert set(doc["baselines"]) == {"all_cpu", "all_gpu", "rule_of_thumb"}
    assert doc["baselines"]["all_gpu"] is None  # load has no GPU time
    assert set(doc["stages"][1]) >= {"name", "device", "predicted_s", "reason", "transfer_s",
                                     "crossover_size", "kind"}


def test_baselines_are_the_simulated_placements():
    t = CostTable.model_validate(unit_link(hand_table()))
    p = plan(t)
    all_cpu = simulate(t, {"load": "cpu", "clean": "cpu", "train": "cpu"}).makespan_s
    rule = simulate(t, {"load": "cpu", "clean": "cpu", "train": "gpu"}).makespan_s
    assert p.baselines == {"all_cpu": all_cpu, "all_gpu": None, "rule_of_thumb": rule}
    assert p.predicted_makespan_s <= min(all_cpu, rule)


def test_reasons_name_the_speedup_size_and_copy():
    p = plan(CostTable.model_validate(hand_table()))
    clean = p.stages[1]
    assert clean.device == "gpu"
    assert clean.reason.startswith("GPU is 200× faster than CPU at 4,096 rows; the copy in costs 25.6 ms")
    assert clean.predicted_s == {"cpu": 0.4, "gpu": 0.002}
    assert p.stages[0].reason.startswith("only the CPU can run it")


def test_a_slower_device_is_explained_by_the_copies_it_avoids():
    doc = unit_link(hand_table())
    doc["stages"][1]["seconds"] = {"cpu": 0.3, "gpu": 0.2}  # 0.1 s faster, 1.28 s of copies
    doc["stages"][2]["seconds"] = {"cpu": 3.0}
    p = plan(CostTable.model_validate(doc))
    clean = p.stages[1]
    assert clean.device == "cpu"
    assert "copies it needs would cost" in clean.reason
    assert clean.transfer_s < 0  # staying on the CPU saves copies


def test_loop_carried_stage_reason():
    doc = hand_table()
    doc["stages"][2].update(seconds={"cpu": 0.1, "gpu": 0.7}, loop_carried=True)
    p = plan(CostTable.model_validate(doc))
    assert p.placement["train"] == "cpu"
    assert p.stages[2].reason.startswith("loop-carried stage: 7× slower on GPU")


def test_simulated_test_device_is_never_called_a_gpu():
    doc = hand_table()
    doc["devices"] = {"cpu": {"kind": "cpu"}, "gpu-sim": {"kind": "sim"}}
    for s in doc["stages"]:
        s["seconds"] = {("gpu-sim" if k == "gpu" else k): v for k, v in s["seconds"].items()}
        s.pop("peak_bytes", None)
    p = plan(CostTable.model_validate(doc))
    assert p.placement["clean"] == "gpu-sim"
    assert p.baselines["rule_of_thumb"] is not None
    text = " ".join(s.reason for s in p.stages)
    assert "simulated test device" in text and "GPU" not in text


def test_crossover_size_from_a_cost_model():
    # cpu: 1e-4 s per row; gpu: 20 ms launch + 1e-6 s per row  ->  equal at ~202 rows
    def at(size: float) -> CostTable:
        return CostTable.model_validate({
            "devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}},
            "link": {d: {"latency_s": 0.0, "bandwidth_Bps": 1e15} for d in ("h2d", "d2h")},
            "size": size,
            "stages": [{"name": "s", "output_bytes": 8 * size,
                        "seconds": {"cpu": 1e-4 * size, "gpu": 0.02 + 1e-6 * size}}]})

    p = plan(at(1000), cost_at=at, size=1000)
    s = p.stages[0]
    assert s.device == "gpu"
    assert s.crossover_size == pytest.approx(0.02 / (1e-4 - 1e-6), rel=0.1)
    assert "below about" in s.reason
    far = plan(at(1e6), cost_at=at, size=1e6)
    assert far.stages[0].crossover_size is None  # beyond a 1,000x range
    assert plan(at(1000)).stages[0].crossover_size is None  # no cost model, no crossover


def test_auto_chooses_exact_for_small_and_heuristic_for_large():
    import random

    from tests.synthetic import random_table

    small = random_table(random.Random(1), 8)
    big = random_table(random.Random(2), 60)
    assert plan(small).method == "exact"
    assert plan(big).method == "heuristic"
    chain = random_table(random.Random(3), 40, chain=True)
    assert plan(chain).method == "exact"
