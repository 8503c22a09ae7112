"""Why each stage runs where it does: reasons, copy accounting, baselines, crossover sizes.

May import: placer.devices (kind titles), placer.optimize.{costs,problem,simulate}; placer.optimize.objectives only for
type hints (it imports the wording helpers here). Never torch, dask or numba.

A reason compares the chosen device with the best other device the stage could
use, holding every other stage where the plan put it; placements whose predicted
intervals overlap are ties (:func:`ties`: a time's uncertainty is a factor, never a number
of seconds), decided by the tie-break rule (fewer copies, then the CPU) only within
:data:`TIE_CAP` of the fastest; the objective may give a
reason of its own first (:meth:`Objective.reason
<placer.optimize.objectives.Objective.reason>`) and names what a move would
worsen. Text never calls the simulated test device (kind ``sim``) a GPU.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from placer.devices import get_kind, kinds
from placer.optimize.problem import Problem
from placer.optimize.simulate import makespan, schedule

if TYPE_CHECKING:
    from placer.optimize.objectives import Objective

#: flip every stage and re-score the plan for explanations up to this many stages
FLIP_LIMIT = 100
#: a sub-millisecond time: its predicted speed-up is worded as within the error when the spreads cover it
TINY_S = 1e-3
#: the crossover search spans this factor around the requested size (1,000x in all)
SPAN = 10**1.5
#: relative noise of a cost table without its own (``CostTable.noise``): a hand-written
#: table's times are taken as exact, so nothing ties
TIE_NOISE = 0.0


def device_word(pb: Problem, d: int) -> str:
    """The kind's title (``CPU``, ``GPU``, ``simulated test device``, ...), with the device's name
    when the table has several devices of that kind (``GPU gpu:1``)."""
    kind = pb.kinds[d]
    title = get_kind(kind).title if kind in kinds() else kind
    same = [i for i, k in enumerate(pb.kinds) if k == kind]
    return title if len(same) == 1 or kind == "cpu" else f"{title} {pb.devices[d]}"


def fmt_s(s: float) -> str:
    """Seconds as ``12 us``, ``0.4 ms``, ``1.2 s`` or ``3.5 min``."""
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    return f"{s / 60:.3g} min"


def fmt_ratio(r: float) -> str:
    """``31×``, ``1.4×``."""
    return f"{r:.0f}×" if r >= 10 else f"{r:.2g}×"


def fmt_money(x: float) -> str:
    return f"${x:.3g}"


def copies_in(pb: Problem, place: list[int], v: int) -> float:
    """Seconds of copies that bring ``v``'s inputs (and external input) to its device."""
    lv = pb.loc[place[v]]
    s = pb.ext_h2d[v] if lv else 0.0
    return s + sum(pb.tr(u, pb.loc[place[u]], lv) for u in pb.preds[v])


def copies_out(pb: Problem, place: list[int], v: int) -> float:
    """Seconds of the copies of ``v``'s output (once per destination location)."""
    loc = pb.loc
    lv = loc[place[v]]
    succs = pb.succs[v]
    dests = {loc[place[w]] for w in succs} if succs else {0}
    dests.discard(lv)
    if not dests:
        return 0
    tr = pb.tr
    return sum(tr(v, lv, lw) for lw in dests)


def copies_around(pb: Problem, place: list[int], v: int, d: int) -> float:
    """Total copy seconds of ``v``'s data and its producers' data with ``v`` on ``d``."""
    old, place[v] = place[v], d
    lv = pb.loc[d]
    total = (pb.ext_h2d[v] if lv else 0.0) + copies_out(pb, place, v)
    total += sum(copies_out(pb, place, u) for u in pb.preds[v])
    place[v] = old
    return total


def flip_values(pb: Problem, place: list[int], score: Callable) -> list[dict[int, float]]:
    """For each stage, the objective with it alone moved to each other allowed device."""
    out = []
    for v in range(pb.n):
        row = {}
        for d in pb.allowed[v]:
            if d != place[v]:
                old, place[v] = place[v], d
                row[d] = score(place)
                place[v] = old
        out.append(row)
    return out


