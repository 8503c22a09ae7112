"""Facts about streams of minibatches: throughput, where each stage's time went, the queues,
and the bottleneck in one sentence.

May import: placer.data. Pure functions of a run's :class:`~placer.data.run.StreamStats`.

A node's *capacity* is the samples per second its workers could sustain if they
never waited: its samples over its busy seconds, times its workers (an average over
every batch, the first, often slower one included). A stream is
*input-bound* when its step waited for data for a large share of its time (the
slowest node upstream limits it), *step-bound* when the step was busy nearly all
the time (preprocessing keeps up), and *balanced* otherwise. A run without workers
(``workers=0``) is *sequential*: its stages never overlapped.

Examples
--------
>>> from placer.data.run import StreamStageStats, StreamStats
>>> def node(name, kind, busy, starved, blocked, workers=1):
...     return StreamStageStats(name=name, kind=kind, device="cpu", workers=workers, worker_kind="thread",
...                             batches=10, busy_s=busy, starved_s=starved, blocked_s=blocked,
...                             wall_s=(busy + starved + blocked) / workers)
>>> stats = StreamStats(source="read", step="train", epochs=1, batches=10, samples=640, seconds=1.6,
...                     samples_per_s=410.0, time_to_first_batch_s=0.16, consumer_idle_fraction=0.63,
...                     prefetch=2, stages=[node("read", "source", 0.1, 0.0, 1.5),
...                                         node("augment", "batch", 1.56, 0.04, 0.0),
...                                         node("train", "step", 0.34, 1.01, 0.25)],
...                     queue_trace=[(0.2, [2, 0]), (0.4, [2, 0])])
>>> f = stream_facts(stats, step_only_samples_per_s=1900.0)
>>> f.bound, f.bottleneck
('input', 'augment')
>>> f.sentence.split(":")[0]
'Input-bound'
"""

from __future__ import annotations

from collections.abc import Mapping

from placer.data.report import (QueueFacts, StreamClusterFacts, StreamFacts, StreamOption, StreamStageFacts,
                                StreamTargetFacts)
from placer.data.run import StreamStageStats, StreamStats, objective_rate
from placer.data.stream import StreamPlan

#: the step waiting for data at least this share of its time makes a stream input-bound
STARVED_SHARE = 0.2
#: the step busy at least this share of its time makes a stream step-bound
STEP_BUSY_SHARE = 0.8
#: a node that could deliver at least this multiple of the stream's rate has room to spare
HEADROOM = 1.5


def stream_facts(stats: StreamStats, step_only_samples_per_s: float | None = None) -> StreamFacts:
    """The facts of one stream, its bound, bottleneck and sentence included.

    Parameters
    ----------
    stats : StreamStats
        What the run measured.
    step_only_samples_per_s : float, optional
        The step's samples per second measured alone (fed from memory), when a
        profile measured it; the sentence then compares the stream with it.
    """
    per_batch = stats.samples / stats.batches if stats.batches else 0.0
    f = StreamFacts(
        source=stats.source, step=stats.step, epochs=stats.epochs, batches=stats.batches,
        samples=stats.samples, seconds=stats.seconds, samples_per_s=stats.samples_per_s,
        time_to_first_batch_s=stats.time_to_first_batch_s, setup_s=stats.setup_s,
        consumer_idle_fraction=stats.consumer_idle_fraction, prefetch=stats.prefetch,
        peak_inflight_batches=stats.peak_inflight_batches, peak_inflight_bytes=stats.peak_inflight_bytes,
        cache=stats.cache, sequential=is_sequential(stats),
        stages=[stage_facts(s, per_batch) for s in stats.stages],
        queues=queue_facts(stats) if stats.queue_trace else [],
        queue_trace=[(float(t), list(sizes)) for t, sizes in stats.queue_trace],
        step_only_samples_per_s=step_only_samples_per_s, notes=list(stats.notes),
    )
    f.bound, f.bottleneck = classify(f)
    f.sentence = stream_sentence(f)
    return f


