"""The schedule model: simulate a placement and return its events and makespan.

May import: pydantic, placer.schedule, placer.data, placer.devices (name aliases), placer.errors,
placer.optimize.problem. Never torch, dask or numba.

The model (``docs/schedule.md`` is the full contract shared with the executor;
which ready stage starts next, and where outputs are copied, is decided by
:mod:`placer.schedule`, which the executor follows too):

- A stage is ready on device D once every input is at D's location; external
  input starts on the host and, for a stage on an accelerator, is copied there
  from t=0.
- Whenever a slot of D is free, the ready stage for D with the best dispatch
  priority starts (topological order, ties by table position). The CPU has
  ``workers`` slots; each accelerator has one. At one instant, every completion is
  processed before any dispatch.
- When a stage finishes, one copy of its output starts at once to every other
  location among its consumers' devices (and to the host if it is a sink on an
  accelerator). Copies take ``latency_s + bytes / bandwidth_Bps`` and do not
  contend with each other or with compute (an optimistic simplification).
- With a ``network`` in the table (each device on its own worker of a cluster),
  every copy between two locations, a sink's copy home included, also takes the
  network's ``latency_s + bytes / bandwidth_Bps``, once.
- The makespan is the time every sink's output is on the host.

Examples
--------
>>> from placer.data.cost_table import CostTable
>>> t = CostTable.model_validate({
...     "devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}},
...     "link": {"h2d": {"latency_s": 0.0, "bandwidth_Bps": 1e9},
...              "d2h": {"latency_s": 0.0, "bandwidth_Bps": 1e9}},
...     "stages": [{"name": "a", "output_bytes": 1e9, "seconds": {"cpu": 1.0}},
...                {"name": "b", "inputs": ["a"], "output_bytes": 1e9,
...                 "seconds": {"cpu": 5.0, "gpu": 1.0}}]})
>>> simulate(t, {"a": "cpu", "b": "gpu"}).makespan_s  # 1 + copy 1 + 1 + copy back 1
4.0
"""

from __future__ import annotations

import copy
from heapq import heapify, heappop, heappush

from placer.data.cost_table import CostTable
from placer.data.plan import Schedule, StageEvent, TransferEvent
from placer.devices import same_device
from placer.errors import InfeasibleError
from placer.optimize.problem import Problem
from placer.schedule import ReadyQueues, copy_targets


def makespan(pb: Problem, place: list[int], record: list | None = None) -> float:
    """Simulated makespan of ``place`` (device index per stage, in priority order).

    Dispatch follows :mod:`placer.schedule` (a stage's index is its priority); this
    function adds the clock and what stages and copies cost. With ``record`` (a
    list), appends ``(v, start, end)`` for every stage run, in dispatch order.
    When ``pb`` follows a :class:`Timeline` (``pb.timeline``), a placement near the
    timeline's is re-simulated from where it first differs (the same value).
    """
    if record is None and pb.timeline is not None:
        return pb.timeline.makespan(place)
    return _simulate(pb, place, [pb.loc[d] for d in place], record)


def _start(pb: Problem, loc: list[int]) -> tuple:
    """The simulation's state at t=0: ``(rem, ready, future, running, queues, end, done)``."""
    rem = pb.indeg[:]
    ready = [pb.ext_h2d[v] if loc[v] else 0.0 for v in range(pb.n)]
    future = [(ready[v], v) for v in range(pb.n) if not rem[v]]
    heapify(future)
    return rem, ready, future, [], ReadyQueues(dict(enumerate(pb.slots))), 0.0, 0