def reason(
    pb: Problem,
    place: list[int],
    v: int,
    *,
    objective: Objective,
    value: float,
    flips: dict[int, float] | None,
    at: str,
    loop_carried: bool,
    pinned: bool,
    blocked: dict[str, str],
    around: dict[int, float] | None = None,
    spread: list[float] | None = None,
) -> str:
    """One plain sentence: why stage ``v`` runs on ``place[v]`` (under ``objective``, worth ``value``).

    ``around`` (device -> :func:`copies_around` of ``v`` there) saves recomputing those
    a caller already has; missing devices are computed. ``spread`` (device -> factor,
    :func:`spread_factors`' row for ``v``): where both times are below :data:`TINY_S` and
    their ratio is within the factors, the sentence says the choice is within the error.
    """
    d = place[v]
    here, tc = device_word(pb, d), pb.time[v][d]
    others = [e for e in range(len(pb.devices)) if e != d and pb.devices[e] not in blocked]
    if not others:
        if pinned:
            return f"pinned to {here}"
        if not blocked:
            return f"the {here} is the only device"
        return f"only the {here} can run it: {'; '.join(blocked.values())}"
    alt = min(others, key=lambda e: pb.time[v][e])
    there, ta = device_word(pb, alt), pb.time[v][alt]
    if pinned:
        return f"pinned to {here} ({there} would take {fmt_s(ta)} instead of {fmt_s(tc)})"
    around = {} if around is None else around
    for e in (alt, d):
        if e not in around:
            around[e] = copies_around(pb, place, v, e)
    saved = around[alt] - around[d]
    own = objective.reason(pb, place, v, alt, flips, value)
    if own is not None:
        return own
    if tc < ta:
        ratio = fmt_ratio(ta / tc) if tc > 0 else "much"
        head = (f"loop-carried stage: {ratio} slower on {there}" if loop_carried
                else f"{here} is {ratio} faster than {there}{at}")
        if spread is not None and ta < TINY_S and tc > 0 and ta / tc <= spread[d] * spread[alt]:
            head = (f"{here} is predicted {ratio} faster than {there}{at}, within the error of predictions "
                    f"this small (±{spread[d] * spread[alt] - 1:.0%}): a close call, not a promised speed-up")
        cin = copies_in(pb, place, v)
        if cin > 0:
            return f"{head}; the copy in costs {fmt_s(cin)}"
        if saved > 0:
            return f"{head}, and staying here avoids {fmt_s(saved)} of copies"
        return head
    if tc == ta:
        tail = f"; staying here avoids {fmt_s(saved)} of copies" if saved > 0 else ""
        return f"as fast on {here} as on {there}{at}{tail}"
    ratio = fmt_ratio(tc / ta) if ta > 0 else "much"
    gain = tc - ta
    if saved >= gain:
        return (f"{there} is {ratio} faster{at}, but the copies it needs would cost "
                f"{fmt_s(saved)}, more than the {fmt_s(gain)} it saves")
    flip = None if flips is None else flips.get(alt)
    if flip is not None and flip > value:
        return (f"{there} is {ratio} faster{at} but busy with other stages; moving this "
                f"stage there would make the {objective.what} {objective.worse_by(flip - value)}")
    if flip is not None:
        return (f"{there} is {ratio} faster{at}, but moving only this stage there would "
                f"not improve the {objective.what}")
    return (f"{there} is {ratio} faster{at}, but keeping it here lets it overlap with "
            "the stages placed there")


def baselines(pb: Problem) -> dict[str, list[int] | None]:
    """All-CPU, all on the first accelerator, and the rule of thumb (None when impossible).

    ``pb`` must be compiled without pins. The rule of thumb puts cleaning,
    preprocessing and other stages on the CPU and training and inference on the first
    accelerator; a stage that cannot run on its rule's device goes to the other.
    """
    acc = next((d for d in range(len(pb.devices)) if pb.loc[d]), None)
    out: dict[str, list[int] | None] = {}
    out["all_cpu"] = [pb.cpu] * pb.n if all(pb.cpu in al for al in pb.allowed) else None
    if acc is None or not all(acc in al for al in pb.allowed):
        out["all_gpu"] = None
    else:
        out["all_gpu"] = [acc] * pb.n
    rule = []
    for v, al in enumerate(pb.allowed):
        want = acc if (acc is not None and pb.kind[v] in ("training", "inference")) else pb.cpu
        other = acc if want == pb.cpu else pb.cpu
        rule.append(want if want in al else other if other in al else None)
    out["rule_of_thumb"] = None if None in rule else rule
    return out


def baseline_makespans(pb: Problem) -> dict[str, float | None]:
    """Predicted makespan of each baseline (None when it cannot run)."""
    return {k: (None if p is None else makespan(pb, p)) for k, p in baselines(pb).items()}