def is_sequential(stats: StreamStats) -> bool:
    """Whether the run took every batch through every node in turn, none overlapping: as recorded, else (a run
    saved before it was) a run without queues. A DataLoader's worker processes feeding the step in one thread
    (the runner's script loop) overlap the step with the workers' reading, and have no queue."""
    if stats.sequential is not None:
        return stats.sequential and stats.batches > 0
    return stats.batches > 0 and not stats.queue_trace


def stage_facts(s: StreamStageStats, samples_per_batch: float) -> StreamStageFacts:
    """One node's time split into shares of its worker time, and its capacity."""
    total = s.busy_s + s.starved_s + s.blocked_s
    if total <= 0:
        total = s.wall_s * max(s.workers, 1)
    share = (lambda x: x / total) if total > 0 else (lambda x: 0.0)
    capacity = (s.batches * samples_per_batch * max(s.workers, 1) / s.busy_s
                if s.busy_s > 0 and s.batches else None)
    return StreamStageFacts(
        name=s.name, kind=s.kind, device=s.device, workers=s.workers, worker_kind=s.worker_kind,
        loader_workers=s.loader_workers, loader_threads=s.loader_threads, batches=s.batches, busy_s=s.busy_s,
        starved_s=s.starved_s,
        blocked_s=s.blocked_s, wall_s=s.wall_s,
        busy_share=share(s.busy_s), starved_share=share(s.starved_s), blocked_share=share(s.blocked_s),
        capacity_samples_per_s=capacity,
    )


def queue_facts(stats: StreamStats) -> list[QueueFacts]:
    """Each queue between two nodes: mean occupancy, and how often it was full or empty."""
    out = []
    for i, (a, b) in enumerate(zip(stats.stages, stats.stages[1:])):
        sizes = [row[i] for _, row in stats.queue_trace if i < len(row)]
        n = len(sizes)
        out.append(QueueFacts(
            src=a.name, dst=b.name, capacity=stats.prefetch,
            mean=sum(sizes) / n if n else 0.0,
            full_share=sum(x >= stats.prefetch for x in sizes) / n if n else 0.0,
            empty_share=sum(x == 0 for x in sizes) / n if n else 0.0,
        ))
    return out


def step_of(f: StreamFacts) -> StreamStageFacts | None:
    """The stream's step (its last node)."""
    return next((s for s in reversed(f.stages) if s.kind == "step"), None)


def slowest_upstream(f: StreamFacts) -> StreamStageFacts | None:
    """The node before the step with the lowest capacity (the most busy time per worker)."""
    up = [s for s in f.stages if s.kind != "step" and s.capacity_samples_per_s is not None]
    return min(up, key=lambda s: s.capacity_samples_per_s, default=None)


def step_capacity(f: StreamFacts) -> tuple[float | None, bool]:
    """The step's samples per second: measured alone when known (True), else from its busy time."""
    if f.step_only_samples_per_s is not None:
        return f.step_only_samples_per_s, True
    step = step_of(f)
    return (step.capacity_samples_per_s if step is not None else None), False


def classify(f: StreamFacts) -> tuple[str, str]:
    """``(bound, bottleneck node)`` from the step's idle and busy shares (see the module docstring)."""
    step, slow = step_of(f), slowest_upstream(f)
    if step is None or f.batches == 0:
        return "balanced", ""
    if f.sequential:
        nodes = [s for s in f.stages if s.capacity_samples_per_s is not None]
        low = min(nodes, key=lambda s: s.capacity_samples_per_s, default=step)
        return "sequential", low.name
    if f.consumer_idle_fraction >= STARVED_SHARE and slow is not None:
        return "input", slow.name
    if step.busy_share >= STEP_BUSY_SHARE or slow is None:
        return "step", step.name
    cap, _ = step_capacity(f)
    if cap is not None and slow.capacity_samples_per_s < cap:
        return "balanced", slow.name
    return "balanced", step.name