def _simulate(pb: Problem, place: list[int], loc: list[int], record: list | None = None,
              state: tuple | None = None, round0: int = 0, saves: list | None = None,
              every: int = 0, finished: list[int] | None = None) -> float:
    """The schedule model's event loop, from ``state`` (default: t=0) at round ``round0``.

    A round is one pass of the loop: one instant's completions, arrivals and dispatch.
    With ``saves``, the state before every ``every``-th round is appended to it as
    ``(round, rem, ready, future, running, queues, end, done)``; with ``finished``,
    ``finished[v]`` is set to the round in which stage ``v`` completed.
    """
    time, succs, h2d, d2h, net = pb.time, pb.succs, pb.h2d, pb.d2h, pb.net
    rem, ready, future, running, queues, end, done = _start(pb, loc) if state is None else state
    push, release = queues.push, queues.release
    n, r = pb.n, round0
    while done < n:
        if running and (not future or running[0][0] <= future[0][0]):
            now = running[0][0]
        else:
            now = future[0][0]
        if every and not r % every:
            saves.append((r, rem[:], ready[:], future[:], running[:], queues.copy(), end, done))
        while running and running[0][0] <= now:  # every completion of the instant
            v = heappop(running)[1]
            release(place[v])
            done += 1
            if finished is not None:
                finished[v] = r
            lv = loc[v]
            if not succs[v]:
                arr = now + d2h[v] if lv else now
                end = arr if arr > end else end
            for w in succs[v]:
                lw = loc[w]
                if lw == lv:
                    arr = now
                elif lv == 0:
                    arr = now + h2d[v]
                elif lw == 0:
                    arr = now + d2h[v]
                else:
                    arr = now + d2h[v] + h2d[v] - net[v]
                if arr > ready[w]:
                    ready[w] = arr
                rem[w] -= 1
                if not rem[w]:
                    heappush(future, (ready[w], w))
        while future and future[0][0] <= now:  # every arrival of the instant
            w = heappop(future)[1]
            push(w, place[w], w)
        for d, v in queues.pop_startable():  # then the instant's dispatch
            f = now + time[v][d]
            heappush(running, (f, v))
            if record is not None:
                record.append((v, now, f))
        r += 1
    return end


