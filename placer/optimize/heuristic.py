"""Heuristic placement for large pipelines: list-scheduling seeds, then local search.

May import: placer.optimize.{problem,simulate,objectives,exact,explain}. Never torch, dask or numba.

1. Seeds. Earliest-finish-time list scheduling (HEFT) in upward-rank order and in
   dispatch order, the per-stage best device on its best producer-to-sink path,
   the fastest device per stage, all-CPU, and the objective's own seeds
   (:meth:`Objective.seeds <placer.optimize.objectives.Objective.seeds>`: for
   ``cost`` the cheapest device per stage, for ``throughput`` a greedy load
   balance). Each is scored by the objective.
2. Local search from the best seed: move one stage, or one stage with its
   neighbours, to another device; keep a move when the score improves. Stages on
   the critical path are tried first unless the objective says otherwise
   (``critical_first``: not for throughput). While time remains
   and the pipeline is small, random kicks restart the search (iterated local
   search); the best placement seen is kept.

Scores are ``(deadline excess, objective value)`` pairs
(:meth:`Objective.score <placer.optimize.objectives.Objective.score>`), so for
``cost`` under a deadline the search first meets the deadline, then saves money.
"""

from __future__ import annotations

import heapq
import random
import time

from placer.optimize.exact import tails
from placer.optimize.explain import copies_around
from placer.optimize.objectives import Objective, get_objective
from placer.optimize.problem import INF, Problem
from placer.optimize.simulate import following, makespan

#: stop iterated local search after this many kicks without improvement
PATIENCE = 40
#: also try moving every pair of stages at once up to this many stages
PAIR_LIMIT = 24
#: local search simulates moves from where they first matter (a Timeline) from this many stages
TIMELINE_MIN = 50


def default_budget(n: int) -> float:
    """Seconds of local search for ``n`` stages (the seeds are extra).

    Small pipelines usually stop earlier, after ``PATIENCE`` fruitless restarts.
    Beyond 100 stages the search is stopped by time, so this is most of the planning
    time: 0.15 s for 1,000 stages, 1.05 s for 10,000 (a move is simulated from where it
    first matters, see :class:`~placer.optimize.simulate.Timeline`).
    """
    return 0.25 if n <= 100 else min(2.5, 0.05 + 0.0001 * n)


def upward_rank(pb: Problem) -> list[float]:
    """HEFT's upward rank: mean time plus the longest mean path (with copies) to a sink."""
    comm = [(a + b) / 2 for a, b in zip(pb.h2d, pb.d2h)] if len(pb.devices) > 1 else [0.0] * pb.n
    rank = [0.0] * pb.n
    for v in range(pb.n - 1, -1, -1):
        times = [pb.time[v][d] for d in pb.allowed[v]]
        rest = max((rank[w] for w in pb.succs[v]), default=0.0)
        rank[v] = sum(times) / len(times) + (comm[v] if pb.succs[v] else 0.0) + rest
    return rank


def rank_order(pb: Problem, rank: list[float]) -> list[int]:
    """A topological order taking the highest-ranked ready stage first."""
    rem = pb.indeg[:]
    heap = [(-rank[v], v) for v in range(pb.n) if not rem[v]]
    heapq.heapify(heap)
    out = []
    while heap:
        v = heapq.heappop(heap)[1]
        out.append(v)
        for w in pb.succs[v]:
            rem[w] -= 1
            if not rem[w]:
                heapq.heappush(heap, (-rank[w], w))
    return out


def eft(pb: Problem, order: list[int]) -> list[int]:
    """List scheduling: each stage, in ``order``, to the device where it finishes first."""
    slots = [[0.0] * s for s in pb.slots]
    ef = [0.0] * pb.n
    place = [0] * pb.n
    loc, allowed, preds, succs, time = pb.loc, pb.allowed, pb.preds, pb.succs, pb.time
    h2d, d2h, net, ext_h2d = pb.h2d, pb.d2h, pb.net, pb.ext_h2d
    for v in order:
        best = (INF, 0, 0.0)
        pv = [(u, ef[u], loc[place[u]]) for u in preds[v]]
        for d in allowed[v]:
            ld = loc[d]
            ready = ext_h2d[v] if ld else 0.0
            for u, fu, lu in pv:  # ef[u] + pb.tr(u, lu, ld)
                if lu == ld:
                    a = fu + 0.0
                elif lu == 0:
                    a = fu + h2d[u]
                elif ld == 0:
                    a = fu + d2h[u]
                else:
                    a = fu + (d2h[u] + h2d[u] - net[u])
                ready = max(ready, a)
            f = max(ready, slots[d][0]) + time[v][d]
            if not succs[v] and ld:
                f_home = f + d2h[v]
            else:
                f_home = f
            if f_home < best[0]:
                best = (f_home, d, f)
        _, d, f = best
        place[v], ef[v] = d, f
        heapq.heapreplace(slots[d], f)
    return place


def path_best(pb: Problem) -> list[int]:
    """Each stage on the device of its best path, ignoring contention."""
    bl = tails(pb)
    loc, allowed, preds, time, tr = pb.loc, pb.allowed, pb.preds, pb.time, pb.tr
    head = [[INF] * len(pb.devices) for _ in range(pb.n)]
    for v in range(pb.n):
        for d in allowed[v]:
            ld = loc[d]
            s = pb.ext_h2d[v] if ld else 0.0
            for u in preds[v]:
                hu = head[u]
                s = max(s, min(hu[e] + tr(u, loc[e], ld) for e in allowed[u]))
            head[v][d] = s + time[v][d]
    return [min(allowed[v], key=lambda d: head[v][d] - time[v][d] + bl[v][d]) for v in range(pb.n)]


