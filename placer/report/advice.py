"""Concrete advice drawn from a report's facts: what to move, pin, batch or keep.

May import: placer.data.report, placer.devices (the host's location name), placer.report.{streams,kinds}.
Each rule is a small function of the facts that returns zero or more :class:`Advice`; :func:`advise`
runs them all in order.
Every sentence names the stage or edge and the number it rests on.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from placer.data.report import Advice, ReportFacts, StageRow, StreamFacts, StreamStageFacts
from placer.devices import HOST
from placer.report.kinds import is_accelerator, is_real_gpu, is_simulated
from placer.report.streams import has_headroom, slowest_upstream, workers_text

#: copies at least this large are worth pinning (the executor pins above 1 MiB)
PIN_BYTES = 1 << 20
#: a prediction off by more than this (relative) deserves a longer profile
BAD_ERROR = 0.5
#: a copy with at least this share of the critical path is called out
COPY_SHARE = 0.15
#: reference bandwidths of the H200 machine (GB/s), see the reference measurements
PINNED_GBPS, PAGEABLE_GBPS = 55, "7–12"


def fmt_bytes(n: float | None) -> str:
    """``1.3 MB`` style (decimal units)."""
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_size(n: float | None, unit: str = "rows") -> str:
    """``20,000 rows``."""
    return "?" if n is None else f"{int(round(n)):,} {unit}"


def _is_gpu_like(facts: ReportFacts, device: str) -> bool:
    d = facts.device(device)
    return d is not None and is_accelerator(d.kind)


def _on_target_gpu(facts: ReportFacts, device: str) -> bool:
    """Whether a device of the target's plan is its accelerator (the target device, or any non-CPU one)."""
    return facts.target is not None and device == facts.target.device or _is_gpu_like(facts, device)


def _placements(facts: ReportFacts):
    """``(where, placement, crossovers, accelerator test, accelerator word)`` for the plan here and the target's."""
    here = {r.name: r.device for r in facts.stages}
    yield ("", here, {r.name: r.crossover_size for r in facts.stages}, lambda d: _is_gpu_like(facts, d),
           accelerator_word(facts))
    t = facts.target
    if t is not None:
        yield f"On {t.label}: ", t.placement, t.crossover_size, lambda d: _on_target_gpu(facts, d), "the GPU"


def accelerator_word(facts: ReportFacts) -> str:
    """How advice names this machine's accelerator (the simulated device never as a GPU)."""
    acc = next((d for d in facts.meta.devices if is_accelerator(d.kind) and d.present), None)
    if acc is None:
        return "the GPU"
    return acc.title if is_simulated(acc.kind) else f"the GPU ({acc.name})"


def move_rules(facts: ReportFacts) -> list[Advice]:
    """Stages whose crossover size says where they belong as the input grows or shrinks."""
    out = []
    size, unit = facts.meta.size, facts.meta.size_unit
    rows = {r.name: r for r in facts.stages}
    for where, placement, crossings, gpu_like, acc in _placements(facts):
        for name, x in crossings.items():
            r = rows.get(name)
            if x is None or r is None or r.loop_carried:
                continue
            on_gpu = gpu_like(placement.get(name, "cpu"))
            if not on_gpu and (size is None or size < x) and r.kind != "inference":
                out.append(Advice(topic="move", subject=name, text=(
                    f"{where}Move stage {name!r} to {acc} above {fmt_size(x, unit)} "
                    f"(it has {fmt_size(size, unit)} now); below that, launch and copy costs make the CPU faster.")))
            elif on_gpu and size is not None and size >= x:
                out.append(Advice(topic="move", subject=name, text=(
                    f"{where}Keep stage {name!r} on {acc} for {fmt_size(x, unit)} and more; "
                    f"below {fmt_size(x, unit)} run it on the CPU.")))
    return out