def stream_sentence(f: StreamFacts) -> str:
    """The bottleneck in one sentence, with the numbers it rests on."""
    step, slow = step_of(f), slowest_upstream(f)
    if step is None or f.batches == 0:
        return f"The stream {f.source} → {f.step} delivered no batches."
    idle, busy = f.consumer_idle_fraction, step.busy_share
    cap, alone = step_capacity(f)
    could = ""
    if alone:
        could = f"the step could take {cap:,.0f} (measured alone)"
    elif cap is not None and cap > f.samples_per_s:  # an average over every batch, the first included
        could = f"the step could take about {cap:,.0f} (from its busy time here)"
    if f.bound == "sequential":
        low = next(s for s in f.stages if s.name == f.bottleneck)
        approach = (f", and the stream could approach {low.name!r}'s {low.capacity_samples_per_s:,.0f} samples/s"
                    if low.capacity_samples_per_s is not None else "")
        # stages run in turn: each one's share of the stream's time is its busy time over all of theirs
        # (each stage's busy_share is of its own time, 100 % for every stage of a run without overlap)
        total = sum(s.busy_s for s in f.stages)
        turn = (lambda s: s.busy_s / total) if total > 0 else (lambda s: s.busy_share)
        return (f"Sequential run (no overlap): the step {step.name!r} took {turn(step):.0%} of the stream's time"
                + (f" and {slow.name!r} {turn(slow):.0%}" if slow is not None else "")
                + f"; with workers the stages overlap{approach}.")
    if f.bound == "input":
        return (f"Input-bound: the step {step.name!r} waited for data {idle:.0%} of the time. "
                f"{slow.name!r} ({workers_text(slow)}) was busy {slow.busy_share:.0%} of its time and caps "
                f"you at about {slow.capacity_samples_per_s:,.0f} samples/s" + (f"; {could}." if could else "."))
    if f.bound == "step":
        return step_bound_sentence(f, step, slow)
    return (f"Balanced: the step {step.name!r} was busy {busy:.0%} of the time and waited for data {idle:.0%}"
            + (f"; the slowest stage upstream, {slow.name!r}, was busy {slow.busy_share:.0%} of its time "
               f"(about {slow.capacity_samples_per_s:,.0f} samples/s at most)" if slow is not None else "")
            + (f"; {could}." if could else "."))


def step_bound_sentence(f: StreamFacts, step: StreamStageFacts, slow: StreamStageFacts | None) -> str:
    """The sentence of a step-bound stream: is preprocessing fast enough, and is the step slowed here?"""
    rate = f.samples_per_s
    text = (f"Step-bound: the step {step.name!r} was busy {step.busy_share:.0%} of the time and waited for data "
            f"{f.consumer_idle_fraction:.0%}; the stream ran at {rate:,.0f} samples/s")
    if slow is None:
        text += "."
    elif has_headroom(slow, rate):
        text += (f", and preprocessing is fast enough: {slow.name!r} could feed about "
                 f"{slow.capacity_samples_per_s:,.0f} samples/s.")
    else:
        text += (f", but preprocessing has little room to spare: {slow.name!r} was busy {slow.busy_share:.0%} "
                 f"of its time (about {slow.capacity_samples_per_s:,.0f} samples/s at most), so a faster step "
                 "would soon wait for it.")
    alone = f.step_only_samples_per_s
    if alone is not None and rate > 0 and alone >= HEADROOM * rate:
        text += (f" The step alone runs at {alone:,.0f} samples/s ({alone / rate:.1f}× this): in the stream it "
                 "shares the machine with the stages that feed it.")
    elif alone is not None:
        text += f" The step alone runs at {alone:,.0f} samples/s."
    return text


def has_headroom(node: StreamStageFacts, rate: float) -> bool:
    """Whether ``node`` could deliver :data:`HEADROOM` times ``rate`` samples per second."""
    cap = node.capacity_samples_per_s
    return cap is not None and cap >= HEADROOM * rate


