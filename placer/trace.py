"""A run's measured timeline as a Chrome trace (Trace Event Format), for Perfetto and chrome://tracing.

May import: json, placer.data.run, placer.files.

torch users know these files from ``torch.profiler``'s ``export_chrome_trace``: open
one at https://ui.perfetto.dev or in ``chrome://tracing``. :func:`chrome_trace`
turns one or more :class:`~placer.data.run.Run` records into the JSON object form
of the format (``{"traceEvents": [...], "displayTimeUnit": "ms"}``):

- each run is a process (``pid``), named after the pipeline and the run's label
  (``plan``, ``all_cpu``, ...), so a plan and its baselines sit one above the other;
- each lane that ran one-shot stages is a thread (``tid``): one per CPU worker lane
  (``cpu/0``, ``cpu/1``, ...), one per accelerator, and on a cluster one per worker
  and lane; each copy direction between two locations is a thread of its own (a
  link, ``link host → gpu:0``);
- every stage is one complete event (``"ph": "X"``) from its start for its
  duration, with its device, status and output bytes in ``args`` (a stream's
  per-batch stages also carry their busy, starved and blocked seconds and workers);
  every copy is one complete event on its link with its bytes, direction and rate;
- ``ts`` and ``dur`` are microseconds from the run's start; metadata events
  (``"ph": "M"``) name the processes and threads and keep them in order.

A run records a stream's stages over the whole stream (not batch by batch), so a
stream shows as stage-level spans, one track per stage (they overlap in time).

Examples
--------
>>> from placer.data.run import Run, StageRecord
>>> run = Run(pipeline="demo", placement={"a": "cpu"}, executor="inline", workers=1, makespan_s=0.5,
...           stages=[StageRecord(name="a", device="cpu", lane="cpu/0", start_s=0.0, end_s=0.5, seconds=0.5)])
>>> [(e["name"], e["ts"], e["dur"]) for e in chrome_trace(run)["traceEvents"] if e["ph"] == "X"]
[('a', 0.0, 500000.0)]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from placer.data.run import Run
from placer.files import write_text_atomic

US = 1e6  # trace timestamps are microseconds


def _lane_name(lane: str, device: str, worker: str | None) -> str:
    kind, _, index = lane.partition("/")
    where = f"{worker} " if worker else ""
    if kind == "cpu" and index:
        return f"{where}cpu worker {index}"
    return f"{where}{lane if lane == device or not device else f'{lane} ({device})'}"


def _stage_args(s: Any) -> dict[str, Any]:
    args = {"device": s.device, "lane": s.lane, "status": s.status, "output_bytes": s.output_bytes,
            "seconds": s.seconds}
    if s.worker:
        args["worker"] = s.worker
    if s.error:
        args["error"] = s.error
    if s.workers is not None:  # a per-batch stage of a stream: its accounting over the stream
        args.update(workers=s.workers, worker_kind=s.worker_kind, busy_s=s.busy_s, starved_s=s.starved_s,
                    blocked_s=s.blocked_s)
    return args


def _run_events(run: Run, pid: int, label: str | None) -> list[dict[str, Any]]:
    title = f"{run.pipeline}: {label}" if label else run.pipeline
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
         "args": {"name": f"{title} ({run.executor}, makespan {run.makespan_s:.4g} s)"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
    tids: dict[tuple[str, ...], int] = {}

    def tid(key: tuple[str, ...], name: str) -> int:
        if key not in tids:
            tids[key] = len(tids) + 1
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tids[key], "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tids[key],
                           "args": {"sort_index": tids[key]}})
        return tids[key]

    for s in sorted(run.stages, key=lambda r: (r.worker or "", r.lane, r.start_s)):
        if s.workers is not None:  # a stream's stages overlap in time: each gets a track of its own
            t = tid(("stream", s.name), f"stream stage {s.name} ({s.device}, {s.workers} {s.worker_kind or 'thread'} "
                                        f"worker{'s' if s.workers != 1 else ''})")
        else:
            t = tid(("lane", s.worker or "", s.lane), _lane_name(s.lane, s.device, s.worker))
        events.append({"name": s.name, "cat": "stage", "ph": "X", "ts": s.start_s * US,
                       "dur": max(s.end_s - s.start_s, 0.0) * US, "pid": pid, "tid": t, "args": _stage_args(s)})
    for c in sorted(run.transfers, key=lambda r: (r.src, r.dst, r.start_s)):
        t = tid(("link", c.src, c.dst), f"link {c.src} → {c.dst}")
        rate = c.bytes / c.seconds / 1e9 if c.seconds > 0 else None
        events.append({"name": f"copy {c.data}", "cat": "copy", "ph": "X", "ts": c.start_s * US,
                       "dur": max(c.end_s - c.start_s, 0.0) * US, "pid": pid, "tid": t,
                       "args": {"data": c.data, "src": c.src, "dst": c.dst, "direction": c.direction,
                                "bytes": c.bytes, "pinned": c.pinned, "GB_per_s": rate}})
    return events


def chrome_trace(runs: Run | Mapping[str, Run], *, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Trace Event Format document of one run, or of several runs labelled by name.

    Parameters
    ----------
    runs : Run or mapping of str to Run
        One run, or ``{label: run}`` (``{"plan": ..., "all_cpu": ...}``): each run
        becomes a process of the trace, in the mapping's order.
    metadata : mapping, optional
        Extra top-level fields (kept by the viewers, shown in Perfetto's info).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    labelled = {None: runs} if isinstance(runs, Run) else dict(runs)
    events: list[dict[str, Any]] = []
    for pid, (label, run) in enumerate(labelled.items(), start=1):
        events += _run_events(run, pid, label)
    first = next(iter(labelled.values()))
    other = {"pipeline": first.pipeline, "size": first.size, "size_unit": first.size_unit,
             "started_at": first.started_at, "devices": first.devices, **(metadata or {})}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(runs: Run | Mapping[str, Run], path: str | os.PathLike, **metadata: Any) -> str:
    """Write :func:`chrome_trace` of ``runs`` to ``path`` (atomically); return the path.

    Parameters
    ----------
    runs : Run or mapping of str to Run
        See :func:`chrome_trace`.
    path : path
        The ``.json`` file to write.
    **metadata
        Extra top-level fields (see :func:`chrome_trace`).
    """
    doc = chrome_trace(runs, metadata=metadata)
    return str(write_text_atomic(path, json.dumps(doc, indent=None, separators=(",", ":"), default=str)))