def batch_rules(facts: ReportFacts) -> list[Advice]:
    """Inference on the CPU at a size below its crossover: batch to make the GPU pay."""
    out = []
    size, unit = facts.meta.size, facts.meta.size_unit
    rows = {r.name: r for r in facts.stages}
    for where, placement, crossings, gpu_like, acc in _placements(facts):
        for name, x in crossings.items():
            r = rows.get(name)
            if r is None or r.kind != "inference" or x is None or gpu_like(placement.get(name, "cpu")):
                continue
            if size is None or size < x:
                out.append(Advice(topic="batch", subject=name, text=(
                    f"{where}Batch requests to at least {fmt_size(x, unit)} to make {acc} pay for "
                    f"stage {name!r}; at {fmt_size(size, unit)} it is faster on the CPU.")))
    return out


def loop_rules(facts: ReportFacts) -> list[Advice]:
    """Loop-carried stages belong on the CPU at any size."""
    out = []
    for r in facts.stages:
        if not r.loop_carried:
            continue
        if _is_gpu_like(facts, r.device):
            text = (f"Stage {r.name!r} is loop-carried (each step needs the previous one) but runs on "
                    f"{r.device}; move it to the CPU, where sequential work is fastest at any size.")
        elif facts.target is not None and _on_target_gpu(facts, facts.target.placement.get(r.name, "cpu")):
            text = (f"Stage {r.name!r} is loop-carried (each step needs the previous one); here it runs on the "
                    f"CPU, and the plan for {facts.target.label} runs it on the GPU all the same: its steps "
                    "are few or wide enough there to beat the CPU.")
        else:
            text = (f"Stage {r.name!r} is loop-carried (each step needs the previous one); "
                    "keep it on the CPU at any size: a GPU runs it on one thread.")
        out.append(Advice(topic="loop", subject=r.name, text=text))
    return out


def pin_rules(facts: ReportFacts) -> list[Advice]:
    """Large host-to-GPU copies from pageable memory, measured or planned."""
    out, said = [], set()
    for b in facts.timeline.measured:
        d = facts.device(b.device)
        if b.kind != "transfer" or b.pinned or (b.bytes or 0) < PIN_BYTES or d is None or not is_real_gpu(d.kind):
            continue
        if b.src != HOST or b.label in said:
            continue
        said.add(b.label)
        gbps = (b.bytes or 0) / max(b.end_s - b.start_s, 1e-12) / 1e9
        out.append(Advice(topic="pin", subject=b.label, text=(
            f"Pin host memory for the output of {b.label!r} ({fmt_bytes(b.bytes)} copied from pageable "
            f"memory at {gbps:.1f} GB/s); pinned copies reached ~{PINNED_GBPS} GB/s on an H200 machine "
            f"against {PAGEABLE_GBPS} GB/s pageable.")))
    if facts.target is not None:
        out += _target_pin(facts, said)
    return out


def _target_pin(facts: ReportFacts, said: set[str]) -> list[Advice]:
    t = facts.target
    out = []
    for e in facts.dag.edges:
        a, b = t.placement.get(e.src, "cpu"), t.placement.get(e.dst, "cpu")
        if _on_target_gpu(facts, a) == _on_target_gpu(facts, b) or (e.bytes or 0) < PIN_BYTES or e.src in said:
            continue
        said.add(e.src)
        out.append(Advice(topic="pin", subject=f"{e.src}->{e.dst}", text=(
            f"On {t.label}, edge {e.src!r} → {e.dst!r} would carry {fmt_bytes(e.bytes)} across the link: "
            f"pin host memory for it (~{PINNED_GBPS} GB/s pinned against {PAGEABLE_GBPS} GB/s pageable).")))
    return out