def workers_text(s: StreamStageFacts) -> str:
    """``2 thread workers on cpu``."""
    if s.loader_workers:
        return f"{s.loader_workers} DataLoader worker process{'es' if s.loader_workers != 1 else ''} on {s.device}"
    if s.loader_threads:
        return f"{s.loader_threads} loader thread{'s' if s.loader_threads != 1 else ''} on {s.device}"
    return f"{s.workers} {s.worker_kind} worker{'s' if s.workers != 1 else ''} on {s.device}"


def add_plan(facts: StreamFacts, plan: StreamPlan, measured: Mapping[str, StreamStats | float]) -> None:
    """Put a stream plan's prediction, reasons, baselines and what-ifs into the stream's facts.

    ``measured`` maps a baseline's name to what its run measured (its stream's statistics, or
    samples/s). The measured samples/s set against the prediction are the objective's: the
    steady state, or for ``total_time`` the whole run's mean (samples over the stream's
    seconds, worker start-up and epoch ends included), as the prediction is, and as a
    user's script timing its own loop sees it.
    """
    facts.predicted_samples_per_s = plan.predicted_samples_per_s
    facts.plan_reasons = list(plan.reasons)
    facts.options_measure = "whole run" if plan.objective == "total_time" else "steady state"

    def rate(s: StreamStats | StreamFacts | float | None) -> float | None:
        return s if s is None or isinstance(s, (int, float)) else objective_rate(s, plan.objective)

    ours = rate(facts)

    def option(name: str, change: str, predicted: float | None, got: float | None, bottleneck: str) -> StreamOption:
        return StreamOption(
            name=name, change=change, predicted_samples_per_s=predicted, measured_samples_per_s=got,
            plan_speedup_predicted=plan.predicted_samples_per_s / predicted if predicted else None,
            plan_speedup_measured=ours / got if got and ours else None, bottleneck=bottleneck)

    facts.options = [option("plan", "placer's plan", plan.predicted_samples_per_s, ours, plan.bottleneck)]
    facts.options += [option(a.name, a.change, a.predicted_samples_per_s, rate(measured.get(a.name)), a.bottleneck)
                      for a in plan.baselines]
    facts.what_if = [StreamOption(name=a.name, change=a.change, predicted_samples_per_s=a.predicted_samples_per_s,
                                  measured_samples_per_s=a.measured_samples_per_s, speedup=a.speedup,
                                  bottleneck=a.bottleneck) for a in plan.what_if]
    if plan.offload is not None:
        off = plan.offload
        facts.cluster = StreamClusterFacts(**off.model_dump(exclude={"stages"}),
                                           stages=[s.model_dump() for s in off.stages])


def target_facts(plan: StreamPlan) -> StreamTargetFacts:
    """A stream plan made for a described machine (``plan.target``) as report facts: every number a
    prediction for that machine, its name on each."""
    if not plan.target:
        raise ValueError(f"the plan of stream {plan.source!r} was made for this machine, not for a target")
    return StreamTargetFacts(
        machine=plan.target, predicted_samples_per_s=plan.predicted_samples_per_s,
        step_samples_per_s=plan.consumer_samples_per_s, bottleneck=plan.bottleneck,
        predicted_wait_fraction=plan.predicted_wait_fraction, sentence=plan.target_sentence or "",
        settings={"placement": dict(plan.placement), **plan.settings.decisions()},
        stages=[{"name": d.name, "device": d.device, "workers": d.workers, "worker_kind": d.worker_kind,
                 "predicted_seconds_per_batch": d.seconds_per_batch, "predicted_batches_per_s": d.batches_per_s,
                 "reason": d.reason} for d in plan.stages],
        reasons=list(plan.reasons),
        what_if=[StreamOption(name=a.name, change=a.change, predicted_samples_per_s=a.predicted_samples_per_s,
                              speedup=a.speedup, bottleneck=a.bottleneck) for a in plan.what_if],
        notes=list(plan.notes))


def add_target_plan(facts: StreamFacts, plan: StreamPlan) -> None:
    """Put a stream's plan for a described machine into the stream's facts (``facts.target``)."""
    facts.target = target_facts(plan)