def seeds(pb: Problem, objective: str | Objective) -> list[list[int]]:
    """Starting placements for the local search."""
    out = [
        eft(pb, rank_order(pb, upward_rank(pb))),
        eft(pb, list(range(pb.n))),
        path_best(pb),
        [min(al, key=lambda d: pb.time[v][d]) for v, al in enumerate(pb.allowed)],
    ]
    if all(pb.cpu in al for al in pb.allowed):
        out.append([pb.cpu] * pb.n)
    return out + get_objective(objective).seeds(pb)


def critical_path(pb: Problem, place: list[int]) -> list[int]:
    """Stages on the chain of latest-arriving inputs that ends at the last sink home."""
    if pb.timeline is not None and pb.timeline.place == place:
        runs = pb.timeline.record()
    else:
        runs = []
        makespan(pb, place, runs)
    end = [0.0] * pb.n
    for v, _, f in runs:
        end[v] = f
    loc = [pb.loc[d] for d in place]
    v = max((w for w in range(pb.n) if not pb.succs[w]),
            key=lambda w: end[w] + (pb.d2h[w] if loc[w] else 0.0))
    path = [v]
    while pb.preds[v]:
        v = max(pb.preds[v], key=lambda u: end[u] + pb.tr(u, loc[u], loc[path[-1]]))
        path.append(v)
    return path


def _moves(pb: Problem, place: list[int], objective: Objective, rng: random.Random):
    """Candidate moves ``(stages, device or devices)``: critical stages first, if the objective says."""
    order = list(range(pb.n))
    rng.shuffle(order)
    if objective.critical_first and pb.n > 1:
        crit = critical_path(pb, place)
        seen = set(crit)
        order = crit + [v for v in order if v not in seen]
    for v in order:
        for d in pb.allowed[v]:
            if d != place[v]:
                yield (v,), d
    if pb.n <= PAIR_LIMIT:
        for i, v in enumerate(order):
            for w in order[i + 1:]:
                for d in pb.allowed[v]:
                    for e in pb.allowed[w]:
                        if d != place[v] and e != place[w]:
                            yield (v, w), (d, e)
    for v in order:
        for d in pb.allowed[v]:
            group = tuple(
                [v] + [w for w in pb.preds[v] + pb.succs[v] if d in pb.allowed[w] and place[w] != d]
            )
            if len(group) > 1 and place[v] != d:
                yield group, d


def local_search(pb, place, best, objective, deadline_s, deadline, rng) -> tuple:
    """First-improvement descent until no move helps or time runs out."""
    objective = get_objective(objective)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        # each move is simulated from where it first differs from ``place``
        view = following(pb, place) if pb.n >= TIMELINE_MIN else pb
        for group, d in _moves(view, place, objective, rng):
            old = [place[v] for v in group]
            for v, e in zip(group, d if isinstance(d, tuple) else [d] * len(group)):
                place[v] = e
            s = objective.score(view, place, deadline_s)
            if _better(s, best):
                best, improved = s, True
                break
            for v, o in zip(group, old):
                place[v] = o
            if time.perf_counter() >= deadline:
                break
    return place, best


def _better(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return a[0] < b[0] - 1e-12 * max(1.0, b[0])
    return a[1] < b[1] - 1e-12 * max(1e-300, abs(b[1]))


def heuristic(
    pb: Problem,
    objective: str | Objective = "makespan",
    *,
    deadline_s: float | None = None,
    budget_s: float | None = None,
    seed: int = 0,
) -> tuple[tuple, list[int]]:
    """A good placement: ``(score, device index per stage)``; see the module docstring."""
    objective = get_objective(objective)
    rng = random.Random(seed)
    scored = [(objective.score(pb, p, deadline_s), p) for p in seeds(pb, objective)]
    best, place = min(scored, key=lambda sp: sp[0])
    stop = time.perf_counter() + (default_budget(pb.n) if budget_s is None else budget_s)
    place, best = local_search(pb, place[:], best, objective, deadline_s, stop, rng)
    idle = 0
    while idle < PATIENCE and time.perf_counter() < stop:
        trial = place[:]
        for v in rng.sample(range(pb.n), k=min(pb.n, rng.randint(2, max(3, pb.n // 3)))):
            trial[v] = rng.choice(pb.allowed[v])
        s = objective.score(pb, trial, deadline_s)
        trial, s = local_search(pb, trial, s, objective, deadline_s, stop, rng)
        if _better(s, best):
            best, place, idle = s, trial, 0
        else:
            idle += 1
            if not _better(best, s):
                place = trial  # as good: drift across the plateau
    return best, place


def polish(pb: Problem, place: list[int], objective: str | Objective,
           deadline_s: float | None) -> list[int]:
    """Among placements as good as ``place``, prefer less work: move a stage where it
    takes less compute plus copy time whenever the objective does not get worse."""
    objective = get_objective(objective)
    place = place[:]
    value = objective.score(pb, place, deadline_s)
    for v in range(pb.n):
        d = place[v]
        here = pb.time[v][d] + copies_around(pb, place, v, d)
        for e in sorted(pb.allowed[v], key=lambda e: pb.time[v][e]):
            if e == d or pb.time[v][e] + copies_around(pb, place, v, e) >= here:
                continue
            place[v] = e
            s = objective.score(pb, place, deadline_s)
            if not _better(value, s):
                value, d = s, e
                here = pb.time[v][e] + copies_around(pb, place, v, e)
            else:
                place[v] = d
    return place