def bottleneck_rules(facts: ReportFacts) -> list[Advice]:
    """Name the bottleneck; for a copy, say how to avoid it.

    A run with streams leaves this to :func:`stream_rules`: a stream's stages share one
    span on the timeline, so its critical path says little about what limits it.
    """
    bn = facts.bottleneck
    if bn is None or facts.streams:
        return []
    if bn.kind == "transfer" and bn.share >= COPY_SHARE:
        data = bn.name.split(" (", 1)[0]
        return [Advice(topic="bottleneck", subject=data, text=(
            f"The copy of {data!r}'s output is the bottleneck ({bn.share:.0%} of the {bn.source} makespan): "
            f"place {data!r} and its consumers on the same device, or pin and overlap the copy."))]
    row = next((r for r in facts.stages if r.name == bn.name), None)
    text = f"Stage {bn.name!r} is the bottleneck: {bn.share:.0%} of the {bn.source} makespan on {bn.device}."
    found = _faster_elsewhere(facts, row) if row is not None else None
    if found is not None:
        title, secs, dev = found
        t = facts.target
        if t is not None and dev == t.device and t.placement.get(bn.name) != dev:
            # the target's plan is the one decision about that device: never "it would pay" where it does not
            text += (f" It is predicted at {secs:.3g} s on {title}, yet the plan for {t.label} keeps it on "
                     f"{t.placement.get(bn.name, 'the CPU')}: the copies and the stages around it cost more there.")
        elif t is not None and dev == t.device:
            text += f" It is predicted at {secs:.3g} s on {title}; the plan for {t.label} runs it there."
        else:
            text += f" It is predicted at {secs:.3g} s on {title}; that device would pay if it were available."
    return [Advice(topic="bottleneck", subject=bn.name, text=text)]


def _faster_elsewhere(facts: ReportFacts, row: StageRow) -> tuple[str, float, str] | None:
    """``(title, seconds, device)`` of an absent device predicted at least twice as fast, or None."""
    here = row.measured_s.get(row.device) or row.predicted_s.get(row.device)
    best = None
    for dev, secs in row.predicted_s.items():
        d = facts.device(dev)
        if dev == row.device or secs is None or here is None or d is None or d.present or secs >= here / 2:
            continue
        if best is None or secs < best[1]:
            best = (d.title, secs, dev)
    return best


def target_rules(facts: ReportFacts) -> list[Advice]:
    """What a plan for an absent GPU would do."""
    t = facts.target
    if t is None:
        return []
    on = [n for n, d in t.placement.items() if _on_target_gpu(facts, d)]
    if not on:
        return [Advice(topic="target", subject=t.device, text=(
            f"On {t.label} the plan would still keep every stage on the CPU (predicted {t.predicted_s:.3g} s): "
            "at this size the GPU does not pay."))]
    gain = f", {t.speedup:.1f}× faster than all-CPU" if t.speedup else ""
    return [Advice(topic="target", subject=t.device, text=(
        f"On {t.label} (not on this machine) the plan would run {', '.join(repr(n) for n in on)} on the GPU: "
        f"predicted {t.predicted_s:.3g} s{gain}."))]


def accuracy_rules(facts: ReportFacts) -> list[Advice]:
    """Predictions far from their measurement."""
    bad = [e for e in facts.errors if e.rel_error is not None and abs(e.rel_error) > BAD_ERROR]
    if not bad:
        return []
    worst = max(bad, key=lambda e: abs(e.rel_error))
    names = ", ".join(sorted({f"{e.stage!r} on {e.device}" for e in bad}))
    return [Advice(topic="accuracy", subject=worst.stage, text=(
        f"Predictions were off by more than {BAD_ERROR:.0%} for {names} (worst {worst.rel_error:+.0%}); "
        "profile longer (a larger --budget-s) or at sizes nearer this one before trusting the plan.")) ]


# -- streams -------------------------------------------------------------------------------
#: a queue empty (or full) at least this share of the step's takes is called empty (full)
QUEUE_SHARE = 0.8
#: fewer batches than this give rough steady-state numbers
FEW_BATCHES = 10
#: a first batch later than this share of the stream's time is called out
SLOW_START = 0.25
#: the most workers advice proposes for one stage
MAX_PROPOSED_WORKERS = 64


