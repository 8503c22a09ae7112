"""What a placement is scored by: one small object per objective, kept in a registry by name.

May import: placer.errors, placer.optimize.{problem,simulate,explain}. Never torch, dask or numba.

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

An objective is an :class:`Objective`: its value (:meth:`~Objective.evaluate`), a
lower bound for branch and bound (:meth:`~Objective.bound`), hooks for the
heuristic search and its wording. The searches, the explanations and the command
line look it up by name with :func:`get_objective`; a new objective is a subclass
passed to :func:`register`, and nothing else changes.

Examples
--------
>>> get_objective("throughput").format(0.25)
'250 ms per batch'
>>> names()
('makespan', 'throughput', 'cost')
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Protocol

from placer.errors import PlacerError
from placer.optimize.explain import device_word, fmt_money, fmt_s
from placer.optimize.problem import INF, Problem
from placer.optimize.simulate import makespan

#: relative slack when comparing a makespan with a deadline (float noise only)
DEADLINE_RTOL = 1e-9


class UnknownObjectiveError(PlacerError, ValueError):
    """No objective is registered under the name; the message lists the known ones."""


class Partial(Protocol):
    """A partial placement during branch and bound, as :meth:`Objective.bound` sees it.

    Stages are placed in dispatch priority, so ``place[:placed]`` holds the device
    of every producer of a placed stage.
    """

    pb: Problem
    #: device index per stage; only the first ``placed`` entries are decided
    place: list[int]
    placed: int
    #: the :func:`loads` of the placed stages and of the copies between them so far
    load: list[float]
    #: money of the placed stages (:func:`money` over them)
    spent: float
    deadline_s: float | None

    def span_bound(self) -> float:
        """A lower bound on the makespan of every completion."""

    def cheapest_rest(self) -> float:
        """The least money the stages not yet placed can cost."""


class Objective(ABC):
    """What a placement is scored by; smaller values are better.

    Attributes
    ----------
    name : str
        The key in the registry, the ``--objective`` value and the ``objective`` of a plan.
    what : str
        What the value measures, in a sentence ("the *time per batch* ...").
    unit : str
        The value's unit ("s per run").
    chain_dp : bool
        Whether the chain dynamic program (which minimises makespan) finds this
        objective's optimum on a chain.
    critical_first : bool
        Whether the local search tries stages on the critical path first.
    """

    name: str = ""
    what: str = ""
    unit: str = ""
    chain_dp: bool = False
    critical_first: bool = True

    @abstractmethod
    def evaluate(self, pb: Problem, place: list[int], deadline_s: float | None = None) -> float:
        """The value of a placement (``inf`` when it is infeasible, e.g. misses a deadline)."""

    @abstractmethod
    def bound(self, partial: Partial) -> float:
        """A lower bound on the value of every completion of ``partial``.

        Branch and bound prunes a partial placement whose bound is not below the
        best value found; a bound above some completion's value loses optima.
        """

    def search_value(self, partial: Partial) -> float:
        """The value of a complete placement during branch and bound."""
        return self.evaluate(partial.pb, partial.place, partial.deadline_s)

    def score(self, pb: Problem, place: list[int], deadline_s: float | None) -> tuple[float, float]:
        """The heuristic's ``(deadline excess, value)``: compared in that order, smaller is better."""
        return (0.0, self.evaluate(pb, place, deadline_s))

    def seeds(self, pb: Problem) -> list[list[int]]:
        """Starting placements for the heuristic besides the general ones."""
        return []

    def format(self, value: float) -> str:
        """The value with its unit (``1.23 s per run``)."""
        return f"{value:.4g} {self.unit}"

    def worse_by(self, delta: float) -> str:
        """How much worse a value is, to end "would make the {what} ..." (``12 ms longer``)."""
        return f"{self.format(delta)} more"

    def reason(self, pb: Problem, place: list[int], v: int, alt: int,
               flips: dict[int, float] | None, value: float) -> str | None:
        """A reason of this objective's own for stage ``v`` on ``place[v]`` rather than ``alt``.

        None (the default) leaves the reason to the general comparison of times.
        """
        return None

    def summary(self, plan: Any) -> str | None:
        """The line that reports a :class:`~placer.optimize.plan.Plan`'s value; None: no line."""
        return f"{self.what}: {self.format(plan.objective_value)}"


class Makespan(Objective):
    """The simulated time of one run."""

    name, what, unit = "makespan", "run", "s per run"
    chain_dp = True

    def evaluate(self, pb, place, deadline_s=None):
        return makespan(pb, place)

    def bound(self, partial):
        return partial.span_bound()

    def format(self, value):
        return f"{fmt_s(value)} per run"

    def worse_by(self, delta):
        return f"{fmt_s(delta)} longer"

    def summary(self, plan):
        return None  # the plan's title gives the makespan


class Throughput(Objective):
    """The busiest resource's seconds per batch of a stream."""

    name, what, unit = "throughput", "time per batch", "s per batch"
    critical_first = False

    def evaluate(self, pb, place, deadline_s=None):
        return period(pb, place)

    def bound(self, partial):
        return max(partial.load)  # loads only grow

    def search_value(self, partial):
        return max(partial.load)

    def seeds(self, pb):
        return [balance(pb)]

    def format(self, value):
        return f"{fmt_s(value)} per batch"

    def worse_by(self, delta):
        return f"{fmt_s(delta)} longer"

    def summary(self, plan):
        return f"time per batch (busiest resource): {fmt_s(plan.predicted_period_s)}"


