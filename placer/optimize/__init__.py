"""Placement optimization: simulate a placement, search for the best, explain it.

May import: networkx, pydantic, placer.errors, placer.data.cost_table and its own modules. Never torch,
dask or numba: planning stays fast and importable anywhere.

Modules
-------
costs       the cost table (devices, link, per-stage costs) and its validation
problem     a table compiled to lists indexed by dispatch priority
simulate    the schedule model and :func:`simulate`
objectives  what a placement is scored by: makespan, throughput (period per batch),
            money; a registry others can add to
exact       chain DP, branch and bound, exhaustive enumeration
heuristic   HEFT seeds and local search for large pipelines
explain     reasons, baselines and crossover sizes
plan        :class:`Plan` and :func:`plan`

Examples
--------
>>> table = CostTable.model_validate({
...     "devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu": {"kind": "gpu"}},
...     "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10},
...              "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10}},
...     "stages": [
...         {"name": "load", "kind": "cleaning", "input_bytes": 6.4e8, "output_bytes": 6.4e8,
...          "seconds": {"cpu": 0.05}},
...         {"name": "train", "kind": "training", "inputs": ["load"], "output_bytes": 1e6,
...          "seconds": {"cpu": 4.0, "gpu": 0.1}}]})
>>> p = plan(table)
>>> p.placement
{'load': 'cpu', 'train': 'gpu'}
>>> p.stages[1].reason
'GPU is 40× faster than CPU; the copy in costs 25.6 ms'
"""

from __future__ import annotations

from placer.data.cost_table import CostTable, DeviceSpec, Direction, Link, StageCost
from placer.errors import CostTableError, InfeasibleError
from placer.optimize.objectives import Objective, UnknownObjectiveError, get_objective, register
from placer.optimize.plan import Plan, StageChoice, plan
from placer.optimize.simulate import Schedule, StageEvent, TransferEvent, simulate

__all__ = [
    "CostTable", "CostTableError", "DeviceSpec", "Direction", "InfeasibleError", "Link",
    "Objective", "Plan", "Schedule", "StageChoice", "StageCost", "StageEvent", "TransferEvent",
    "UnknownObjectiveError", "get_objective", "plan", "register", "simulate",
]