def stream_rules(facts: ReportFacts) -> list[Advice]:
    """What to change in each stream, from its measured bound, stages and queues."""
    out = []
    for s in facts.streams or []:
        if s.batches == 0:
            continue
        if s.sequential:
            out += _sequential_advice(s)
        elif s.bound == "input":
            out += _input_bound_advice(facts, s)
        elif s.bound == "step":
            out += _step_bound_advice(s)
        out += _short_run_advice(s)
    return out


def _stage(s: StreamFacts, name: str) -> StreamStageFacts | None:
    return next((n for n in s.stages if n.name == name), None)


def _step_rate(s: StreamFacts) -> tuple[float | None, str]:
    """The step's samples per second (measured alone, else from its busy time) and how it was known."""
    if s.step_only_samples_per_s is not None:
        return s.step_only_samples_per_s, "measured alone"
    step = _stage(s, s.step)
    cap = step.capacity_samples_per_s if step is not None else None
    return cap, "from its busy time"


def workers_needed(stage: StreamStageFacts, rate: float) -> int | None:
    """Workers of ``stage`` that would deliver ``rate`` samples per second (None: unknown)."""
    if stage.capacity_samples_per_s is None or stage.capacity_samples_per_s <= 0:
        return None
    per_worker = stage.capacity_samples_per_s / max(stage.workers, 1)
    return min(MAX_PROPOSED_WORKERS, max(1, math.ceil(rate / per_worker)))


def _input_bound_advice(facts: ReportFacts, s: StreamFacts) -> list[Advice]:
    slow = _stage(s, s.bottleneck)
    if slow is None:
        return []
    waited = f"the step {s.step!r} waited for data {s.consumer_idle_fraction:.0%} of the time"
    out = []
    if slow.kind == "batch" and not _is_gpu_like(facts, slow.device):
        out.append(_cpu_stage_workers(s, slow, waited))
    elif slow.kind == "source" and (slow.loader_workers or slow.loader_threads):
        out.append(Advice(topic="workers", subject=slow.name, text=(
            f"The source {slow.name!r} limits the stream ({waited}): its {workers_text(slow)} do not keep up. "
            "More of them help while cores are free; else make each sample cheaper, or keep a deterministic "
            "stage's output after the first epoch with --cache.")))
    elif slow.kind == "source":
        out.append(Advice(topic="workers", subject=slow.name, text=(
            f"The source {slow.name!r} limits the stream ({waited}, the source busy {slow.busy_share:.0%}): "
            f"read faster (DataLoader workers for a Dataset source), or keep a deterministic stage's output "
            f"after the first epoch with --cache.")))
    elif slow.kind == "copy":
        out.append(Advice(topic="stream", subject=slow.name, text=(
            f"Copying batches into {slow.device} limits the stream ({waited}, the copy busy "
            f"{slow.busy_share:.0%}): copy from pinned memory, and move work onto {slow.device} "
            "that shrinks what crosses (decode or crop there).")))
    else:
        out.append(Advice(topic="stream", subject=slow.name, text=(
            f"{slow.name!r} on {slow.device} limits the stream ({waited}, {slow.name!r} busy "
            f"{slow.busy_share:.0%}): workers do not help on an accelerator; make it cheaper per batch.")))
    return out + _queue_advice(s, starved=True)


def _cpu_stage_workers(s: StreamFacts, slow: StreamStageFacts, waited: str) -> Advice:
    """A CPU stage that starves the step: how many workers would feed it, or why workers do not scale."""
    rate, how = _step_rate(s)
    need = workers_needed(slow, rate) if rate is not None else None
    has = f"{slow.workers} {slow.worker_kind} worker{'s' * (slow.workers != 1)}"
    if need is not None and need <= slow.workers:
        return Advice(topic="workers", subject=slow.name, text=(
            f"{slow.name!r} starves the step although its {has} could feed the step's {rate:,.0f} samples/s "
            f"({how}) by their busy time: {waited}. They compete for the cores or, in pure Python, for the "
            "GIL: use process workers, or make the stage cheaper."))
    target = (f": about {need} to feed the step's {rate:,.0f} samples/s ({how}), e.g. "
              f"StreamConfig(stage_workers={{{slow.name!r}: {need}}})" if need else "")
    text = (f"Give {slow.name!r} more workers{target}. {waited.capitalize()} while {slow.name!r}, with "
            f"{has}, was busy {slow.busy_share:.0%} of its worker time.")
    if slow.worker_kind == "thread":
        text += " If it runs pure Python (holding the GIL), threads will not scale it: use process workers."
    return Advice(topic="workers", subject=slow.name, text=text)


