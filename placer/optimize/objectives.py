"""What a placement is scored by: makespan, throughput (period per batch), or money.

May import: placer.optimize.{problem,simulate}. Never torch, dask or numba.

- ``makespan``: the simulated time of one run (:func:`placer.optimize.simulate.makespan`).
- ``throughput``: for a stream of batches whose stages overlap, the busiest
  resource's seconds per batch (the *period*). Resources are the CPU (its stage
  seconds divided by its workers), each accelerator, and each accelerator's link
  in each direction (an accelerator-to-accelerator copy loads the source's d2h
  and the destination's h2d). With a ``network`` in the table, each accelerator
  stands for its worker: a copy's network time loads the link of every
  accelerator at either end of it (both ends of an accelerator-to-accelerator
  copy, since the sending and the receiving worker are both busy with it).
- ``cost``: money per run, ``sum(seconds * price_per_hour / 3600 / slots)`` over
  stages: a stage pays for the slot it occupies (a CPU stage one worker's share of
  the CPU's price). Copies are free. With a deadline, a placement whose makespan
  exceeds it is infeasible.
"""

from __future__ import annotations

import math

from placer.optimize.problem import Problem
from placer.optimize.simulate import makespan

OBJECTIVES = ("makespan", "throughput", "cost")
#: relative slack when comparing a makespan with a deadline (float noise only)
DEADLINE_RTOL = 1e-9


def loads(pb: Problem, place: list[int]) -> list[float]:
    """Seconds per batch of each resource: devices (per slot), then h2d and d2h per location.

    Index ``len(devices) + k`` is the h2d link of location ``k``, and
    ``len(devices) + nloc + k`` its d2h link (``k`` = 0 is the host and stays 0).
    """
    nd = len(pb.devices)
    nloc = max(pb.loc) + 1
    out = [0.0] * (nd + 2 * nloc)
    for v, d in enumerate(place):
        out[d] += pb.time[v][d] / pb.slots[d]
        lv = pb.loc[d]
        if lv and pb.ext[v] > 0:
            out[nd + lv] += pb.ext_h2d[v]
        dests = {pb.loc[place[w]] for w in pb.succs[v]}
        if not pb.succs[v]:
            dests.add(0)
        dests.discard(lv)
        for lw in dests:
            if lv:
                out[nd + nloc + lv] += pb.d2h[v]
            if lw:
                out[nd + lw] += pb.h2d[v]
    return out


def resource_names(pb: Problem) -> list[str]:
    """Names matching :func:`loads` (``link h2d gpu:0`` and so on)."""
    nloc = max(pb.loc) + 1
    locs = ["host"] + [pb.devices[d] for d in range(len(pb.devices)) if pb.loc[d]]
    return list(pb.devices) + [f"link h2d {locs[k]}" for k in range(nloc)] + [
        f"link d2h {locs[k]}" for k in range(nloc)
    ]


def period(pb: Problem, place: list[int]) -> float:
    """The busiest resource's seconds per batch."""
    return max(loads(pb, place))


def money(pb: Problem, place: list[int]) -> float:
    """Money per run: each stage's seconds times its slot's price per second."""
    return sum(pb.time[v][d] * pb.price_s[d] / pb.slots[d] for v, d in enumerate(place))


def evaluate(pb: Problem, place: list[int], objective: str, deadline_s: float | None = None) -> float:
    """The objective's value of a placement (``inf`` when it misses the deadline)."""
    if objective == "makespan":
        return makespan(pb, place)
    if objective == "throughput":
        return period(pb, place)
    if objective == "cost":
        if deadline_s is not None and makespan(pb, place) > deadline_s * (1 + DEADLINE_RTOL):
            return math.inf
        return money(pb, place)
    raise ValueError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
