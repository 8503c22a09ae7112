"""The dispatch rule: which ready task starts next, where, and where its output goes.

May import: the standard library only. Never another placer module.

This module is the one statement of the rules of ``docs/schedule.md`` that decide
*what happens next*; the optimizer's simulator (:mod:`placer.optimize.simulate`) and
the executor's engine (:mod:`placer.executor.engine`) both follow them through it.
What things cost (stage seconds, copy seconds) is not decided here.

- **Priority** (:func:`dispatch_order`): tasks are numbered in topological order,
  ties broken by position in the table or pipeline declaration; lower is more urgent.
- **Dispatch** (:class:`ReadyQueues`): whenever a lane has a free slot, its ready task
  with the lowest priority number starts there. Nothing is preempted.
- **Same instant**: every completion and arrival of one instant is handed to the
  queues (:meth:`ReadyQueues.release`, :meth:`ReadyQueues.push`) before the
  instant's dispatch (:meth:`ReadyQueues.pop_startable`); a task that takes no time
  completes in a later round at the same instant.
- **Copies** (:func:`copy_targets`): a finished task's output is copied at once to
  every other location among its consumers' (and home, for a sink away from home),
  once per location.

Examples
--------
>>> dispatch_order(["c", "a", "b"], {"c": ["b"], "a": [], "b": []})
['a', 'b', 'c']
>>> q = ReadyQueues({"cpu": 1, "gpu": 1})
>>> for task, lane, prio in [("x", "cpu", 2), ("y", "cpu", 0), ("z", "gpu", 1)]:
...     q.push(task, lane, prio)
>>> q.pop_startable()  # one slot each: the best of each lane
[('cpu', 'y'), ('gpu', 'z')]
>>> q.pop_startable()  # nothing is free
[]
>>> q.release("cpu")  # y finished
>>> q.pop_startable()
[('cpu', 'x')]
>>> copy_targets("gpu", ["host", "gpu", "host"], sink=False, home="host")
['host']
>>> copy_targets("gpu", [], sink=True, home="host")
['host']
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import Any


def dispatch_order(names: Sequence[str], inputs: Mapping[str, Iterable[str]]) -> list[str]:
    """Task names by dispatch priority: topological order, ties by position in ``names``.

    The same order as ``networkx.lexicographical_topological_sort(graph, key=position)``.

    Parameters
    ----------
    names : sequence of str
        Every task, in table or declaration order.
    inputs : mapping
        Task -> the tasks whose outputs it reads (missing: none).

    Raises
    ------
    ValueError
        When the inputs form a cycle or name an unknown task.
    """
    pos = {n: i for i, n in enumerate(names)}
    consumers: dict[str, list[str]] = {n: [] for n in names}
    missing = dict.fromkeys(names, 0)
    for n in names:
        for src in set(inputs.get(n, ())):
            if src not in pos:
                raise ValueError(f"task {n!r} reads {src!r}, which is not a task")
            consumers[src].append(n)
            missing[n] += 1
    heap = [pos[n] for n in names if not missing[n]]
    heapify(heap)
    order = []
    while heap:
        n = names[heappop(heap)]
        order.append(n)
        for c in consumers[n]:
            missing[c] -= 1
            if not missing[c]:
                heappush(heap, pos[c])
    if len(order) < len(names):
        stuck = [n for n in names if missing[n]]
        raise ValueError(f"the tasks {', '.join(stuck)} form a cycle")
    return order


class ReadyQueues:
    """Ready tasks of each lane by priority, and each lane's free slots.

    Parameters
    ----------
    slots : mapping
        Lane -> how many tasks it runs at once. Lanes are dispatched in this order.

    Notes
    -----
    A user pushes each task when it becomes ready and releases its lane's slot when
    it completes; once every event of an instant is in, :meth:`pop_startable` is
    that instant's dispatch.
    """

    __slots__ = ("free", "_lanes", "_ready")

    def __init__(self, slots: Mapping[Hashable, int]):
        #: lane -> free slots now
        self.free: dict[Hashable, int] = dict(slots)
        self._lanes = [(lane, []) for lane in slots]
        self._ready: dict[Hashable, list[tuple[int, Any]]] = dict(self._lanes)

    def push(self, task: Any, lane: Hashable, priority: int) -> None:
        """``task`` is ready on ``lane``; a lower ``priority`` starts first."""
        heappush(self._ready[lane], (priority, task))

    def release(self, lane: Hashable) -> None:
        """A task on ``lane`` completed: its slot is free."""
        self.free[lane] += 1

    def copy(self) -> ReadyQueues:
        """An independent copy: the same ready tasks and free slots."""
        other = ReadyQueues.__new__(ReadyQueues)
        other.free = dict(self.free)
        other._lanes = [(lane, heap[:]) for lane, heap in self._lanes]
        other._ready = dict(other._lanes)
        return other

    def pop_startable(self) -> list[tuple[Hashable, Any]]:
        """Take the slots: ``(lane, task)`` for every task that starts now, in dispatch order.

        Lane by lane (in the order given), each lane's ready tasks by priority, as many
        as it has free slots.
        """
        out = []
        free = self.free
        for lane, heap in self._lanes:
            if heap and free[lane]:
                k = free[lane]
                while heap and k:
                    out.append((lane, heappop(heap)[1]))
                    k -= 1
                free[lane] = k
        return out


def copy_targets(here: Hashable, consumers: Iterable[Hashable], *, sink: bool, home: Hashable) -> list:
    """Where a task's output is copied when it finishes at location ``here``.

    One copy per distinct location among ``consumers`` (each consumer's location)
    other than ``here``, plus ``home`` for a sink that is not there; sorted.
    """
    to = set(consumers)
    if sink:
        to.add(home)
    to.discard(here)
    return sorted(to)