def _step_bound_advice(s: StreamFacts) -> list[Advice]:
    step, slow = _stage(s, s.step), slowest_upstream(s)
    busy = (f"The step {s.step!r} is the bottleneck (busy {step.busy_share:.0%} of the time, waiting for data "
            f"{s.consumer_idle_fraction:.0%})")
    if slow is None or has_headroom(slow, s.samples_per_s):
        text = (f"{busy}: preprocessing is fast enough, so more workers or a deeper prefetch will not speed "
                "the stream; make the step faster (an accelerator, larger batches).")
    else:
        text = (f"{busy}, and {slow.name!r} is close behind (busy {slow.busy_share:.0%}): make the step faster "
                f"(an accelerator, larger batches) and give {slow.name!r} more workers with it.")
    out = [Advice(topic="bottleneck", subject=s.step, text=text)]
    for n in s.stages:
        need = workers_needed(n, s.samples_per_s) if n.kind == "batch" else None
        if need is not None and need < n.workers:
            out.append(Advice(topic="workers", subject=n.name, text=(
                f"{n.name!r} would keep up with {need} worker{'s' * (need != 1)} (it has {n.workers}, "
                f"blocked {n.blocked_share:.0%} of their time): its other workers only hold memory.")))
    return out + _queue_advice(s, starved=False)


def _queue_advice(s: StreamFacts, *, starved: bool) -> list[Advice]:
    """The queue into the step: always full (prefetch is enough) or mostly empty (workers, not prefetch)."""
    q = next((q for q in s.queues if q.dst == s.step), None)
    if q is None:
        return []
    if not starved and q.full_share >= QUEUE_SHARE:
        return [Advice(topic="prefetch", subject=s.step, text=(
            f"Prefetch {s.prefetch} is enough: the queue into {s.step!r} was full at {q.full_share:.0%} "
            "of the step's takes.")) ]
    if starved and q.empty_share >= QUEUE_SHARE:
        return [Advice(topic="prefetch", subject=s.step, text=(
            f"The queue into {s.step!r} was empty at {q.empty_share:.0%} of the step's takes: the stages "
            "upstream are slower on average, so a deeper prefetch will not help; add workers upstream.")) ]
    if starved:
        return [Advice(topic="prefetch", subject=s.step, text=(
            f"Raise prefetch (now {s.prefetch}): the queue into {s.step!r} was empty at "
            f"{q.empty_share:.0%} of the step's takes and full at {q.full_share:.0%}, so slow batches come "
            "in bursts that a deeper queue would smooth out.")) ]
    return []


def _sequential_advice(s: StreamFacts) -> list[Advice]:
    if s.predicted_samples_per_s is not None:
        # the plan chose one batch at a time (its reasons say why): no advice to undo its own choice
        return []
    low = _stage(s, s.bottleneck)
    could = (f"; it could approach {low.name!r}'s {low.capacity_samples_per_s:,.0f} samples/s"
             if low is not None and low.capacity_samples_per_s else "")
    return [Advice(topic="stream", subject=s.step, text=(
        f"This run of {s.source} → {s.step} was sequential (--workers 0, every batch through every stage "
        f"in turn, {s.samples_per_s:,.0f} samples/s): run with --workers 1 or more to overlap the "
        f"stages{could}."))]


