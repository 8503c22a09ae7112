"""A stream plan for a described machine in words and as plain data: what it would be bound by, the what-ifs
for the target, and the summary an advice carries.

May import: placer.data.stream, placer.stream.reasons; placer.stream.search inside functions.
"""

from __future__ import annotations

from typing import Any

from placer.data.stream import Alternative, StreamPlan, StreamProfile
from placer.stream.reasons import target_label

#: the target's GPU in the planned stream
TARGET_GPU = "gpu:0"
#: the two members of a plain script's stream: its DataLoader (the source) and its train step
LOADER, STEP = "loader", "step"


def wait_fraction(profile: StreamProfile, scorer: Any, c: Any) -> float | None:
    """The step's predicted share of time waiting for data: ``1 - stream rate / the step's own rate``."""
    take = profile.consumer_samples_per_s.get(c.place[profile.step])
    if not take:
        return None
    return max(0.0, 1.0 - scorer.predict(c).samples_per_s / take)


def machine_name(profile: StreamProfile) -> str:
    """The target in running text: ``the NVIDIA H200 machine``."""
    return target_label(profile.target)


def bound_sentence(profile: StreamProfile, scorer: Any, c: Any) -> str:
    """What the stream would be bound by on the target, in one sentence naming the target.

    "On the NVIDIA H200 machine (predicted) the step could take 9,400 samples/s; 'augment' on 14
    worker processes delivers about 3,100: the GPU would wait 67 % of the time."
    """
    pred = scorer.predict(c)
    dev = c.place[profile.step]
    take = profile.consumer_samples_per_s.get(dev, 0.0)
    on = "on the GPU" if dev != "cpu" else "on the CPU"
    head = f"On {machine_name(profile)} (predicted) the step {on} could take {take:,.0f} samples/s"
    neck = pred.rates[0] if pred.rates else None
    wait = wait_fraction(profile, scorer, c) or 0.0
    if c.settings.sequential:
        return (f"{head}; one batch at a time every stage runs in turn: about {pred.samples_per_s:,.0f} "
                f"samples/s, the step waiting {wait:.0%} of the time.")
    if neck is None or (profile.step in neck.members and (neck.kind == "stage" or neck.members == [profile.step])):
        return f"{head}; the stream keeps up: the step binds, at about {pred.samples_per_s:,.0f} samples/s."
    if neck.kind == "device" and profile.step in neck.members:
        others = ", ".join(repr(m) for m in neck.members if m != profile.step)
        return (f"{head}; {others} shares the GPU with it: about {pred.samples_per_s:,.0f} samples/s, the GPU "
                f"busy all the time ({1 - wait:.0%} of it on the step).")
    waits = "the GPU" if dev != "cpu" else "the step"
    return (f"{head}; {_who(profile, c, neck)} delivers about {pred.samples_per_s:,.0f}: {waits} would wait "
            f"{wait:.0%} of the time.")


def _workers(n: int, kind: str) -> str:
    """``16 worker processes``, ``one worker thread``."""
    noun = "process" if kind == "process" else "thread"
    return f"one worker {noun}" if n == 1 else f"{n} worker {noun}{'es' if noun == 'process' else 's'}"


def _who(profile: StreamProfile, c: Any, rate: Any) -> str:
    """The resource that binds, in words ("'augment' on 14 worker processes", "the GIL", "the link")."""
    if rate.kind == "stage":
        m = rate.members[0]
        if m == profile.source:
            w = c.workers.get(m)
            kind = (f"loader thread{'s' if w != 1 else ''}" if c.settings.loader_threads(m)
                    else "DataLoader worker processes")
            return f"the source {m!r}" + (f" on {w} {kind}" if w else "")
        w = 1 if c.settings.sequential else c.workers.get(m, 1)
        return f"{m!r} on {_workers(w, c.settings.kind_of(m))}"
    if rate.kind == "device":
        return f"the GPU ({', '.join(repr(m) for m in rate.members)} sharing it)"
    if rate.kind == "link":
        return "the host-to-GPU link"
    if rate.kind == "cores":
        return f"the {profile.cores} cores"
    if rate.kind == "gil":
        return f"the GIL ({', '.join(repr(m) for m in rate.members)} taking turns)"
    return rate.name


