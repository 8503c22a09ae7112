"""One device sweep of a stream (:class:`Sweep`) and what the profiler's steps share (:class:`Profiler`).

May import: numpy, networkx, placer.pipeline, placer.devices, placer.errors, placer.log, placer.data.stream,
placer.executor (one-shot inputs), placer.executor.transfer, placer.executor.stream.*, placer.profile.transfers,
placer.timing.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import networkx as nx

from placer.devices import HOST, Inventory, host_device, same_device
from placer.log import get_logger
from placer.profile.transfers import value_copies
from placer.timing import Clock, Deadline, Measurement, Timings
from placer.executor.transfer import nbytes, to_location
from placer.pipeline import Pipeline
from placer.executor.stream.config import StreamConfig
from placer.executor.stream.nodes import Bundle, Node, batch_len
from placer.executor.stream.runner import StreamRun


log = get_logger(__name__)


#: a sweep whose members' in-turn seconds scatter reads on, up to this many times its batches (within its
#: budget), until the standard error of their summed mean is within IN_TURN_ERROR of it
MORE_BATCHES = 3
IN_TURN_ERROR = 0.04


#: the step's last batches kept for re-running it (GIL probe, torch threads)
STEP_KEPT = 3
#: a leading batch this many times the median in a sweep is warm-up (left out of the mean in turn)
WARM_UP = 1.5
HOST_DEVICE = host_device()


def one_shot_inputs(pipeline: Pipeline, source: str, inventory: Inventory) -> dict[str, Any]:
    """The outputs (on the host) of the one-shot stages a stream reads, computed once."""
    from placer.executor import execute

    members = set(pipeline.streams()[source])
    need: set[str] = set()
    for m in members:
        need |= {a for a in nx.ancestors(pipeline.graph, m) if a not in members}
    if not need:
        return {}
    sub = Pipeline(pipeline.name, size=pipeline.size, size_unit=pipeline.size_unit)
    for n in pipeline.order():
        if n in need:
            sub.add(pipeline.stages[n])
    accel = [d.name for d in inventory.devices if d.is_accelerator]
    placement = {n: runnable(pipeline, n, ["cpu", *accel]) for n in need}
    run = execute(sub, placement, inventory=inventory)
    return {n: to_location(run.outputs[n], HOST_DEVICE)[0] for n in need}


def runnable(pipeline: Pipeline, name: str, prefer: list[str]) -> str:
    """The first device of ``prefer`` the stage may run on (its pin wins)."""
    st = pipeline.stages[name]
    if st.pin is not None:
        return st.pin
    for d in prefer:
        if st.impl_for("cpu" if d == "cpu" else "gpu") is not None:
            return d
    return prefer[0]


def can_run(pipeline: Pipeline, name: str, device: str) -> bool:
    """Whether a member may be placed on ``device``: an implementation for it, and no pin elsewhere."""
    st = pipeline.stages[name]
    if st.role == "source":
        return device == "cpu"
    if st.pin is not None and not same_device(st.pin.strip().lower(), device):
        return False
    return st.impl_for("cpu" if device == "cpu" else "gpu") is not None


def placements(pipeline: Pipeline, members: list[str], devices: list[str]) -> dict[str, dict[str, str]]:
    """A sweep's placement per device: each member on that device when it can run there."""
    out = {}
    for d in devices:
        place = {m: (d if can_run(pipeline, m, d) else runnable(pipeline, m, ["cpu", *devices]))
                 for m in members}
        if d == "cpu" or any(v == d for v in place.values()):
            out[d] = place
    return out


def in_turn_batches(seconds: list[float]) -> list[float]:
    """A member's seconds per batch in turn without its leading warm-up (:func:`in_turn_mean`)."""
    med = statistics.median(seconds)
    k = 0
    while k < len(seconds) - 1 and seconds[k] > WARM_UP * med:
        k += 1
    return seconds[k:]


def in_turn_mean(seconds: list[float]) -> float:
    """The mean of a member's seconds per batch in turn, its leading warm-up left out: the batches at
    the start slower than :data:`WARM_UP` times the median (the whole run pays them once, while a
    sweep of a few batches spreads them over each: a step's first calls of 1.9 and 1.4 ms against
    0.7 ms after lifted the mean of 7 batches by 40 %). Slow batches later on stay in.

    >>> round(in_turn_mean([1.9, 1.4, 0.8, 0.7, 0.7, 0.7, 0.6]), 2)
    0.7
    >>> in_turn_mean([1.0, 3.0, 1.0, 3.0])
    2.0
    """
    kept = in_turn_batches(seconds)
    return sum(kept) / len(kept)


def steady(m: Measurement) -> float:
    """Seconds per batch: the lower quartile after the first batch (warm-up); noise only adds time."""
    log.debug("%s: lower quartile %.4g s, spread (IQR) %.2g s%s", m.label, m.lower_quartile_s, m.iqr_s,
              " (noisy)" if m.noisy else "")
    return m.lower_quartile_s