def crossovers(
    devices_at: Callable[[float], dict[str, str]],
    size: float,
    chosen: dict[str, str],
    *,
    steps: int = 4,
) -> dict[str, float | None]:
    """The size nearest ``size`` (within ``SPAN`` either way) where each stage's device changes.

    ``devices_at(s)`` returns the whole plan's placement at size ``s``, or None where
    no plan is feasible (the search in that direction stops there). The grid has
    four points per decade; each change found is refined by ``steps`` bisections in
    log size. Stages whose device never changes in the range get None.
    """
    cache: dict[float, dict[str, str] | None] = {}

    def at(s: float) -> dict[str, str] | None:
        if s not in cache:
            cache[s] = devices_at(s)
        return cache[s]

    grid = [size * 10 ** (k / 4) for k in range(1, 7)]
    out: dict[str, float | None] = {}
    for name, dev in chosen.items():
        found = []
        for direction in (grid, [size * size / g for g in grid]):
            prev = size
            for s in direction:
                here = at(s)
                if here is None:
                    break
                if here[name] != dev:
                    found.append(_refine(at, name, dev, prev, s, steps))
                    break
                prev = s
        out[name] = min(found, key=lambda s: abs(math.log(s / size))) if found else None
    return out


def _refine(at, name, dev, same: float, other: float, steps: int) -> float:
    for _ in range(steps):
        mid = math.sqrt(same * other)
        here = at(mid)
        if here is not None and here[name] == dev:
            same = mid
        else:
            other = mid
    return math.sqrt(same * other)


def spread_factors(pb: Problem) -> list[list[float]]:
    """``k[v][d] >= 1``: the factor by which stage ``v``'s time on device ``d`` may be off beyond the
    noise (``1 + StageCost.uncertainty[d]``: fit forms that disagree, distance from the measured
    sizes, a tiny stage's model error). A time ``t`` is the interval ``[t / k, t * k]``: times are
    positive and their errors are factors, so a spread never makes a time negative or tiny."""
    by_name = {st.name: st for st in pb.table.stages}
    return [[1.0 + by_name[n].uncertainty.get(d, 0.0) for d in pb.devices] for n in pb.names]


def interval_factor(pb: Problem, k: list[list[float]], place: list[int], other: list[int], value: float) -> float:
    """The factor ``W`` of ``place``'s interval ``[value / W, value * W]`` against ``other``.

    Only the stages placed differently count: a stage both placements run on the same device
    moves both alike, so it never separates them. Stage ``v`` of time ``t`` and spread ``k``
    can move the objective by the factor ``1 + (t / value) * (k - 1)`` (all of it when ``v`` is
    the whole critical path, less as it is a smaller share); the stages' factors combine as
    the root of the sum of their squared logarithms. Their spreads come from separate fits of
    separate stages, not known to move together: adding every stage's worst case would treat
    them as one error and let any two placements with uncertain stages tie.
    """
    if value <= 0 or not math.isfinite(value):
        return 1.0
    sq = 0.0
    for v in range(pb.n):
        if place[v] != other[v]:
            t = pb.time[v][place[v]]
            if math.isfinite(t) and t > 0:
                sq += math.log1p(min(1.0, t / value) * (k[v][place[v]] - 1.0)) ** 2
    return math.exp(math.sqrt(sq))


def overlap(pb: Problem, k: list[list[float]], a: list[int], va: float, b: list[int], vb: float,
            noise: float) -> bool:
    """Whether placements ``a`` and ``b`` (objective ``va`` and ``vb``) tie: their intervals
    (:func:`interval_factor`), widened by the noise, overlap."""
    if not (math.isfinite(va) and math.isfinite(vb)) or va <= 0 or vb <= 0:
        return va == vb
    width = math.log1p(noise) + math.log(interval_factor(pb, k, a, b, va)) + math.log(interval_factor(pb, k, b, a, vb))
    return abs(math.log(va / vb)) <= width + 1e-12


def tie_key(pb: Problem, place: list[int]) -> tuple[int, int]:
    """The tie-break's order: fewer copies in the schedule, then more stages on the CPU."""
    return len(schedule(pb, place).transfers), -sum(1 for d in place if pb.loc[d] == 0)


#: the tie rule never chooses a placement predicted more than this factor slower than the fastest
TIE_CAP = 1.1
#: every placement is weighed (not just the searched one's neighbours) up to this many of them
ENUMERATE_LIMIT = 256


