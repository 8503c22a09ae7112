"""Explaining a stream plan in numbers: a reason per stage, baselines and what-ifs.

May import: placer.data.stream, placer.optimize.explain (wording), placer.stream.{model,search,remote}.

:func:`explain` turns the chosen :class:`~placer.stream.search.Candidate` into a
:class:`~placer.data.stream.StreamPlan`: its settings and prediction, a reason per
stage (its seconds per batch, workers and their measured speed-up, the GIL, what the
stream would do with the stage elsewhere), the plan's reasons (bottleneck, the step's
rate on prepared batches, the cache, prefetch, pinned copies, torch's threads),
baselines (``num_workers=0``, ``workers=cores`` with pinned memory, the rule of thumb,
the user's own DataLoader) and a what-if table of single changes from the rule of
thumb or the user's DataLoader.
"""

from __future__ import annotations

from placer.data.stream import Alternative, StageDecision, StreamPlan, StreamProfile, StreamSettings
from placer.optimize.explain import fmt_s
from placer.stream.model import StreamPrediction, loader_thread_speedup, predict
from placer.stream.search import (TIE, Candidate, Scorer, cpu_members, kind_here, neighbours, options,
                                  prefetch_for, rule_candidate, rule_of_thumb, worker_options)


def device_title(profile: StreamProfile, device: str) -> str:
    """A device in words: ``the CPU``, ``GPU gpu:0``, ``gpu-sim (simulated test device)``."""
    if device == "cpu":
        return "the CPU"
    if device in profile.simulated:
        return f"{device} ({profile.device_titles.get(device, 'simulated test device')})"
    return f"{profile.device_titles.get(device, 'accelerator')} {device}"


def explain(profile: StreamProfile, scorer: Scorer, c: Candidate, how: str = "", n: int = 0) -> StreamPlan:
    """The :class:`StreamPlan` of candidate ``c``: settings, prediction, reasons, baselines, what-ifs."""
    pred = scorer.predict(c)
    cfg = c.settings
    if cfg.pin_memory and all(d == "cpu" for d in profile.devices):  # nothing to pin for: do not show it
        cfg = cfg.model_copy(update={"pin_memory": False})
    value = scorer.value(pred)
    stages = []
    for s in profile.stages:
        dev = c.place[s.name]
        rate = pred.rate_of(s.name)
        stages.append(StageDecision(
            name=s.name, device=dev, workers=0 if cfg.sequential else c.workers.get(s.name, 1),
            worker_kind=cfg.kind_of(s.name),
            seconds_per_batch=seconds_of(profile, c, s.name), batches_per_s=rate.batches_per_s if rate else 0.0,
            reason=_stage_reason(profile, scorer, c, s.name, pred) + _predicted(profile)))
    start_name = "your DataLoader" if profile.loader is not None else "the rule of thumb"
    notes = [*profile.notes, *pred.notes]
    return StreamPlan(
        pipeline=profile.pipeline, source=profile.source, step=profile.step, objective=scorer.objective,
        epochs=scorer.epochs, placement=c.place, settings=cfg, predicted_samples_per_s=value,
        predicted_total_s=pred.total_s, bottleneck=pred.bottleneck,
        consumer_samples_per_s=profile.consumer_samples_per_s.get(c.place[profile.step]), stages=stages,
        reasons=_plan_reasons(profile, scorer, c, pred, how), baselines=baselines(profile, scorer, value),
        what_if=what_if(profile, scorer, rule_candidate(profile, rule_of_thumb(profile)), start_name),
        candidates=n, search=how, notes=list(dict.fromkeys(notes)), profile_s=profile.seconds)


# -- baselines and what-ifs -------------------------------------------------------------------------
def baselines(profile: StreamProfile, scorer: Scorer, plan_value: float) -> list[Alternative]:
    """The usual settings, predicted: ``num_workers=0``, ``workers=cores`` with pinned memory, the rule of
    thumb, and the user's DataLoader when the source returns one."""
    rule = rule_of_thumb(profile)
    out = []
    # pinned memory and "the step on the accelerator" mean something only where there is one
    accel = any(d != "cpu" for d in profile.devices)
    rows = [("num_workers=0", "every batch through every stage in turn", StreamSettings(workers=0, pin_memory=accel),
             None),
            ("rule of thumb", "preprocess on the CPU, the step on the accelerator; 1 worker per stage" if accel
             else "every stage on the CPU; 1 worker per stage", None, rule_candidate(profile, rule, pin=accel)),
            (f"workers={profile.cores}, pin_memory" if accel else f"workers={profile.cores}",
             f"{profile.cores} workers per CPU stage" + (", pinned copies" if accel else ""), None,
             rule_candidate(profile, rule, workers=profile.cores, pin=accel))]
    if profile.loader is not None:
        lo = profile.loader
        rows.append(("your DataLoader", f"as given: num_workers={lo.num_workers}, pin_memory={lo.pin_memory}",
                     None, rule_candidate(profile, rule, pin=bool(lo.pin_memory) and accel)))
    for name, change, cfg, cand in rows:
        pred = predict(profile, rule, cfg, epochs=scorer.epochs) if cfg is not None else scorer.predict(cand)
        conf = cfg if cfg is not None else cand.settings
        value = scorer.value(pred)
        out.append(Alternative(name=name, change=change, placement=rule, config=conf.decisions(),
                               predicted_samples_per_s=value, predicted_total_s=pred.total_s,
                               speedup=plan_value / value if value else None, bottleneck=pred.bottleneck))
    return out