def _short_run_advice(s: StreamFacts) -> list[Advice]:
    late = s.seconds > 0 and s.time_to_first_batch_s > SLOW_START * s.seconds
    if s.batches >= FEW_BATCHES and not late:
        return []
    why = []
    if s.batches < FEW_BATCHES:
        why.append(f"only {s.batches} batches reached {s.step!r}")
    if late:
        why.append(f"the first batch took {s.time_to_first_batch_s:.3g} s of the stream's {s.seconds:.3g} s")
    return [Advice(topic="stream", subject=s.step, text=(
        f"The numbers of {s.source} → {s.step} are rough: {' and '.join(why)}; measure over more batches "
        "(more epochs or a larger size) for a steady state."))]


RULES: tuple[Callable[[ReportFacts], list[Advice]], ...] = (
    bottleneck_rules, stream_rules, move_rules, batch_rules, loop_rules, pin_rules, target_rules, accuracy_rules,
)


#: a stream option whose measured samples/s exceed the plan's by more than this is named, not passed over
STREAM_OPTION_MARGIN = 0.05


def _faster_stream_options(facts: ReportFacts) -> list[Advice]:
    """Each stream whose plan another measured option beat by more than :data:`STREAM_OPTION_MARGIN`: that
    option, its samples/s against the plan's, and what to do (the plan came from the model and shorter
    verification runs; this run of the whole stream does not confirm it)."""
    out = []
    for s in facts.streams or []:
        plan = next((o for o in s.options if o.name == "plan"), None)
        if plan is None or not plan.measured_samples_per_s:
            continue
        faster = [o for o in s.options if o is not plan and o.measured_samples_per_s
                  and o.measured_samples_per_s > plan.measured_samples_per_s * (1 + STREAM_OPTION_MARGIN)]
        if not faster:
            continue
        best = max(faster, key=lambda o: o.measured_samples_per_s)
        runs = (f"the median of {s.options_runs} runs each, interleaved" if s.options_runs > 1
                else "one run each")
        out.append(Advice(topic="keep", subject=s.step, text=(
            f"In {s.source} → {s.step}, {best.name!r} ({best.change}) measured "
            f"{best.measured_samples_per_s:,.0f} samples/s against the plan's {plan.measured_samples_per_s:,.0f} "
            f"({s.options_measure}, {runs}): {best.measured_samples_per_s / plan.measured_samples_per_s:.2f}x. "
            "The plan was chosen by the model and shorter verification runs, which these runs do not confirm: "
            "time both in your own run before you change, or profile longer (--budget-s).")))
    return out


def advise(facts: ReportFacts, rules=RULES) -> list[Advice]:
    """Run every rule; when none applies, say that the plan needs no change — only where it measured the
    fastest of the options run (of the placements and of each stream's settings); an option that measured
    faster is named instead."""
    out = [a for rule in rules for a in rule(facts)]
    streams = _faster_stream_options(facts)
    if not streams and not any(a.topic not in ("bottleneck",) for a in out):
        plan = facts.summary.options[0] if facts.summary.options else None
        best = min((o for o in facts.summary.options if o.measured_s is not None),
                   key=lambda o: o.measured_s, default=None)
        others = sum(o.measured_s is not None for o in facts.summary.options) > 1 or any(
            o.name != "plan" and o.measured_samples_per_s for s in facts.streams or [] for o in s.options)
        if plan is not None and best is not None and best.key == "plan" and others:
            out.append(Advice(topic="keep", subject="plan", text=(
                "Nothing to change: the plan was the fastest of the options measured here.")))
        elif plan is not None and best is not None and best.key == "plan":
            out.append(Advice(topic="keep", subject="plan", text=(
                "Nothing to change was found; no other option was measured here to compare with.")))
        elif best is not None and best.key != "plan":
            out.append(Advice(topic="keep", subject=best.key, text=(
                f"The {best.title} option measured faster than the plan ({best.measured_s:.3g} s against "
                f"{plan.measured_s:.3g} s); the cost model may be off: profile longer, or use "
                f"--placement to run that option.")))
    return out + streams
