"""The plan: the best placement for an objective, its predicted schedule, and why.

May import: pydantic, placer.errors, placer.files, placer.data.{cost_table,plan}, placer.optimize.*.
Never torch, dask or numba.

:func:`plan` chooses the search by size: a dynamic program for a chain (when the
objective allows, as makespan does), branch and bound when at most
:data:`EXACT_LIMIT` stages have a choice, and the heuristic beyond.
``method="exact"`` or ``"heuristic"`` forces one. The objective is looked up by
name in :mod:`placer.optimize.objectives`; a plan records the name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from placer.data.cost_table import CostTable
from placer.data.plan import TIE_RULE, Plan, Schedule, StageChoice, Tie  # noqa: F401
from placer.errors import InfeasibleError, PlacerError
from placer.optimize import objectives
from placer.optimize.exact import branch_and_bound, chain_dp
from placer.optimize.explain import (
    FLIP_LIMIT,
    TIE_NOISE,
    baseline_makespans,
    copies_around,
    copies_in,
    copies_out,
    crossovers,
    device_word,
    flip_values,
    reason,
    overlap,
    spread_factors,
    tie_key,
    ties,
)
from placer.optimize.heuristic import heuristic, polish
from placer.optimize.objectives import get_objective, loads, money
from placer.optimize.problem import INF, Problem
from placer.optimize.simulate import makespan, schedule

#: branch and bound when at most this many stages have more than one allowed device
EXACT_LIMIT = 16
#: ``method="exact"`` on more stages than this (a non-chain) plans with the heuristic, with a warning:
#: the depth-first search would outgrow Python's stack
EXACT_MAX_STAGES = 400
#: branch and bound stops after this many search nodes with the best placement so far, with a warning
EXACT_NODE_LIMIT = 2_000_000
#: among equally good placements, prefer the least work, up to this many stages
POLISH_LIMIT = 200
#: a registered objective's name (:func:`placer.optimize.objectives.names`)
Objective = str
Method = Literal["auto", "exact", "heuristic"]


def search(
    pb: Problem, objective: str | objectives.Objective, method: str, deadline_s: float | None,
    warnings: list[str] | None = None,
) -> tuple[str, str, float, list[int]]:
    """``(method, algorithm, value, device index per stage)`` of the best placement found.

    Among equally good placements of up to ``POLISH_LIMIT`` stages, the one with
    less compute and copy time is preferred (see :func:`heuristic.polish`). Warnings
    (an exact search that fell back or stopped early) are appended to ``warnings``.
    """
    used, algorithm, value, place = _search(pb, objective, method, deadline_s, warnings)
    if value < INF and pb.n <= POLISH_LIMIT:
        place = polish(pb, place, objective, deadline_s)
    return used, algorithm, value, place


def _search(pb: Problem, objective: str | objectives.Objective, method: str,
            deadline_s: float | None, warnings: list[str] | None = None):
    objective = get_objective(objective)
    warnings = [] if warnings is None else warnings
    if method not in ("auto", "exact", "heuristic"):
        raise ValueError(f"unknown method {method!r}; use auto, exact or heuristic")
    free = sum(1 for al in pb.allowed if len(al) > 1)
    chain_ok = objective.chain_dp and pb.is_chain()
    if method == "auto":
        method = "exact" if (chain_ok or free <= EXACT_LIMIT) else "heuristic"
    if method == "exact" and chain_ok:
        value, place = chain_dp(pb)
        return "exact", "dynamic programming over the chain", value, place
    if method == "exact" and pb.n > EXACT_MAX_STAGES:
        warnings.append(f"--method exact: {pb.n} stages are more than the exact search handles "
                        f"({EXACT_MAX_STAGES}); planned with the heuristic instead")
        method = "heuristic"
    (excess, h_value), h_place = heuristic(pb, objective, deadline_s=deadline_s)
    if method == "heuristic":
        value = h_value if excess == 0 else INF
        return "heuristic", "HEFT list scheduling + local search", value, h_place
    incumbent = (h_value, h_place) if excess == 0 else (INF, None)
    complete: list[bool] = []
    value, place = branch_and_bound(pb, objective, deadline_s=deadline_s, incumbent=incumbent,
                                    node_limit=EXACT_NODE_LIMIT, complete=complete)
    if not all(complete):
        warnings.append(f"--method exact: {free} stages with a choice; the search stopped after "
                        f"{EXACT_NODE_LIMIT:,} nodes, so this placement is the best found, not proven optimal "
                        "(--method heuristic plans large pipelines faster)")
        return "exact", "branch and bound (stopped early: not proven optimal)", value, (
            place if place is not None else h_place)
    return "exact", "branch and bound", value, place if place is not None else h_place


def plan(
    costs: CostTable,
    *,
    objective: str | objectives.Objective = "makespan",
    method: Method = "auto",
    deadline_s: float | None = None,
    cost_at: Callable[[float], CostTable] | None = None,
    size: float | None = None,
) -> Plan:
    """The best placement of a cost table for an objective, with reasons and baselines.

    Parameters
    ----------
    costs : CostTable
        Costs at the size to plan for.
    objective : str or Objective
        A registered objective (:mod:`placer.optimize.objectives`): ``makespan``,
        ``throughput`` or ``cost`` minimise one run's time, the busiest resource's
        time per batch of a stream, or money per run (under ``deadline_s`` when given).
    method : {"auto", "exact", "heuristic"}
        ``auto``: exact for chains and for up to ``EXACT_LIMIT`` free stages.
        ``exact`` on a large non-chain pipeline may take very long.
    deadline_s : float, optional
        For ``cost``: the makespan every candidate must meet. For the other
        objectives: only checked, with a warning when the plan misses it.
    cost_at : callable, optional
        ``size -> CostTable``; with it, each stage gets the size (within 1,000x
        around ``size``) where the plan would move it.
    size : float, optional
        The size ``costs`` is for (default ``costs.size``).

    Raises
    ------
    UnknownObjectiveError
        When no objective has that name (a ``ValueError``).
    InfeasibleError
        When no placement meets the deadline (``cost``).
    """
    t0 = time.perf_counter()
    objective = get_objective(objective)
    size = costs.size if size is None else size
    pb = Problem(costs)
    warnings: list[str] = []
    used, algorithm, value, place = search(pb, objective, method, deadline_s, warnings)
    if value == INF:
        fastest = search(pb, "makespan", "auto", None)[2]
        raise InfeasibleError(
            f"no placement meets the deadline of {deadline_s:g} s; the fastest takes "
            f"{fastest:.4g} s: raise --deadline-s or drop it"
        )
    noise = TIE_NOISE if costs.noise is None else costs.noise
    flips = flip_values(pb, place, lambda p: objective.evaluate(pb, p, deadline_s)) if pb.n <= FLIP_LIMIT else None
    # a stage time's uncertainty is a factor on it: placements tie when their intervals overlap
    spread = spread_factors(pb)
    place, tied = ties(pb, place, lambda p: objective.evaluate(pb, p, deadline_s), noise=noise, flips=flips,
                       spread=spread)
    value = objective.evaluate(pb, place, deadline_s)
    sched = schedule(pb, place)
    if deadline_s is not None and sched.makespan_s > deadline_s * (1 + 1e-9):
        warnings.append(
            f"the plan's predicted makespan {sched.makespan_s:.4g} s misses the deadline of "
            f"{deadline_s:g} s"
        )
    choices = explain_stages(pb, place, objective, objective.evaluate(pb, place, deadline_s),
                             deadline_s, size, costs.size_unit)
    if cost_at is not None and size:
        _add_crossovers(choices, cost_at, size, objective, method, deadline_s, costs.size_unit, pb)
    tie_list = _ties(pb, place, tied, choices, noise, value, objective)
    return Plan(
        placement=pb.placement(place),
        objective=objective.name,
        method=used,
        algorithm=algorithm,
        predicted_makespan_s=sched.makespan_s,
        objective_value=value,
        predicted_period_s=max(loads(pb, place)),
        predicted_cost=money(pb, place),
        deadline_s=deadline_s,
        schedule=sched,
        stages=choices,
        baselines=baseline_makespans(pb.without_pins()),
        planning_s=time.perf_counter() - t0,
        size=size,
        size_unit=costs.size_unit,
        devices={n: d.kind for n, d in costs.devices.items()},
        warnings=warnings,
        ties=tie_list,
        noise=noise,
    )


def _ties(pb: Problem, place: list[int], tied: list, choices: list[StageChoice], noise: float,
          value: float, objective: objectives.Objective) -> list[Tie]:
    """The ties as plan data; each stage they place elsewhere says so in its reason, with which way
    the tie went and what it costs (or saves) at the point estimate."""
    mine = pb.placement(place)
    out = []
    for p, val in tied:
        other = pb.placement(p)
        differs = {n: d for n, d in other.items() if d != mine[n]}
        key = tie_key(pb, p)
        out.append(Tie(placement=other, differs=differs, objective_value=val,
                       predicted_makespan_s=makespan(pb, p), copies=key[0], on_cpu=-key[1],
                       fits_disagree=not overlap(pb, [[1.0] * len(pb.devices)] * pb.n, place, value, p, val, noise)))
    for c in choices:
        mine_ties = [t for t in out if c.name in t.differs]
        if not mine_ties:
            continue
        alts = sorted({t.differs[c.name] for t in mine_ties})
        spread = any(t.fits_disagree for t in mine_ties)
        why = (f"predicted within {noise:.0%}, the noise, and the factor by which the stage times they differ in "
               "may be off (fit forms that match the measurements as well disagree)"
               if spread else f"predicted within {noise:.0%}, the noise")
        best_tie = min(mine_ties, key=lambda t: t.objective_value)
        if best_tie.objective_value < value:
            cost = (f"the {objective.what} is predicted {value / best_tie.objective_value - 1:.0%} longer than "
                    f"with {' or '.join(alts)}, within the tie") if objective.name != "cost" else (
                    f"predicted {value / best_tie.objective_value - 1:.0%} dearer, within the tie")
        else:
            cost = (f"at the point estimate it is also the faster (the other is predicted "
                    f"{best_tie.objective_value / value:.2f}× as long)") if objective.name != "cost" else (
                    "at the point estimate it is also the cheaper")
        c.reason += f"; a tie with {' or '.join(alts)} ({why}): went to {mine[c.name]} by {TIE_RULE}; {cost}"
    return out


def explain_stages(
    pb: Problem,
    place: list[int],
    objective: str | objectives.Objective,
    value: float,
    deadline_s: float | None,
    size: float | None,
    unit: str,
) -> list[StageChoice]:
    """A :class:`StageChoice` per stage, in table order."""
    objective = get_objective(objective)
    table = pb.table
    flips = None
    if pb.n <= FLIP_LIMIT:
        flips = flip_values(pb, place, lambda p: objective.evaluate(pb, p, deadline_s))
    at = f" at {size:,.0f} {unit}" if size else ""
    out = {}
    by_name = {st.name: st for st in table.stages}
    spread = spread_factors(pb)
    for v, name in enumerate(pb.names):
        st = by_name[name]
        d = place[v]
        blocked = pb.blocked[v]
        others = [e for e in range(len(pb.devices))
                  if e != d and pb.devices[e] not in blocked]
        alt = min(others, key=lambda e: pb.time[v][e], default=None)
        around = {}
        if alt is not None:
            around = {d: copies_around(pb, place, v, d), alt: copies_around(pb, place, v, alt)}
        delta = 0.0 if alt is None else around[d] - around[alt]
        text = reason(pb, place, v, objective=objective, value=value,
                      flips=None if flips is None else flips[v], at=at,
                      loop_carried=st.loop_carried, pinned=st.pin is not None, blocked=blocked,
                      around=around, spread=spread[v])
        out[name] = StageChoice(
            name=name,
            kind=st.kind,
            device=pb.devices[d],
            predicted_s={dev: s for dev in pb.devices
                         if (s := table.seconds(st, dev)) is not None},
            transfer_s=delta,
            copy_s=copies_in(pb, place, v) + copies_out(pb, place, v),
            reason=text,
            pinned=st.pin is not None,
        )
    return [out[st.name] for st in table.stages]


def _add_crossovers(choices, cost_at, size, objective, method, deadline_s, unit, pb) -> None:
    def devices_at(s: float) -> dict[str, str] | None:
        try:
            other = Problem(cost_at(s))
            return other.placement(search(other, objective, method, deadline_s)[3])
        except (ValueError, PlacerError):
            return None  # no feasible plan at that size (e.g. out of memory): stop there

    chosen = {c.name: c.device for c in choices}
    found = crossovers(devices_at, size, chosen)
    words = {dev: device_word(pb, i) for i, dev in enumerate(pb.devices)}
    for c in choices:
        cs = found.get(c.name)
        if cs is None:
            continue
        c.crossover_size = float(round(cs))
        side = "above" if cs > size else "below"
        c.reason += f"; {side} about {cs:,.0f} {unit} it moves off the {words[c.device]}"