def what_if(profile: StreamProfile, scorer: Scorer, start: Candidate, start_name: str,
            limit: int = 8) -> list[Alternative]:
    """Single changes from ``start`` (the rule of thumb, or the user's DataLoader), best first."""
    base = scorer.score(start)
    rows = []
    for c in neighbours(profile, start, scorer.epochs):
        pred = scorer.predict(c)
        value = scorer.value(pred)
        rows.append(Alternative(name=_describe(profile, start, c), change=f"from {start_name}", placement=c.place,
                                config=c.settings.decisions(), predicted_samples_per_s=value,
                                predicted_total_s=pred.total_s, speedup=value / base if base else None,
                                bottleneck=pred.bottleneck))
    rows = [r for r in rows if r.speedup is not None and abs(r.speedup - 1) > TIE]
    rows.sort(key=lambda a: -(a.speedup or 0))
    return rows[:limit]


def _describe(profile: StreamProfile, a: Candidate, b: Candidate) -> str:
    """The change from ``a`` to ``b`` in words ("move augment to the CPU", "4 workers on decode")."""
    pa, pb, sa, sb = a.place, b.place, a.settings, b.settings
    if sa.sequential != sb.sequential:
        return "one batch at a time (no workers)" if sb.sequential else "workers (batches overlap)"
    moved = [m for m in pa if pa[m] != pb[m]]
    if moved:
        m = moved[0]
        return f"{'the step' if m == profile.step else m} on {device_title(profile, pb[m])}"
    wa, wb = a.workers, b.workers
    changed = [m for m in wb if wa.get(m) != wb[m] or kind_here(profile, sa, m) != kind_here(profile, sb, m)]
    if changed:
        m = changed[0]
        kind = (f"loader thread{'s' if wb[m] != 1 else ''}" if m == profile.source and sb.loader_threads(m) else
                "DataLoader worker processes" if m == profile.source else
                "process workers" if m in b.processes else "workers")
        return f"{wb[m]} {kind} on {m}"
    if sa.cache != sb.cache:
        return f"cache after {sb.cache} (from epoch 2)" if sb.cache else "no cache"
    if sa.torch_threads != sb.torch_threads:
        return (f"{sb.torch_threads} torch intra-op thread{'s' if sb.torch_threads != 1 else ''} for the step"
                if sb.torch_threads else "torch's own intra-op threads")
    return "pinned copies" if sb.pin_memory else "pageable copies"


# -- reasons ---------------------------------------------------------------------------------------
def source_of(profile: StreamProfile, measured: str = "measured") -> str:
    """Where a profile's numbers come from: ``measured`` here, or predicted for its target."""
    return f"predicted for {target_label(profile.target)}" if profile.target else measured


def _predicted(profile: StreamProfile) -> str:
    """A stage reason's label on a target: its numbers are predictions for that machine."""
    return f" (predicted for {target_label(profile.target)})" if profile.target else ""


def target_label(name: str | None) -> str:
    """A described machine in running text: ``the NVIDIA H200 machine`` for the shipped
    ``NVIDIA H200 machine (16-core ...)``, a file's own name as it is."""
    short = str(name or "").split(" (")[0]
    return f"the {short}" if short.endswith("machine") else short


def seconds_of(profile: StreamProfile, c: Candidate, member: str) -> float:
    """A member's seconds per batch under ``c``: on its device, at ``c``'s torch threads where measured."""
    st = profile.stage(member)
    dev = c.place[member]
    threads = c.settings.torch_threads
    if dev == "cpu" and threads in st.torch_seconds:
        return st.torch_seconds[threads]
    return st.seconds[dev]


