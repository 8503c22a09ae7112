"""Exact placement search: a chain DP, branch and bound, and exhaustive enumeration.

May import: placer.optimize.{problem,simulate,objectives}. Never torch, dask or numba.

All three minimise the same objective values as :func:`objectives.evaluate`, so
they agree with each other to floating-point rounding. Branch and bound assigns
stages in dispatch priority (every producer is placed before its consumers) and
prunes a partial placement when the objective's lower bound on every completion
(:meth:`Objective.bound <placer.optimize.objectives.Objective.bound>`) is no better
than the best complete placement found so far. The search keeps what the bounds
of the built-in objectives read (:class:`~placer.optimize.objectives.Partial`):

- a makespan bound: the longest producer-to-sink path, with each placed stage's
  earliest start and the cheapest continuation below it (``tails``), the load of
  each device (a device cannot finish before it has run its stages), and all the
  work left spread over every slot;
- the load of every resource so far (loads only grow), for throughput;
- the money so far and the cheapest device for every stage left, for cost.

Identical accelerators are interchangeable, so only one of each set of
equivalent placements is searched.
"""

from __future__ import annotations

import itertools
import math

from placer.optimize.objectives import Objective, get_objective, stage_money
from placer.optimize.problem import INF, Problem


def chain_dp(pb: Problem) -> tuple[float, list[int]]:
    """Optimal makespan placement of a chain, by dynamic programming over its stages.

    ``best[d]`` is the earliest finish of the stages so far with the last on ``d``;
    a stage starts when both its producer's output and its external input are on
    its device, and the final output must reach the host.
    """
    if not pb.is_chain():
        raise ValueError("chain_dp needs a chain: every stage has at most one producer and consumer")
    nd = len(pb.devices)
    best: list[float] = []
    back: list[list[int]] = []
    for v in range(pb.n):
        row, arg = [INF] * nd, [-1] * nd
        for d in pb.allowed[v]:
            ext = pb.ext_h2d[v] if pb.loc[d] else 0.0
            if v == 0:
                row[d] = ext + pb.time[v][d]
                continue
            arr, prev = min(
                (best[p] + pb.tr(v - 1, pb.loc[p], pb.loc[d]), p) for p in range(nd) if best[p] < INF
            )
            row[d], arg[d] = max(ext, arr) + pb.time[v][d], prev
        best, back = row, back + [arg]
    last = pb.n - 1
    span, d = min(
        (best[d] + (pb.d2h[last] if pb.loc[d] else 0.0), d) for d in range(nd) if best[d] < INF
    )
    place = [0] * pb.n
    for v in range(last, -1, -1):
        place[v] = d
        d = back[v][d]
    return span, place


def tails(pb: Problem) -> list[list[float]]:
    """``tails[v][d]``: least time from ``v`` starting on ``d`` to its descendants' outputs at home.

    Contention is ignored, so this is a lower bound for any completion.
    """
    nd = len(pb.devices)
    bl = [[INF] * nd for _ in range(pb.n)]
    for v in range(pb.n - 1, -1, -1):
        for d in pb.allowed[v]:
            ld = pb.loc[d]
            rest = pb.d2h[v] if (ld and not pb.succs[v]) else 0.0
            for w in pb.succs[v]:
                best = min(pb.tr(v, ld, pb.loc[e]) + bl[w][e] for e in pb.allowed[w])
                rest = best if best > rest else rest
            bl[v][d] = pb.time[v][d] + rest
    return bl


def equivalent_devices(pb: Problem) -> list[int]:
    """For each device, the first device it is interchangeable with (itself if none)."""
    nd = len(pb.devices)
    rep = list(range(nd))
    for a in range(nd):
        for b in range(a):
            if rep[b] == b and pb.kinds[a] == pb.kinds[b] and pb.kinds[a] != "cpu" and (
                pb.price_s[a] == pb.price_s[b]
                and all(pb.time[v][a] == pb.time[v][b] for v in range(pb.n))
                and all((a in al) == (b in al) for al in pb.allowed)
            ):
                rep[a] = b
                break
    return rep


class _OutOfNodes(Exception):
    """The search visited its budget of nodes."""


