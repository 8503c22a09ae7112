"""The critical path of a timeline and its bottleneck.

May import: placer.data.report, placer.devices (the host's location name). Pure functions over a :class:`ReportFacts`.

The critical path is found backwards from the event that ends last: a stage waited
for the latest of its inputs to arrive (a copy, or its producer on the same
memory) and for its lane to be free (the previous bar on that lane); a copy
waited for the stage that produced its data. Time between the chosen
predecessor's end and the step's start is a ``wait`` (dispatch overhead).

Examples
--------
>>> from placer.data.report import Bar
>>> bars = [Bar(lane="cpu/0", label="a", kind="stage", device="cpu", start_s=0, end_s=1),
...         Bar(lane="cpu/0", label="b", kind="stage", device="cpu", start_s=1, end_s=4)]
>>> [s.name for s in critical_path(bars, {"b": ["a"]}, {"cpu": "cpu"})]
['a', 'b']
"""

from __future__ import annotations

from collections.abc import Mapping

from placer.data.report import Bar, Bottleneck, PathStep, ReportFacts
from placer.devices import HOST

#: gaps shorter than this (seconds) are not reported as waits
WAIT_EPS = 1e-6


def critical_path(bars: list[Bar], inputs: Mapping[str, list[str]], kinds: Mapping[str, str]) -> list[PathStep]:
    """Steps of the critical path, first to last (see the module docstring)."""
    if not bars:
        return []
    stage_bar = {b.label: b for b in bars if b.kind == "stage"}
    copies = {(b.label, b.dst): b for b in bars if b.kind == "transfer"}
    cur = max(bars, key=lambda b: (b.end_s, b.kind == "transfer"))
    path: list[PathStep] = []
    seen = set()
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        path.append(_step(cur))
        prev = _predecessor(cur, bars, stage_bar, copies, inputs, kinds)
        if prev is not None and cur.start_s - prev.end_s > WAIT_EPS:
            path.append(PathStep(kind="wait", name=f"before {cur.label}", device=cur.device,
                                 seconds=cur.start_s - prev.end_s))
        cur = prev
    return path[::-1]


def _step(b: Bar) -> PathStep:
    name = b.label if b.kind == "stage" else f"{b.label} ({b.src}→{b.dst})"
    return PathStep(kind=b.kind, name=name, device=b.device, seconds=max(0.0, b.end_s - b.start_s))


def _predecessor(cur: Bar, bars, stage_bar, copies, inputs, kinds) -> Bar | None:
    if cur.kind == "transfer":
        return stage_bar.get(cur.label)
    here = HOST if kinds.get(cur.device, "gpu") == "cpu" else cur.device
    cands = []
    for src in inputs.get(cur.label, []):
        b = copies.get((src, here)) or stage_bar.get(src)
        if b is not None:
            cands.append(b)
    lane = [b for b in bars if b.lane == cur.lane and b is not cur and b.end_s <= cur.start_s + WAIT_EPS]
    if lane:
        cands.append(max(lane, key=lambda b: b.end_s))
    cands = [b for b in cands if b.end_s <= cur.start_s + WAIT_EPS]
    return max(cands, key=lambda b: b.end_s) if cands else None


def span_word(facts: ReportFacts) -> str:
    """What the run's length is called: ``total time`` in a run with streams (whose reports speak of
    throughput and total time), else ``makespan``, the one-shot pipeline's documented objective."""
    return "total time" if facts.streams else "makespan"


def objective_words(facts: ReportFacts) -> str:
    """The objective as a report's header names it: the makespan of a run with streams is its total time."""
    objective = facts.meta.objective
    return span_word(facts) if objective == "makespan" else objective.replace("_", " ")


def bottleneck(facts: ReportFacts) -> Bottleneck | None:
    """The stage or copy with the largest share of the critical path.

    The measured timeline is used when there is one, else the predicted schedule.
    """
    tl = facts.timeline
    source, bars, span = "measured", tl.measured, tl.measured_makespan_s
    if not bars:
        source, bars, span = "predicted", tl.predicted, tl.predicted_makespan_s
    if not bars:
        return None
    inputs: dict[str, list[str]] = {}
    for e in facts.dag.edges:
        inputs.setdefault(e.dst, []).append(e.src)
    kinds = {d.name: d.kind for d in facts.meta.devices}
    path = critical_path(bars, inputs, kinds)
    work = [s for s in path if s.kind != "wait"]
    if not work:
        return None
    top = max(work, key=lambda s: s.seconds)
    span = span or max(b.end_s for b in bars)
    share = top.seconds / span if span > 0 else 0.0
    what = "stage" if top.kind == "stage" else "copy"
    dev = facts.device(top.device)
    where = dev.title if dev is not None else top.device
    sentence = (
        f"On the {source} critical path, {what} {top.name!r} on {where} takes "
        f"{top.seconds:.3g} s, {share:.0%} of the {span:.3g} s {span_word(facts)}."
    )
    return Bottleneck(kind=top.kind, name=top.name, device=top.device, seconds=top.seconds, share=share,
                      source=source, path=path, sentence=sentence)
