"""Streams inside a run: each stream runs as one task of the engine, from its one-shot inputs to its step.

May import: placer.pipeline, placer.devices, placer.data.run, placer.executor.stream.{config,runner}.

The engine schedules one-shot stages; a stream (its source, per-batch stages and
step) becomes one task named after its step, on the host, whose inputs are the
stream's one-shot inputs and whose output is the step's result (on the host).
Inside it :class:`~placer.executor.stream.runner.StreamRun` runs every member on its own device.
After the run its record is replaced by one record per member, with the
member's busy, starved and blocked seconds and workers.
"""

from __future__ import annotations

from typing import Any

from placer.data.run import StageRecord, StreamStats
from placer.devices import Device
from placer.pipeline import Impl, Pipeline, Stage
from placer.executor.stream.config import StreamConfig
from placer.executor.stream.runner import StreamRun


class StreamTask:
    """The engine's callable for one stream: runs it and keeps its statistics in ``sink``."""

    def __init__(self, pipeline: Pipeline, source: str, devices: dict[str, Device], config: StreamConfig,
                 sink: list[StreamStats], stage_timeout: float | None = None):
        self.pipeline, self.source, self.devices, self.config, self.sink = pipeline, source, devices, config, sink
        self.stage_timeout = stage_timeout

    def __call__(self, **consts: Any) -> Any:
        result, stats = StreamRun(self.pipeline, self.source, self.devices, consts, self.config,
                                  stage_timeout=self.stage_timeout).run()
        self.sink.append(stats)
        return result


def collapse(p: Pipeline, devices: dict[str, Device], config: StreamConfig, cpu: Device,
             sink: list[StreamStats], stage_timeout: float | None = None) -> tuple[Pipeline, dict[str, Device]]:
    """The pipeline the engine runs: every stream replaced by one task named after its step
    (``stage_timeout`` bounds each call of a stream's stage, one batch)."""
    streams = p.streams()
    if not streams:
        return p, devices
    member = {m: src for src, ms in streams.items() for m in ms}
    steps = {ms[-1]: src for src, ms in streams.items()}
    out = Pipeline(p.name, size=p.size, size_unit=p.size_unit)
    placed: dict[str, Device] = {}
    for n in p.order():
        st = p.stages[n]
        if n in steps:
            src = steps[n]
            ext = sorted({s for m in streams[src] for s in p.stages[m].inputs.values() if s not in member})
            task = StreamTask(p, src, {m: devices[m] for m in streams[src]}, config, sink, stage_timeout)
            out.add(Stage(name=n, kind=st.kind, cpu=Impl(fn=task, api="any"), inputs={s: s for s in ext}))
            placed[n] = cpu
        elif n not in member:
            out.add(st)
            placed[n] = devices[n]
    out.validate()
    return out, placed


def member_records(rec: StageRecord, stats: StreamStats) -> list[StageRecord]:
    """One record per node of a finished stream, in the place of the engine's record of the whole stream."""
    out = []
    for s in stats.stages:
        if s.kind == "copy":
            continue
        out.append(StageRecord(
            name=s.name, device=s.device, lane="stream", start_s=rec.start_s,
            end_s=rec.start_s + min(s.wall_s, rec.seconds), seconds=s.busy_s, worker=rec.worker,
            busy_s=s.busy_s, starved_s=s.starved_s, blocked_s=s.blocked_s, workers=s.workers,
            worker_kind=s.worker_kind))
    return out