def tie_weight(pb: Problem, k: list[list[float]], place: list[int], noise: float, rank: float) -> float:
    """The factor by which the tie rule weighs ``place``'s objective up: ``1 + (w - 1) * rank``.

    ``rank`` (0 to 1) is the placement's place in the tie rule's order (0: fewest copies, most
    stages on the CPU); ``w`` is how far its time may be off, ``(1 + noise)`` times the largest
    spread factor of a stage with a choice, never above :data:`TIE_CAP`. A weight that depends
    only on where stages run (never on their times) keeps the choice monotone: making a stage
    faster on its device never moves it off, and scaling every time leaves the plan as it is.
    """
    spread = max((k[v][d] for v, d in enumerate(place) if len(pb.allowed[v]) > 1), default=1.0)
    return 1.0 + (min(TIE_CAP, (1.0 + noise) * spread) - 1.0) * rank


def _candidates(pb: Problem, place: list[int], score: Callable,
                flips: list[dict[int, float]] | None) -> dict[tuple[int, ...], float]:
    """Every allowed placement when there are at most :data:`ENUMERATE_LIMIT`; else the searched
    placement, the baselines and every single-stage move from it."""
    count = math.prod(len(al) for al in pb.allowed)
    if 0 < count <= ENUMERATE_LIMIT:
        return {p: score(list(p)) for p in itertools.product(*pb.allowed)}
    cands: dict[tuple[int, ...], float] = {tuple(place): score(place)}
    for p in baselines(pb).values():
        if p is not None and all(d in pb.allowed[v] for v, d in enumerate(p)):
            cands.setdefault(tuple(p), score(p))
    for v, row in enumerate(flips or []):
        for d, value in row.items():
            p = list(place)
            p[v] = d
            cands.setdefault(tuple(p), value)
    return cands


def ties(pb: Problem, place: list[int], score: Callable, *, noise: float,
         flips: list[dict[int, float]] | None = None,
         spread: list[list[float]] | None = None) -> tuple[list[int], list[tuple[list[int], float]]]:
    """The placement chosen under the tie rule, and the placements tied with it.

    Candidates: every allowed placement when there are at most :data:`ENUMERATE_LIMIT`, else
    the searched placement, the baselines and every single-stage move (``flips``, as
    :func:`flip_values` computes them). The chosen one minimises the objective weighed by
    :func:`tie_weight`: a placement with fewer copies, then more stages on the CPU, wins over
    a faster one only when that one is faster by less than its own spread and the noise, and
    never by more than :data:`TIE_CAP`. So a placement predicted 1.5x (or even 1.1x) slower
    is never chosen because of a tie, however uncertain the faster one's times are.

    A candidate is reported as tied when its interval overlaps the chosen one's
    (:func:`overlap`, with ``spread`` from :func:`spread_factors`); the chosen one's
    single-stage moves, the baselines and the fastest placement are the ones reported.

    Returns
    -------
    (chosen, others)
        The chosen placement, and ``(placement, value)`` of each placement tied with it.
    """
    k = spread if spread is not None else spread_factors(pb)
    unsure = noise > 0 or any(f > 1.0 for row in k for f in row)
    if not unsure:
        return place, []
    cands = _candidates(pb, place, score, flips)
    cands.setdefault(tuple(place), score(place))
    finite = {p: v for p, v in cands.items() if math.isfinite(v)}
    if not finite:
        return place, []
    keys = {p: tie_key(pb, list(p)) for p in finite}
    order = sorted(set(keys.values()))
    rank = {key: (i / (len(order) - 1) if len(order) > 1 else 0.0) for i, key in enumerate(order)}

    def weighed(p: tuple[int, ...]) -> tuple[float, tuple[int, int], float, tuple[int, ...]]:
        val = finite[p]
        return val * tie_weight(pb, k, list(p), noise, rank[keys[p]]), keys[p], val, p

    chosen = min(finite, key=weighed)
    value = finite[chosen]
    fastest = min(finite, key=lambda p: (finite[p], keys[p]))
    shown: set[tuple[int, ...]] = {fastest}
    for p in baselines(pb).values():
        if p is not None and tuple(p) in finite:
            shown.add(tuple(p))
    for v in range(pb.n):
        for d in pb.allowed[v]:
            p = list(chosen)
            p[v] = d
            if tuple(p) in finite:
                shown.add(tuple(p))
            elif d != chosen[v]:
                val = score(p)
                if math.isfinite(val):
                    finite[tuple(p)] = val
                    keys[tuple(p)] = tie_key(pb, p)
                    shown.add(tuple(p))
    shown.discard(chosen)
    tied = [(list(p), finite[p]) for p in shown
            if overlap(pb, k, list(chosen), value, list(p), finite[p], noise)]
    tied.sort(key=lambda pv: (*keys[tuple(pv[0])], pv[1]))
    return list(chosen), tied