class _Search:
    """Depth-first branch and bound; see the module docstring for the bounds.

    While a stage is being tried, the search is the
    :class:`~placer.optimize.objectives.Partial` its objective's bound reads.
    """

    def __init__(self, pb: Problem, objective: Objective, deadline_s: float | None, incumbent,
                 node_limit: int | None = None):
        self.pb, self.objective, self.deadline_s = pb, objective, deadline_s
        self.best_value, self.best = incumbent
        self.bl = tails(pb)
        nd = len(pb.devices)
        self.nd, self.nloc = nd, max(pb.loc) + 1
        self.place = [0] * pb.n
        self.placed, self.path_lb, self.spent = 0, 0.0, 0.0
        self.ef = [0.0] * pb.n
        self.load = [0.0] * (nd + 2 * self.nloc)
        self.dests = [0] * pb.n
        self.used = [0] * nd
        self.rep = equivalent_devices(pb)
        self.total_slots = sum(pb.slots)
        mins = [min(pb.time[v][d] for d in pb.allowed[v]) for v in range(pb.n)]
        cheap = [min(stage_money(pb, v, d) for d in pb.allowed[v]) for v in range(pb.n)]
        self.rest_work = list(itertools.accumulate(reversed(mins + [0.0])))[::-1]
        self.rest_cost = list(itertools.accumulate(reversed(cheap + [0.0])))[::-1]
        self.work = 0.0
        self.nodes = 0
        self.node_limit = node_limit
        #: False when the node budget ran out: the best placement found is not proven optimal
        self.complete = True

    def run(self) -> tuple[float, list[int] | None]:
        try:
            self._visit(0, 0.0, 0.0)
        except _OutOfNodes:
            self.complete = False
        return self.best_value, self.best

    def span_bound(self) -> float:
        """A lower bound on the makespan of every completion of the placed stages."""
        return max(self.path_lb, max(self.load[: self.nd]),
                   (self.work + self.rest_work[self.placed]) / self.total_slots)

    def cheapest_rest(self) -> float:
        """The least money the stages not yet placed can cost."""
        return self.rest_cost[self.placed]

    def _visit(self, v: int, path_lb: float, spent: float) -> None:
        pb = self.pb
        self.nodes += 1
        if self.node_limit is not None and self.nodes > self.node_limit:
            raise _OutOfNodes()
        if v == pb.n:
            self.placed, self.path_lb, self.spent = v, path_lb, spent
            self._leaf()
            return
        options = []
        for d in pb.allowed[v]:
            r = self.rep[d]
            if r != d and any(self.rep[e] == r and not self.used[e] for e in range(d)):
                continue  # an unused twin earlier in order covers this branch
            options.append(d)
        for d in sorted(options, key=lambda d: self._start(v, d) + self.bl[v][d]):
            undo = self._assign(v, d)
            est = self.ef[v] - pb.time[v][d]
            lb_path = max(path_lb, est + self.bl[v][d])
            new_spent = spent + pb.time[v][d] * pb.price_s[d] / pb.slots[d]
            self.placed, self.path_lb, self.spent = v + 1, lb_path, new_spent
            if self.objective.bound(self) < self.best_value:
                self._visit(v + 1, lb_path, new_spent)
            self._unassign(v, d, undo)

    def _start(self, v: int, d: int) -> float:
        pb = self.pb
        ld = pb.loc[d]
        t = pb.ext_h2d[v] if ld else 0.0
        for u in pb.preds[v]:
            a = self.ef[u] + pb.tr(u, pb.loc[self.place[u]], ld)
            t = a if a > t else t
        return t

    def _assign(self, v: int, d: int) -> list:
        pb, load, nd, nloc = self.pb, self.load, self.nd, self.nloc
        self.place[v] = d
        self.used[d] += 1
        self.ef[v] = self._start(v, d) + pb.time[v][d]
        self.work += pb.time[v][d]
        ld = pb.loc[d]
        changes = [(d, pb.time[v][d] / pb.slots[d])]
        if ld and pb.ext[v] > 0:
            changes.append((nd + ld, pb.ext_h2d[v]))
        if ld and not pb.succs[v]:
            changes.append((nd + nloc + ld, pb.d2h[v]))
        masks = []
        for u in pb.preds[v]:
            lu = pb.loc[self.place[u]]
            bit = 1 << ld
            if lu != ld and not self.dests[u] & bit:
                self.dests[u] |= bit
                masks.append((u, bit))
                if lu:
                    changes.append((nd + nloc + lu, pb.d2h[u]))
                if ld:
                    changes.append((nd + ld, pb.h2d[u]))
        for i, x in changes:
            load[i] += x
        return [changes, masks]

    def _unassign(self, v: int, d: int, undo: list) -> None:
        changes, masks = undo
        for i, x in changes:
            self.load[i] -= x
        for u, bit in masks:
            self.dests[u] &= ~bit
        self.used[d] -= 1
        self.work -= self.pb.time[v][d]

    def _leaf(self) -> None:
        value = self.objective.search_value(self)
        if value < self.best_value:
            self.best_value, self.best = value, self.place[:]


def branch_and_bound(
    pb: Problem,
    objective: str | Objective = "makespan",
    *,
    deadline_s: float | None = None,
    incumbent: tuple[float, list[int] | None] = (INF, None),
    node_limit: int | None = None,
    complete: list[bool] | None = None,
) -> tuple[float, list[int] | None]:
    """The optimal placement (value, device index per stage); ``(inf, None)`` if none is feasible.

    ``incumbent`` is a known placement and its value; a good one prunes more. With
    ``node_limit``, the search stops after that many nodes with the best placement
    found so far; ``complete`` (a list) then gets False appended, else True.
    """
    search = _Search(pb, get_objective(objective), deadline_s, incumbent, node_limit)
    out = search.run()
    if complete is not None:
        complete.append(search.complete)
    return out


def exhaustive(
    pb: Problem, objective: str | Objective = "makespan", *, deadline_s: float | None = None
) -> tuple[float, list[int] | None]:
    """Evaluate every placement (product of each stage's allowed devices); for checking only."""
    obj = get_objective(objective)
    best_value, best = math.inf, None
    for combo in itertools.product(*pb.allowed):
        place = list(combo)
        value = obj.evaluate(pb, place, deadline_s)
        if value < best_value:
            best_value, best = value, place
    return best_value, best