class Profiler:
    """The state of one stream's profile: devices, sweeps, copies measured."""

    def __init__(self, pipeline: Pipeline, source: str, inventory: Inventory, consts: dict[str, Any],
                 batches: int, max_threads: int | None):
        self.pipeline, self.source, self.inventory, self.consts = pipeline, source, inventory, consts
        self.batches = batches
        self.members = pipeline.streams()[source]
        self.cores = os.cpu_count() or 1
        self.max_threads = max_threads or max(4, min(8, 2 * self.cores))
        self.accel = [d for d in inventory.devices if d.is_accelerator]
        #: (value, from, to) → way of copying → seconds, copy by copy (CPU seconds for the executor's copy)
        self.copies: dict[tuple[str, str, str], Timings] = {}
        self.copy_bytes: dict[tuple[str, str, str], int] = {}
        self.out_bytes: dict[str, dict[str, int]] = {}
        self.notes: list[str] = []

    def observe(self, value_of: str, loc: str, value: Any, index: int) -> None:
        """Record a per-batch value's bytes, and time copying it to every other location."""
        self.out_bytes.setdefault(value_of, {})[loc] = nbytes(value)
        if not self._read_later(value_of) or index >= max(3, self.batches // 2):
            return
        targets = self.accel if loc == HOST else [HOST_DEVICE]
        for dev in targets:
            if dev.location == loc:
                continue
            key = (value_of, loc, dev.location)
            timings = self.copies.setdefault(key, Timings())
            with Clock() as c:
                to_location(value, dev)
                dev.synchronize()
            timings.add("executor", c)
            self.copy_bytes[key] = nbytes(value)
            if loc == "host" and dev.is_gpu:
                for mode, m in value_copies(value, dev).items():
                    timings.add_seconds(mode, m.median_s)

    def _read_later(self, name: str) -> bool:
        return any(name in self.pipeline.stages[m].inputs.values() for m in self.members)


class Sweep:
    """One device sweep: the stream run sequentially, every node and copy timed per batch."""

    def __init__(self, prof: Profiler, device: str, placement: dict[str, str]):
        self.prof, self.device, self.placement = prof, device, placement
        inv = prof.inventory
        self.devices = {m: inv.resolve(d, stage=m) for m, d in placement.items()}
        cfg = StreamConfig(workers=0, max_batches=MORE_BATCHES * prof.batches)
        self.run = StreamRun(prof.pipeline, prof.source, self.devices, prof.consts, cfg)
        #: every member's wall and CPU seconds, batch by batch
        self.timings = Timings()
        self.inputs: dict[str, list[Bundle]] = {}
        self.samples: list[int] = []

    def go(self, budget_s: float | None) -> int:
        run, deadline = self.run, Deadline(budget_s)
        run.step.start()
        it = run.bundles()
        done = 0
        while True:
            with Clock() as c:
                b = next(it, None)
            if b is None:
                break
            self._source_read(run.nodes[0].name, b, c)
            value = b.values[self.prof.source]["host"]
            self.prof.observe(self.prof.source, "host", value, done)
            for node in run.nodes[1:]:
                if node.kind == "step":  # samples as the runner counts them: the step's first per-batch input
                    src = next(iter(node.reads.values()))
                    self.samples.append(batch_len(b.values[src][node.location]))
                self._one(node, b, done)
            done += 1
            if done >= 2 and deadline.passed():
                break
            if done >= self.prof.batches and self.settled():
                break
        return done

    def settled(self) -> bool:
        """Whether the batches so far tell the members' in-turn mean closely enough: the standard error of
        their summed mean (:func:`in_turn_mean`'s batches) within :data:`IN_TURN_ERROR` of it. A step whose
        threads meet spinning ones runs some batches several times slower than the rest (on 2 cores an
        audio step took 12-30 ms, and about 100 ms in 2 to 5 of 15), and how many fell in a short sweep
        moved the prediction of one batch at a time by 30 %; such a sweep reads on, up to
        :data:`MORE_BATCHES` times its batches, within its budget."""
        means, var = 0.0, 0.0
        for m in self.timings.keys():
            if not isinstance(m, str) or m not in self.prof.members:
                continue
            xs = in_turn_batches(self.timings.wall(m).raw_times)
            if len(xs) < 3:
                return False
            means += statistics.fmean(xs)
            var += statistics.variance(xs) / len(xs)
        return means <= 0 or var ** 0.5 <= IN_TURN_ERROR * means

    def _source_read(self, name: str, b: Bundle, c: Clock) -> None:
        """Time one batch's read from the source, as one batch's.

        The runner reads one batch ahead (to know an epoch's last batch): an epoch's first read
        calls the source and reads two batches, its last read only finds the end. Timed as read,
        an epoch of three batches would give one batch in three about nothing, and a lower
        quartile that reading; so the first read counts as two batches of half its time (the
        stream's very first is the warm-up, left out whole), and a last read after others is
        left out (its batch was read with the one before).
        """
        info = b.info
        if b.last_of_epoch and info.index > 0:
            return
        if info.index == 0 and info.seq > 0 and not b.last_of_epoch:
            for _ in range(2):
                self.timings.add_seconds(name, c.wall / 2, c.cpu / 2 if c.cpu is not None else None)
            return
        self.timings.add(name, c)

    def _one(self, node: Node, b: Bundle, index: int) -> None:
        if (node.kind == "batch" and node.device.kind == "cpu") or node.kind == "step":
            kept = self.inputs.setdefault(node.name, [])
            kept.append(Bundle(b.seq, b.info, {k: dict(v) for k, v in b.values.items()}))
            if len(kept) > (STEP_KEPT if node.kind == "step" else self.prof.batches):  # a longer sweep keeps
                kept.pop(0)  # as many as a sweep of its batches
        with Clock() as c:
            self.run.work(node, b)
        if node.kind == "copy":
            return
        self.timings.add(node.name, c)
        if node.kind == "batch":
            self.prof.observe(node.name, node.location, b.values[node.name][node.location], index)