def _stage_reason(profile: StreamProfile, scorer: Scorer, c: Candidate, member: str, pred: StreamPrediction) -> str:
    """Why ``member`` runs where it does under ``c``, in numbers."""
    st = profile.stage(member)
    dev = c.place[member]
    t = seconds_of(profile, c, member)
    rate = pred.rate_of(member)
    per = f"{rate.batches_per_s:.4g} batches/s" if rate else "not limiting"
    if member == profile.source:
        w = c.workers.get(member)
        extra = f" with {w} DataLoader worker processes" if w else ""
        if w and c.settings.loader_threads(member):
            extra = (f" with a thread-pool loader's {w} thread{'s' if w != 1 else ''} "
                     f"({loader_thread_speedup(st, w):.2f}× one thread, "
                     f"{'as measured' if any(r.kind == 'thread' for r in st.scaling) else 'as its GIL share lets'})")
        return f"reads batches on the CPU{extra}: {fmt_s(t)} per batch → {per}"
    if dev == "cpu" and c.settings.sequential:
        why = f"on the CPU: {fmt_s(t)} per batch, one batch at a time → {per}"
    elif dev == "cpu" and c.settings.kind_of(member) == "dask" and profile.cluster is not None:
        from placer.stream.remote import bound

        w, g = c.workers.get(member, 1), c.settings.group_of(member)
        why = (f"as tasks on the cluster {profile.cluster.name}: {fmt_s(t)} per batch here, {w} task"
               f"{'s' if w != 1 else ''} in flight of {g} batch{'es' if g != 1 else ''}, "
               f"{bound(profile, member, profile.cluster, w, g)}-bound → {per}")
    elif dev == "cpu":
        w = c.workers.get(member, 1)
        why = f"on the CPU: {fmt_s(t)} per batch" + (" per worker" if st.role == "batch" else "")
        kind = c.settings.kind_of(member)
        if st.role == "batch" and w > 1:
            why += f"; {w} {kind} workers run {st.speedup(w, kind):.2f}× one ({source_of(profile)})"
        if st.role == "batch" and st.gil_bound:
            why += f"; it holds the GIL (2 threads: {st.speedup(2):.2f}× one)" + (
                ", so processes run it" if kind == "process" else ": process workers would scale it")
        why += f" → {per}"
    else:
        shared = [m for m in rate.members if m != member] if rate else []
        why = f"on {device_title(profile, dev)}: {fmt_s(t)} per batch"
        if shared:
            why += f", sharing it with {', '.join(shared)} ({fmt_s(rate.seconds_per_batch)} per batch)"
        why += f" → {per}"
    return why + _alternatives(profile, scorer, c, member)


def _alternatives(profile: StreamProfile, scorer: Scorer, c: Candidate, member: str) -> str:
    here = scorer.score(c)
    out = []
    for d in options(profile)[member]:
        if d == c.place[member]:
            continue
        new = {**c.place, member: d}
        ws = dict(c.workers)
        if d == "cpu" and profile.stage(member).role == "batch":
            ws[member] = max(worker_options(profile, member))
        alt = c.with_(placement=tuple(new.items()), stage_workers={m: ws.get(m, 1) for m in cpu_members(profile, new)})
        v = scorer.score(alt)
        if not v or not here:
            ratio = ""
        elif abs(v / here - 1) <= TIE:
            ratio = " (the same)"
        else:
            ratio = f" ({here / v:.2f}× slower)" if here > v else f" ({v / here:.2f}× faster)"
        out.append(f"on {device_title(profile, d)} the stream would run {v:,.0f} samples/s{ratio}")
    return ("; " + "; ".join(out)) if out else ""