def target_what_if(profile: StreamProfile, scorer: Any, best: Any, ranked: list | None = None) -> list[Alternative]:
    """Options for the target beside the plan, predicted: every per-batch stage with both implementations on
    the other device (on the GPU it shares the GPU with the step; on the CPU with the workers that suit it
    best, from ``ranked``), the CPU stages with the target's cores as workers of either kind, pageable
    copies, and one batch at a time."""
    from placer.stream.search import cpu_members, worker_options

    base = scorer.score(best)
    rows: list[tuple[str, Any]] = []
    place = best.place
    for s in profile.stages:
        if s.role != "batch" or not {"cpu", TARGET_GPU} <= set(s.seconds):
            continue
        new = {**place, s.name: "cpu" if place[s.name] == TARGET_GPU else TARGET_GPU}
        if new[s.name] == TARGET_GPU:
            ws = {m: best.workers.get(m, 1) for m in cpu_members(profile, new)}
            shared = " (it shares the GPU with the step)" if place[profile.step] == TARGET_GPU else ""
            rows.append((f"{s.name!r} on the GPU{shared}", best.with_(placement=tuple(new.items()), stage_workers=ws)))
            continue
        alt = next((c for c in ranked or [] if c.place == new and not c.settings.sequential), None)
        if alt is None:
            ws = {m: max(worker_options(profile, m)) if m == s.name else best.workers.get(m, 1)
                  for m in cpu_members(profile, new)}
            alt = best.with_(placement=tuple(new.items()), stage_workers=ws)
        rows.append((f"{s.name!r} on the CPU, {_workers(alt.workers.get(s.name, 1), alt.settings.kind_of(s.name))}",
                     alt))
    if profile.source_kind != "iterable" and not best.settings.sequential:
        mine = profile.loader.num_workers if profile.loader is not None else 0
        for w in sorted({mine, profile.cores} - {best.workers.get(profile.source, 0)}):
            who = "your DataLoader's" if w == mine and profile.loader is not None else "the cores'"
            rows.append((f"{w} DataLoader worker processes ({who} count)",
                         best.with_(stage_workers={**best.workers, profile.source: w})))
    for m in cpu_members(profile, place):
        if m == profile.source or best.settings.sequential:
            continue
        for kind in ("thread", "process"):
            if kind == "process" and not any(r.kind == "process" for r in profile.stage(m).scaling):
                continue
            w = max(worker_options(profile, m, kind))
            kinds = {k: v for k, v in best.settings.worker_kind.items() if k != m} | (
                {m: "process"} if kind == "process" else {})
            cand = best.with_(stage_workers={**best.workers, m: w}, worker_kind=kinds)
            if cand != best:
                rows.append((f"{m!r} on {_workers(w, kind)}", cand))
    if best.settings.pin_memory:
        rows.append(("pageable copies (no pin_memory)", best.with_(pin_memory=False)))
    if not best.settings.sequential:
        rows.append(("one batch at a time (no workers)", best.with_(workers=0)))
    out = []
    for name, c in rows:
        pred = scorer.predict(c)
        value = scorer.value(pred)
        out.append(Alternative(name=name, change=f"from the plan, on {machine_name(profile)} (predicted)",
                               placement=c.place, config=c.settings.decisions(), predicted_samples_per_s=value,
                               predicted_total_s=pred.total_s, speedup=value / base if base else None,
                               bottleneck=pred.bottleneck))
    return out


def target_summary(plan: StreamPlan) -> dict[str, Any]:
    """A stream plan for a target as plain data: every number a prediction for ``machine``.

    For a plain script (its DataLoader as the source) the chosen DataLoader settings are given in
    its own terms (``loader``: ``num_workers``, ``pin_memory``, ...).
    """
    from placer.data.stream import LoaderSettings

    out: dict[str, Any] = {
        "machine": plan.target, "label": "predicted",
        "predicted_samples_per_s": plan.predicted_samples_per_s,
        "step_predicted_samples_per_s": plan.consumer_samples_per_s,
        "bottleneck": plan.bottleneck, "predicted_wait_fraction": plan.predicted_wait_fraction,
        "bottleneck_sentence": plan.target_sentence,
        "settings": {"placement": dict(plan.placement), **plan.settings.decisions()},
        "stages": [{"name": d.name, "device": d.device, "workers": d.workers, "worker_kind": d.worker_kind,
                    "predicted_seconds_per_batch": d.seconds_per_batch, "predicted_batches_per_s": d.batches_per_s}
                   for d in plan.stages],
        "what_if": [{**a.model_dump(include={"name", "change", "predicted_samples_per_s", "speedup",
                                             "bottleneck"}), "machine": plan.target} for a in plan.what_if],
        "notes": list(plan.notes),
    }
    if plan.source == LOADER:
        out["loader"] = LoaderSettings.from_stream(plan.settings, LOADER).as_dict()
    if plan.precision_s:  # the step's times per precision, the one chosen, the checks
        out |= {"precision": dict(plan.precision), "precision_s": plan.precision_s,
                "precision_checks": list(plan.precision_checks)}
    return out