class Cost(Objective):
    """Money per run, under a makespan deadline when one is given."""

    name, what, unit = "cost", "cost per run", "$ per run"

    def evaluate(self, pb, place, deadline_s=None):
        if deadline_s is not None and makespan(pb, place) > deadline_s * (1 + DEADLINE_RTOL):
            return math.inf
        return money(pb, place)

    def bound(self, partial):
        if partial.deadline_s is not None and (
            partial.span_bound() > partial.deadline_s * (1 + DEADLINE_RTOL)
        ):
            return INF
        return partial.spent + partial.cheapest_rest()

    def score(self, pb, place, deadline_s):
        if deadline_s is None:
            return (0.0, money(pb, place))
        return (max(0.0, makespan(pb, place) - deadline_s), money(pb, place))

    def seeds(self, pb):
        return [[min(al, key=lambda d: stage_money(pb, v, d)) for v, al in enumerate(pb.allowed)]]

    def format(self, value):
        return f"{fmt_money(value)} per run"

    def worse_by(self, delta):
        return f"{fmt_money(delta)} higher"

    def reason(self, pb, place, v, alt, flips, value):
        d = place[v]
        if pb.price_s[d] == pb.price_s[alt]:
            return None
        here, there = device_word(pb, d), device_word(pb, alt)
        c_here, c_there = stage_money(pb, v, d), stage_money(pb, v, alt)
        if c_here <= c_there:
            return (f"cheaper on {here}: {fmt_money(c_here)} per run against "
                    f"{fmt_money(c_there)} on {there}")
        flip = None if flips is None else flips.get(alt)
        tail = "" if flip is None or flip < INF else " (that would miss the deadline)"
        return (f"{there} would be cheaper ({fmt_money(c_there)} against {fmt_money(c_here)}) "
                f"but this plan needs the {here} to meet the deadline{tail}")

    def summary(self, plan):
        return f"cost per run: ${plan.predicted_cost:.4g}"


_REGISTRY: dict[str, Objective] = {}


def register(objective: Objective, *, replace: bool = False) -> Objective:
    """Make ``objective`` known by its name; returns it.

    Raises
    ------
    ValueError
        When the name is empty, or taken and ``replace`` is false.
    """
    if not objective.name:
        raise ValueError(f"{type(objective).__name__} has no name")
    if objective.name in _REGISTRY and not replace:
        raise ValueError(f"an objective named {objective.name!r} is already registered")
    _REGISTRY[objective.name] = objective
    return objective


def unregister(name: str) -> Objective:
    """Forget the objective named ``name``; returns it."""
    get_objective(name)
    return _REGISTRY.pop(name)


def names() -> tuple[str, ...]:
    """The registered objectives' names, in registration order."""
    return tuple(_REGISTRY)


def known(last: str = "or") -> str:
    """The names as a list for a message: ``makespan, throughput or cost``."""
    *head, tail = names()
    return f"{', '.join(head)} {last} {tail}" if head else tail


def get_objective(objective: str | Objective) -> Objective:
    """The objective registered under a name (an :class:`Objective` is returned as it is).

    Raises
    ------
    UnknownObjectiveError
        When no objective has that name; the message lists the known ones.
    """
    if isinstance(objective, Objective):
        return objective
    found = _REGISTRY.get(objective)
    if found is None:
        raise UnknownObjectiveError(f"unknown objective {objective!r}; use one of {', '.join(names())}")
    return found


for _objective in (Makespan(), Throughput(), Cost()):
    register(_objective)


def evaluate(pb: Problem, place: list[int], objective: str | Objective,
             deadline_s: float | None = None) -> float:
    """The objective's value of a placement (``inf`` when it misses the deadline)."""
    return get_objective(objective).evaluate(pb, place, deadline_s)


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


def period(pb: Problem, place: list[int]) -> float:
    """The busiest resource's seconds per batch."""
    return max(loads(pb, place))


def stage_money(pb: Problem, v: int, d: int) -> float:
    """Money stage ``v`` costs on device ``d``: its share of one slot's price."""
    return pb.time[v][d] * pb.price_s[d] / pb.slots[d]


def money(pb: Problem, place: list[int]) -> float:
    """Money per run: each stage's seconds times its slot's price per second."""
    return sum(stage_money(pb, v, d) for v, d in enumerate(place))


def balance(pb: Problem) -> list[int]:
    """Greedy load balance for throughput: biggest stages first, to the least-loaded fit."""
    load = [0.0] * len(pb.devices)
    place = [0] * pb.n
    for v in sorted(range(pb.n), key=lambda v: -min(pb.time[v][d] for d in pb.allowed[v])):
        d = min(pb.allowed[v], key=lambda d: load[d] + pb.time[v][d] / pb.slots[d])
        place[v] = d
        load[d] += pb.time[v][d] / pb.slots[d]
    return place
