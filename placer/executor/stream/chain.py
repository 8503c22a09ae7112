"""Laying a stream out as a chain of nodes: stages in dispatch order, copies where data must move.

May import: placer.pipeline, placer.devices, placer.errors, placer.executor.transfer,
placer.executor.stream.{config,nodes}.

Before a stage whose per-batch inputs are not yet where it runs, a copy node moves
them there (on its own thread, and on a device with queues its own queue, asked of
the device's kind: a CUDA stream on a GPU; so the copy of batch k+1 overlaps the
compute of batch k); a value copied once serves every later
stage at that location. One-shot inputs are moved to each location once per run.

A per-batch CPU stage runs in ``workers`` threads, or with ``worker_kind``
``process`` in as many child processes, one per thread
(:mod:`placer.executor.stream.workers`); the source and the step run in one thread each.
"""

from __future__ import annotations

from typing import Any

from placer.devices import HOST, Device
from placer.errors import PlacerError
from placer.executor.stream.config import StreamConfig
from placer.executor.stream.nodes import Node, takes
from placer.executor.transfer import to_location
from placer.pipeline import BATCH_INFO, Pipeline


def build_nodes(pipeline: Pipeline, members: list[str], devices: dict[str, Device], consts: dict[str, Any],
                config: StreamConfig) -> list[Node]:
    """The chain of nodes of one stream (source first, step last)."""
    stages = pipeline.stages
    inside = set(members)
    src = members[0]
    placed: dict[tuple[str, str], Any] = {}

    def const_at(name: str, device: Device) -> Any:
        key = (name, device.location)
        if key not in placed:
            placed[key] = to_location(consts[name], device)[0]
        return placed[key]

    source = stages[src]
    if config.kind_of(src) == "process":
        raise PlacerError(f"stage {src!r} is the source: it runs in one thread; a Dataset or DataLoader source "
                          "gets worker processes from stage_workers", stage=src)
    nodes = [Node(name=src, kind="source", device=devices[src], index=0, stage=source,
                  consts={a: consts[s] for a, s in source.inputs.items()})]
    avail: dict[str, set[str]] = {src: {HOST}}
    for m in members[1:]:
        st, dev = stages[m], devices[m]
        reads = {a: s for a, s in st.inputs.items() if s in inside}
        need = sorted({s for s in reads.values() if dev.location not in avail[s]})
        if need:
            nodes.append(Node(name=f"{m}:copy", kind="copy", device=dev, index=len(nodes), moves=need,
                              pin=config.pin_memory))
            for s in need:
                avail[s].add(dev.location)
        kind = "step" if st.role == "step" else "batch"
        on_cpu = not dev.is_accelerator
        workers = config.workers_of(m) if on_cpu and kind == "batch" else 1
        worker_kind = _worker_kind(m, kind, dev, config)
        impl = st.impl_for(dev.driver.implementation)
        nodes.append(Node(name=m, kind=kind, device=dev, index=len(nodes), stage=st, reads=reads,
                          consts={a: const_at(s, dev) for a, s in st.inputs.items() if s not in inside},
                          workers=workers, worker_kind=worker_kind, takes_info=takes(impl.fn, BATCH_INFO),
                          group=config.group_of(m) if worker_kind == "dask" else 1))
        avail[m] = {dev.location}
    _plan_drops(nodes)
    return nodes


def _worker_kind(name: str, kind: str, dev: Device, config: StreamConfig) -> str:
    """``process`` for a per-batch CPU stage that asks for it (not in a sequential run); else ``thread``."""
    asked = config.kind_of(name)
    if asked == "thread":
        return "thread"
    if kind != "batch" or dev.is_accelerator:
        what = "the step" if kind == "step" else f"a stage on {dev.name}"
        raise PlacerError(f"stage {name!r}: process workers run per-batch CPU stages only, and {name!r} is "
                          f"{what}; drop it from worker_kind", stage=name)
    return "thread" if config.sequential else asked


def _plan_drops(nodes: list[Node]) -> None:
    """Drop each per-batch value after the last node that reads or copies it."""
    last: dict[str, int] = {}
    for n in nodes:
        for s in [*n.reads.values(), *n.moves]:
            last[s] = n.index
    for name, i in last.items():
        if nodes[i].kind != "step":
            nodes[i].drop.append(name)
