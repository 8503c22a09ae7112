"""The nodes of a stream: a source, per-batch stages, copies into a device, the step.

May import: placer.pipeline, placer.devices, placer.executor.{stagecall,transfer},
placer.executor.stream.config. Devices are asked through their kind (no device library here).

A stream runs as a chain of nodes in the pipeline's dispatch order (branches of
a stream are serialised per batch; different batches overlap across nodes). A
batch travels as a :class:`Bundle`: the per-batch values computed so far, by stage
and by location, so that a value copied into a device once serves every later
stage there. Each node knows which values it reads, where, and which values no
later node needs (those are dropped, bounding the memory of a batch in flight).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

from placer.devices import Device
from placer.executor.stagecall import call_stage
from placer.executor.stream.config import BatchInfo
from placer.executor.transfer import nbytes, to_location
from placer.pipeline import BATCH_INFO, STATE, Stage


@dataclass(slots=True)
class Bundle:
    """One batch in flight: its position and its per-batch values (stage → location → value)."""

    seq: int
    info: BatchInfo
    values: dict[str, dict[str, Any]]
    #: the first node that works on this bundle (later than 0 when replayed from a cache)
    start: int = 0
    last_of_epoch: bool = False


@dataclass
class NodeStats:
    """Accounting of one node, summed over its workers."""

    busy_s: float = 0.0
    starved_s: float = 0.0
    blocked_s: float = 0.0
    batches: int = 0
    end_s: float = 0.0
    copied_bytes: int = 0


@dataclass
class Node:
    """One node of the chain.

    Attributes
    ----------
    reads : dict
        Argument name → producing stage, for per-batch inputs (read at this node's location).
    consts : dict
        Argument name → the one-shot input's value, already at this node's location.
    moves : list of str
        For a copy node: the per-batch values it copies to ``device``'s location.
    drop : list of str
        Values no later node reads, dropped after this node.
    """

    name: str
    kind: str
    device: Device
    index: int
    stage: Stage | None = None
    reads: dict[str, str] = field(default_factory=dict)
    consts: dict[str, Any] = field(default_factory=dict)
    moves: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    workers: int = 1
    worker_kind: str = "thread"
    stats: NodeStats = field(default_factory=NodeStats)
    takes_info: bool = False
    #: a copy node: stage large copies into a GPU through pinned memory (``StreamConfig.pin_memory``)
    pin: bool = True
    #: for process workers: the pool whose child processes run this stage (set by the runner)
    pool: Any = None
    #: dask workers: consecutive batches each task carries (``StreamConfig.stage_group``)
    group: int = 1

    @property
    def location(self) -> str:
        return self.device.location

    def process(self, b: Bundle) -> Any:
        """This node's work on one bundle: a stage's output, or (copy nodes) the values moved."""
        if self.kind == "copy":
            return self._copy(b)
        inputs = {a: b.values[src][self.location] for a, src in self.reads.items()}
        if self.pool is not None:
            return self.pool(inputs, b.info)
        extra = {BATCH_INFO: b.info} if self.takes_info else None
        return call_stage(self.stage, self.device, {**self.consts, **inputs}, extra=extra)

    def _copy(self, b: Bundle) -> dict[str, Any]:
        moved = {}
        for name in self.moves:
            here = b.values[name]
            src = next(iter(here.values()))
            value, nb, _ = to_location(src, self.device, pin=self.pin)
            self.stats.copied_bytes += nb
            moved[name] = value
        return moved

    def store(self, b: Bundle, out: Any) -> None:
        """Put this node's result into the bundle and drop what no later node reads."""
        if self.kind == "copy":
            for name, v in out.items():
                b.values[name][self.location] = v
        else:
            b.values[self.name] = {self.location: out}
        for name in self.drop:
            b.values.pop(name, None)


def takes(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class StepState:
    """The step's state across batches: a fold's state, or the list of its outputs."""

    def __init__(self, node: Node):
        self.node = node
        st = node.stage
        self.fold = st.init is not None
        self.value: Any = None
        self.outputs: list[Any] = []

    def start(self) -> None:
        if self.fold:
            init = self.node.stage.init
            self.value = init(device=self.node.device.torch_device()) if takes(init, "device") else init()

    def apply(self, b: Bundle) -> None:
        node = self.node
        inputs = {a: b.values[src][node.location] for a, src in node.reads.items()}
        extra = {BATCH_INFO: b.info} if node.takes_info else {}
        if self.fold:
            extra[STATE] = self.value
        out = call_stage(node.stage, node.device, {**node.consts, **inputs}, extra=extra)
        if self.fold:
            if out is not None:
                self.value = out
        else:
            self.outputs.append(out)

    def result(self) -> Any:
        return self.value if self.fold else self.outputs


def leading_len(value: Any) -> int | None:
    """Samples in a batch, or None when the batch does not say.

    The leading dimension of its first array (searched depth-first through dicts,
    tuples and lists, as a collate function nests them); else the length of a list of
    plain items (strings, numbers: a collated text column); else None.
    """
    shaped = _first_shaped(value)
    if shaped is not None:
        return shaped
    if hasattr(value, "iloc"):
        return len(value)
    if isinstance(value, dict) and value:
        return leading_len(next(iter(value.values())))
    if isinstance(value, (tuple, list)) and value:
        if all(not isinstance(v, (tuple, list, dict)) for v in value):
            return len(value)
        return leading_len(value[0])
    return None


def _first_shaped(value: Any, depth: int = 0) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(shape, (int, float)):
        try:
            return int(shape[0]) if len(shape) >= 1 else None
        except TypeError:
            return None
    if depth >= 4:
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for v in items:
        if (n := _first_shaped(v, depth + 1)) is not None:
            return n
    return None


def batch_len(value: Any) -> int:
    """Samples in a batch: :func:`leading_len`, or 1 when the batch does not say."""
    n = leading_len(value)
    return 1 if n is None else n


def bundle_bytes(b: Bundle) -> int:
    return sum(nbytes(v) for here in b.values.values() for v in here.values())


def now() -> float:
    return time.perf_counter()