def _plan_reasons(profile: StreamProfile, scorer: Scorer, c: Candidate, pred: StreamPrediction, how: str) -> list[str]:
    on = f" on {target_label(profile.target)}" if profile.target else ""
    out = [f"predicted {pred.samples_per_s:,.1f} samples/s{on} ({pred.batches_per_s:.4g} batches/s); "
           f"bottleneck: {pred.bottleneck}" + _next_rate(pred)]
    dev = c.place[profile.step]
    take = profile.consumer_samples_per_s.get(dev)
    if take:
        share = pred.samples_per_s / take
        takes = f"would take (predicted for {target_label(profile.target)})" if profile.target else "takes"
        out.append(f"the step alone {takes} {take:,.1f} samples/s on prepared batches on {device_title(profile, dev)}; "
                   f"the stream feeds it {min(share, 1):.0%} of that" +
                   (": preprocessing holds it back" if take / max(pred.samples_per_s, 1e-12) > 1.3 else ""))
    cfg = c.settings
    if cfg.cache and pred.total_s is not None:
        none = scorer.predict(c.with_(cache=None))
        read = profile.stage(cfg.cache).cached_read_s if cfg.cache == profile.source else None
        what = (f"cache at source {cfg.cache}, by sample: epochs 2..{pred.epochs} read its samples back in each "
                f"epoch's order ({fmt_s(read)} a batch)" if read is not None
                else f"cache after {cfg.cache}: epochs 2..{pred.epochs} start after it")
        out.append(f"{what} ({pred.later_batches_per_s:.4g} batches/s instead of {pred.batches_per_s:.4g}); "
                   f"{fmt_s(pred.total_s)} over {pred.epochs} epochs instead of {fmt_s(none.total_s or 0)}")
    busiest = max(c.workers.items(), key=lambda kv: kv[1], default=None)
    if cfg.sequential:
        par = max((x for x in scorer.seen if not x.settings.sequential and x.place == c.place), key=scorer.score,
                  default=None)
        if par is not None and scorer.score(par) > scorer.score(c) * (1 + TIE):
            # chosen by the measured runs against the model's word: say so, not that the model found it best
            out.append(f"one batch at a time, no workers: the model predicted {scorer.score(par):,.1f} samples/s "
                       "with workers, but measured runs did not beat one batch at a time beyond their noise")
        else:
            out.append("one batch at a time, no workers: nothing to overlap pays for the cores workers would take"
                       + (f" (the best setting with workers: {scorer.score(par):,.1f} samples/s)" if par else ""))
    elif cfg.prefetch != prefetch_for(cfg.stage_workers):
        who = "loader thread" if cfg.loader_threads(profile.source) else "worker process"
        out.append(f"prefetch {cfg.prefetch}: each {who} reads {cfg.prefetch} batches ahead; the depth "
                   "that ran fastest in the verification's interleaved rounds (the notes say by how much)")
    elif busiest and busiest[1] > 2:
        out.append(f"prefetch {cfg.prefetch}: each of {busiest[0]}'s {busiest[1]} workers has a batch waiting")
    else:
        out.append(f"prefetch {cfg.prefetch}: the next batch is ready while one is worked on")
    if cfg.persistent_workers and pred.total_s is not None:
        per_epoch = scorer.predict(c.with_(persistent_workers=False))
        out.append(f"persistent_workers: {profile.source}'s worker processes start once and serve all "
                   f"{pred.epochs} epochs (every epoch reads the same dataset); "
                   f"{fmt_s(pred.total_s)} over the run instead of {fmt_s(per_epoch.total_s or 0)} starting them "
                   "each epoch")
    out.append(_pin_reason(profile, c))
    threads = _threads_reason(profile, c)
    if threads:
        out.append(threads)
    out.append(f"searched: {how}")
    return out


def _next_rate(pred: StreamPrediction) -> str:
    if len(pred.rates) < 2:
        return ""
    a, b = pred.rates[0], pred.rates[1]
    return f" at {a.batches_per_s:.4g} batches/s; next: {b.name} at {b.batches_per_s:.4g}"


def _threads_reason(profile: StreamProfile, c: Candidate) -> str:
    step = profile.stage(profile.step)
    if c.place[profile.step] != "cpu" or not step.torch_seconds or "cpu" not in step.seconds:
        return ""
    own = f"torch's own {profile.torch_threads}" if profile.torch_threads else "torch's own"
    alts = ", ".join(f"{fmt_s(t)} with {n}" for n, t in sorted(step.torch_seconds.items()))
    threads = c.settings.torch_threads
    chosen = f"torch_threads={threads}" if threads else f"torch_threads unchanged ({own})"
    busy = ", ".join(f"{fmt_s(t)} with {n}" for n, t in sorted(step.busy_seconds.items()))
    busy = f"; beside one busy core {busy}" if busy else ""
    return (f"{chosen}: the step takes {fmt_s(step.seconds['cpu'])} per batch with {own} intra-op threads, "
            f"{alts}{busy} (measured, interleaved)")


def _pin_reason(profile: StreamProfile, c: Candidate) -> str:
    both = [x for x in profile.copies if {"pinned", "pageable"} <= set(x.seconds)]
    if both:
        pin = sum(x.seconds["pinned"] for x in both)
        page = sum(x.seconds["pageable"] for x in both)
        return (f"pin_memory={c.settings.pin_memory}: copies to the GPU take {fmt_s(pin)} pinned, "
                f"{fmt_s(page)} pageable "
                f"per batch ({source_of(profile, 'all values measured')})")
    sims = [d for d in profile.devices if d in profile.simulated]
    if sims:
        return (f"pin_memory has no effect on {device_title(profile, sims[0])}: its copies are copies in host "
                "memory")
    return "pin_memory: no copies to an accelerator"
