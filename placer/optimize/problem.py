"""A cost table compiled to plain lists, indexed by dispatch priority, for fast search.

May import: placer.data.cost_table, placer.devices (device names), placer.schedule (the
dispatch order). Never torch, dask or numba.

Stage ``i`` of a :class:`Problem` is the ``i``-th stage in dispatch priority: the
topological order with ties broken by the stage's position in the table
(:func:`placer.schedule.dispatch_order`, which the executor's engine uses too). Devices are
numbered in table order; location 0 is the host (the CPU's), and accelerator ``k``
has location ``k`` (its own memory).
"""

from __future__ import annotations

import copy
import math

from placer.data.cost_table import CostTable, resolve_pin
from placer.devices import same_device
from placer.schedule import dispatch_order

INF = math.inf


class Problem:
    """Lists the simulator and the searches read (built once per table).

    Attributes
    ----------
    names : list of str
        Stage names in dispatch priority.
    devices, kinds, slots, loc : lists indexed by device
        Name, kind, concurrent slots, and location of each device.
    time : list of list of float
        ``time[v][d]`` seconds of stage ``v`` on device ``d`` (``inf``: cannot run).
    allowed : list of list of int
        Devices stage ``v`` may use (implementation, memory, pin).
    blocked : list of dict
        For each stage, device name -> why it cannot run there.
    pins : list of str or None
        The device each stage is pinned to.
    preds, succs : list of list of int
        Producers and consumers of each stage.
    h2d, d2h : list of float
        Seconds to copy each stage's output to an accelerator, or back to the host;
        with a ``network`` in the table, each includes the network move (``net``).
    net : list of float
        Seconds each stage's output takes to cross the network (0 without one).
        Every copy between two locations crosses it once: an accelerator-to-
        accelerator copy is ``d2h + h2d - net`` (see :meth:`tr`).
    ext_h2d : list of float
        Seconds to copy each stage's external input to an accelerator (0 if none).
    timeline : placer.optimize.simulate.Timeline or None
        When set (on a copy, see :func:`placer.optimize.simulate.following`), the
        simulator re-simulates placements near the timeline's from where they differ.
    """

    timeline = None

    def __init__(self, table: CostTable, *, pins: bool = True):
        self.table = table
        by_name = {st.name: st for st in table.stages}
        self.names = dispatch_order(list(by_name), {n: st.inputs for n, st in by_name.items()})
        self.index = {n: i for i, n in enumerate(self.names)}
        self.n = len(self.names)
        self.devices = list(table.devices)
        self.dev_index = {d: i for i, d in enumerate(self.devices)}
        specs = [table.devices[d] for d in self.devices]
        self.kinds = [s.kind for s in specs]
        self.slots = [s.workers for s in specs]
        self.price_s = [s.price_per_hour / 3600.0 for s in specs]
        acc = 0
        self.loc = []
        for s in specs:
            if s.kind == "cpu":
                self.loc.append(0)
            else:
                acc += 1
                self.loc.append(acc)
        self.cpu = self.loc.index(0)
        self._compile_stages(table, [by_name[n] for n in self.names], pins)

    def _compile_stages(self, table: CostTable, stages: list, pins: bool) -> None:
        link = table.link
        self.out = [st.output_bytes for st in stages]
        self.ext = [st.input_bytes for st in stages]
        self.preds = [[self.index[s] for s in st.inputs] for st in stages]
        self.succs = [[] for _ in stages]
        for v, ps in enumerate(self.preds):
            for u in ps:
                self.succs[u].append(v)
        self.indeg = [len(p) for p in self.preds]
        self.time = []
        for st in stages:
            row = [table.seconds(st, d) for d in self.devices]
            self.time.append([INF if s is None else float(s) for s in row])
        self.blocked = [table.blocked(st) for st in stages]
        self.pins = [None if st.pin is None else resolve_pin(table, st) for st in stages]
        self.raw_time = [row[:] for row in self.time]
        self._restrict(pins)
        if link is None:
            self.h2d = self.d2h = self.ext_h2d = [0.0] * self.n
        else:
            self.h2d = [link.h2d.seconds(b) for b in self.out]
            self.d2h = [link.d2h.seconds(b) for b in self.out]
            self.ext_h2d = [link.h2d.seconds(b) if b > 0 else 0.0 for b in self.ext]
        self.net = [0.0] * self.n
        if table.network is not None and table.accelerators:
            # devices on different workers: every copy of an output crosses the network
            self.net = [table.network.seconds(b) for b in self.out]
            self.h2d = [t + c for t, c in zip(self.h2d, self.net)]
            self.d2h = [t + c for t, c in zip(self.d2h, self.net)]
        self.kind = [st.kind for st in stages]

    def _restrict(self, pins: bool) -> None:
        """Set ``allowed`` and blank the times of devices a stage may not use."""
        self.allowed = []
        for v in range(self.n):
            if pins and self.pins[v] is not None:
                al = [self.dev_index[self.pins[v]]]
            else:
                al = [i for i, d in enumerate(self.devices) if d not in self.blocked[v]]
            self.allowed.append(al)
            self.time[v] = [t if d in al else INF for d, t in enumerate(self.raw_time[v])]

    def without_pins(self) -> Problem:
        """The same problem with every stage free to use any device that can run it."""
        other = copy.copy(self)
        other.time = [row[:] for row in self.raw_time]
        other._restrict(False)
        return other

    def tr(self, v: int, a: int, b: int) -> float:
        """Seconds to copy stage ``v``'s output from location ``a`` to location ``b``.

        Accelerator to accelerator is ``d2h`` then ``h2d``, crossing the network once.
        """
        if a == b:
            return 0.0
        if a == 0:
            return self.h2d[v]
        if b == 0:
            return self.d2h[v]
        return self.d2h[v] + self.h2d[v] - self.net[v]

    def is_chain(self) -> bool:
        """True when the stages form one path (each has at most one producer and consumer)."""
        return all(len(p) <= 1 for p in self.preds) and all(len(s) <= 1 for s in self.succs) and (
            sum(1 for p in self.preds if not p) == 1
        )

    def placement(self, place: list[int]) -> dict[str, str]:
        """Stage name -> device name, in table order."""
        by = {self.names[v]: self.devices[d] for v, d in enumerate(place)}
        return {st.name: by[st.name] for st in self.table.stages}

    def encode(self, placement: dict[str, str]) -> list[int]:
        """The device index of each stage, from a stage -> device-name mapping.

        A name the table spells otherwise (``gpu`` for its ``gpu:0``) means the same device.
        """
        out = []
        for name in self.names:
            dev = placement[name]
            if dev not in self.dev_index:
                dev = next((d for d in self.devices if same_device(d, dev)), dev)
            out.append(self.dev_index[dev])
        return out