class Timeline:
    """One placement simulated with its state saved along the way, to simulate others near it.

    A stage's device is first read when its last producer completes (its input copies
    are then known) or, for a source, at t=0; every round before that is the same for
    any device. :meth:`makespan` of a placement that differs from this one in a few
    stages therefore resumes from the last state saved before the earliest such
    round, with the moved stages' input arrivals recomputed: the value is the full
    simulation's, bit for bit, for a fraction of its work when the moves are late.

    Parameters
    ----------
    pb : Problem
    place : list of int
        The placement to follow (copied).
    saves : int
        About how many states to keep along the way.
    """

    def __init__(self, pb: Problem, place: list[int], saves: int = 32):
        self.pb = pb
        self.place = place[:]
        self.every = max(1, pb.n // saves)
        self._built = False

    def _build(self) -> None:
        pb = self.pb
        self.loc = [pb.loc[d] for d in self.place]
        #: ``(v, start, end)`` of every stage run, in dispatch order
        self.runs: list = []
        self.saved: list = []
        self.finished = [0] * pb.n
        self.span = _simulate(pb, self.place, self.loc, self.runs, saves=self.saved, every=self.every,
                              finished=self.finished)
        self.end = [0.0] * pb.n
        for v, _, f in self.runs:
            self.end[v] = f
        self._built = True

    def record(self) -> list:
        """``(v, start, end)`` of every stage run of the followed placement, in dispatch order."""
        if not self._built:
            self._build()
        return self.runs

    def makespan(self, place: list[int]) -> float:
        """The simulated makespan of ``place``, as :func:`makespan` computes it."""
        if not self._built:
            self._build()
        pb, base = self.pb, self.place
        if place == base:
            return self.span
        moved = [v for v, (d, e) in enumerate(zip(place, base)) if d != e]
        preds, finished = pb.preds, self.finished
        first = min(max([finished[u] for u in preds[v]], default=0) for v in moved)
        loc = [pb.loc[d] for d in place]
        k = min(first // self.every, len(self.saved) - 1)
        if k <= 0:
            return _simulate(pb, place, loc)
        r0, rem, ready, future, running, queues, end, done = self.saved[k]
        ready = ready[:]
        h2d, d2h, net, at = pb.h2d, pb.d2h, pb.net, self.end
        for w in moved:  # the arrivals already counted were counted for the old device
            lw = loc[w]
            t = pb.ext_h2d[w] if lw else 0.0
            for v in preds[w]:
                if finished[v] < r0:
                    now, lv = at[v], loc[v]
                    if lw == lv:
                        arr = now
                    elif lv == 0:
                        arr = now + h2d[v]
                    elif lw == 0:
                        arr = now + d2h[v]
                    else:
                        arr = now + d2h[v] + h2d[v] - net[v]
                    if arr > t:
                        t = arr
            ready[w] = t
        state = (rem[:], ready, future[:], running[:], queues.copy(), end, done)
        return _simulate(pb, place, loc, state=state, round0=r0)


def following(pb: Problem, place: list[int]) -> Problem:
    """``pb`` (shallowly copied) whose :func:`makespan` follows a :class:`Timeline` of ``place``."""
    view = copy.copy(pb)
    view.timeline = Timeline(pb, place)
    return view


def check_placement(pb: Problem, placement: dict[str, str]) -> list[int]:
    """Encode a stage -> device mapping, raising :class:`InfeasibleError` naming the stage."""
    for name in pb.names:
        dev = placement.get(name)
        if dev is None:
            raise InfeasibleError(
                f"stage {name!r} has no device in the placement; add it", stage=name
            )
        if dev not in pb.dev_index and not any(same_device(dev, d) for d in pb.devices):
            raise InfeasibleError(
                f"stage {name!r} is placed on unknown device {dev!r}; use one of "
                f"{', '.join(pb.devices)}",
                stage=name,
            )
    place = pb.encode(placement)
    for v, d in enumerate(place):
        allowed = [pb.devices[e] for e in pb.allowed[v]]
        if pb.devices[d] not in allowed:
            why = pb.blocked[v].get(pb.devices[d], f"it is pinned to {' or '.join(allowed)}")
            raise InfeasibleError(
                f"stage {pb.names[v]!r} cannot run on {pb.devices[d]}: {why}; place it on "
                f"{' or '.join(allowed)}",
                stage=pb.names[v],
            )
    return place


def schedule(pb: Problem, place: list[int]) -> Schedule:
    """The full simulated schedule (stage runs and copies) of an encoded placement."""
    runs: list = []
    span = makespan(pb, place, runs)
    end = {v: f for v, _, f in runs}
    locname = {pb.loc[d]: ("host" if pb.loc[d] == 0 else pb.devices[d]) for d in range(len(pb.devices))}
    stages = [
        StageEvent(name=pb.names[v], device=pb.devices[place[v]], start_s=s, end_s=f)
        for v, s, f in sorted(runs, key=lambda r: (r[1], r[0]))
    ]
    transfers = []
    for v in range(pb.n):
        lv = pb.loc[place[v]]
        if pb.ext[v] > 0 and lv:
            sec = pb.ext_h2d[v]
            transfers.append(TransferEvent(data=pb.names[v], src="host", dst=locname[lv],
                                           bytes=pb.ext[v], start_s=0.0, end_s=sec,
                                           seconds=sec, external=True))
        dests = copy_targets(lv, (pb.loc[place[w]] for w in pb.succs[v]), sink=not pb.succs[v], home=0)
        for lw in dests:
            sec = pb.tr(v, lv, lw)
            transfers.append(TransferEvent(data=pb.names[v], src=locname[lv], dst=locname[lw],
                                           bytes=pb.out[v], start_s=end[v], end_s=end[v] + sec,
                                           seconds=sec))
    transfers.sort(key=lambda t: (t.start_s, t.data, t.dst))
    return Schedule(makespan_s=span, stages=stages, transfers=transfers)


def simulate(costs: CostTable, placement: dict[str, str]) -> Schedule:
    """Simulate a placement (stage -> device name) of a cost table.

    Pins are not enforced here (so that baselines can be simulated); implementations
    and memory are.

    Raises
    ------
    InfeasibleError
        A stage is missing from the placement, or placed where it cannot run.
    """
    pb = Problem(costs, pins=False)
    return schedule(pb, check_placement(pb, placement))
