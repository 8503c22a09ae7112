"""The dispatch rule (placer.schedule), and the engine and the simulator following it alike.

On random pipelines and placements over ``cpu`` and ``gpu-sim``, the executor's
recorded start order is compared with the simulated one, instant by instant (stages
that start at one simulated instant form a set):

* inline lanes run every stage of a dispatch round in the calling thread, then handle
  every completion, so they start stages exactly as the simulation of a table where
  every stage takes one second and copies take none;
* thread lanes run stages that sleep a known number of steps; durations are distinct
  powers of two, so no two stages end at one simulated instant and distinct instants
  are at least a step apart (more than the executor's noise). Outputs are plain
  integers, so copies take no time, as the table says.
"""

from __future__ import annotations

import time

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer import Pipeline
from placer.executor import execute
from placer.optimize import CostTable, simulate
from placer.optimize.problem import Problem
from placer.schedule import ReadyQueues, copy_targets, dispatch_order

#: seconds of one duration unit of the timed runs
STEP = 0.03
DEVICES = ("cpu", "gpu-sim")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIMED = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pipelines(draw, max_n: int = 7) -> dict:
    """Stages (in declaration order) with their inputs and device, and the CPU's workers."""
    n = draw(st.integers(1, max_n))
    inputs = {f"s{i}": sorted(draw(st.sets(st.sampled_from([f"s{j}" for j in range(i)]), max_size=3)))
              if i else [] for i in range(n)}
    names = draw(st.permutations(list(inputs)))
    return {
        "names": names,
        "inputs": inputs,
        "device": {s: draw(st.sampled_from(DEVICES)) for s in names},
        "workers": draw(st.integers(1, 3)),
    }


def _stage_fn(seconds: float):
    def fn(device, **inputs):
        if seconds:
            time.sleep(seconds)
        return sum(inputs.values()) + 1

    return fn


def build(doc: dict, units: dict[str, int], step: float) -> tuple[Pipeline, CostTable]:
    """The pipeline (each stage sleeps ``units * step``) and its cost table in units."""
    p = Pipeline("drawn")
    stages = []
    for s in doc["names"]:
        ins = {f"x{k}": src for k, src in enumerate(doc["inputs"][s])}
        p.add(name=s, fn=_stage_fn(units[s] * step), inputs=ins)
        stages.append({"name": s, "inputs": doc["inputs"][s], "output_bytes": 0,
                       "seconds": dict.fromkeys(DEVICES, float(units[s]))})
    instant = {"latency_s": 0.0, "bandwidth_Bps": 1e12}
    table = CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu", "workers": doc["workers"]}, "gpu-sim": {"kind": "sim"}},
        "link": {"h2d": instant, "d2h": instant},
        "stages": stages,
    })
    return p, table


def simulated_rounds(table: CostTable, placement: dict[str, str]) -> list[set[str]]:
    """The stages that start at each simulated instant, in time order."""
    at: dict[float, set[str]] = {}
    for ev in simulate(table, placement).stages:
        at.setdefault(ev.start_s, set()).add(ev.name)
    return [at[t] for t in sorted(at)]


def run_rounds(order: list[str], like: list[set[str]]) -> list[set[str]]:
    """``order`` cut into consecutive groups as large as those of ``like``."""
    out, i = [], 0
    for group in like:
        out.append(set(order[i:i + len(group)]))
        i += len(group)
    return out


def started(run) -> list[str]:
    return [s.name for s in sorted(run.stages, key=lambda s: s.start_s)]


# -- the rule itself ---------------------------------------------------------------------
@FAST
@given(pipelines(max_n=9))
def test_dispatch_order_is_the_pipelines_and_the_optimizers_priority(doc):
    order = dispatch_order(doc["names"], doc["inputs"])
    pos = {n: i for i, n in enumerate(doc["names"])}
    g = nx.DiGraph()
    g.add_nodes_from(doc["names"])
    g.add_edges_from((u, v) for v in doc["names"] for u in doc["inputs"][v])
    assert order == list(nx.lexicographical_topological_sort(g, key=pos.__getitem__))
    p, table = build(doc, dict.fromkeys(doc["names"], 1), 0.0)
    assert order == p.order() == Problem(table).names


def test_dispatch_order_rejects_cycles_and_unknown_inputs():
    with pytest.raises(ValueError, match="a, b form a cycle"):
        dispatch_order(["a", "b", "c"], {"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="'a' reads 'z'"):
        dispatch_order(["a"], {"a": ["z"]})


def test_ready_queues_fill_each_lanes_free_slots_with_its_best_tasks():
    q = ReadyQueues({"cpu": 2, "gpu": 1})
    for task, lane, prio in [("late", "cpu", 9), ("g2", "gpu", 5), ("first", "cpu", 1),
                             ("g1", "gpu", 4), ("second", "cpu", 3)]:
        q.push(task, lane, prio)
    assert q.pop_startable() == [("cpu", "first"), ("cpu", "second"), ("gpu", "g1")]
    assert q.free == {"cpu": 0, "gpu": 0}
    q.release("gpu")
    q.push("urgent", "cpu", 0)  # a better task does not preempt: the CPU has no slot
    assert q.pop_startable() == [("gpu", "g2")]
    q.release("cpu")
    assert q.pop_startable() == [("cpu", "urgent")]


def test_a_copy_of_the_queues_dispatches_alike_and_apart():
    q = ReadyQueues({"cpu": 1, "gpu": 1})
    q.push("a", "cpu", 2)
    q.push("b", "cpu", 1)
    c = q.copy()
    q.push("z", "gpu", 0)
    assert c.pop_startable() == [("cpu", "b")]
    assert q.pop_startable() == [("cpu", "b"), ("gpu", "z")]
    assert c.free == {"cpu": 0, "gpu": 1} and q.free == {"cpu": 0, "gpu": 0}


def test_copies_go_once_to_every_other_consumer_location_and_home_for_a_sink():
    assert copy_targets("host", ["gpu:1", "host", "gpu:0", "gpu:1"], sink=False, home="host") == ["gpu:0", "gpu:1"]
    assert copy_targets("gpu:0", ["gpu:0"], sink=False, home="host") == []
    assert copy_targets("gpu:0", [], sink=True, home="host") == ["host"]
    assert copy_targets("host", [], sink=True, home="host") == []
    assert copy_targets(2, [0, 2, 1, 0], sink=False, home=0) == [0, 1]


# -- the engine follows it like the simulator -------------------------------------------------
@FAST
@given(pipelines(max_n=8))
def test_inline_lanes_start_stages_round_by_round_as_simulated(doc):
    p, table = build(doc, dict.fromkeys(doc["names"], 1), 0.0)
    expected = simulated_rounds(table, doc["device"])
    run = execute(p, doc["device"], executor="inline", workers=doc["workers"])
    assert run.executor == "inline"
    assert run_rounds(started(run), expected) == expected


@TIMED
@given(pipelines(max_n=5), st.data())
@pytest.mark.slow
def test_thread_lanes_start_stages_in_the_simulated_order(doc, data):
    powers = data.draw(st.permutations([1 << k for k in range(len(doc["names"]))]))
    units = dict(zip(doc["names"], powers))
    doc["workers"] = min(doc["workers"], 2)
    p, table = build(doc, units, STEP)
    expected = simulated_rounds(table, doc["device"])
    run = execute(p, doc["device"], executor="threads", workers=doc["workers"])
    assert run_rounds(started(run), expected) == expected, (
        f"simulated {expected}; ran {[(s.name, round(s.start_s / STEP, 2)) for s in run.stages]}")
