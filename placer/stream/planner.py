"""Planning a stream: the device of each stage, workers, prefetch, pinned copies and a cache point.

May import: placer.pipeline, placer.devices, placer.errors, placer.data.stream,
placer.optimize.explain (wording), placer.stream.*.

:func:`plan_stream` profiles a stream on this machine (:mod:`placer.stream.profile`),
predicts the throughput of every candidate with the operational model
(:mod:`placer.stream.model`), keeps the best, verifies the best few by short
measured runs when the budget allows, and explains the choice with numbers: a
reason per stage, baselines (``num_workers=0``, ``workers=cores`` with pinned
memory, the rule of thumb, and the user's own DataLoader settings when the source
returns one) and a what-if table of single changes. :func:`plan_from_profile` is
the same choice from a saved profile, without measuring.

The search space is small: a device per stage (those it has implementations for),
1..N thread workers per CPU stage (N: the most measured; process workers too where the
profile measured them, as ``ScalingRow(kind="process")``), DataLoader worker
processes for a Dataset or DataLoader source, pinned or pageable copies (only where
a real GPU measured both), and a cache point (only over several epochs). It is
searched exhaustively up to :data:`EXHAUSTIVE_LIMIT` candidates, else by hill
climbing from the rule of thumb (the best single change, repeated). Prefetch does
not change the modelled steady state; it is set so that every worker of every
stage has a batch waiting.

The objective is the stream's own (samples per second, or seconds over its epochs
when a cache point can pay off), not one of :mod:`placer.optimize.objectives`:
those score a placement of one-shot stages on a cost table, while this one also
chooses workers and a cache point, and reads a stream profile.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from placer.data.stream import Alternative, StageDecision, StreamPlan, StreamProfile, StreamSettings, Verification
from placer.devices import Inventory, discover
from placer.errors import PlacerError
from placer.optimize.explain import fmt_s
from placer.pipeline import Pipeline
from placer.stream.model import Prediction, predict

#: candidates searched exhaustively; beyond it, hill climbing
EXHAUSTIVE_LIMIT = 20_000
#: candidates within this relative distance of the best count as ties (fewer workers win)
TIE = 0.01
#: candidates verified by short measured runs when the budget allows
VERIFY = 3
#: rounds of verification runs (each round runs every candidate once, in turn): at least the first,
#: the rest while the budget lasts
VERIFY_ROUNDS = 5
MIN_VERIFY_ROUNDS = 3
#: the fewest batches of one verification run
VERIFY_BATCHES = 12
#: the least measured gain over the predicted best that replaces it
MIN_GAIN = 0.05
#: the most batches a queue holds
MAX_PREFETCH = 8


@dataclass(frozen=True)
class Candidate:
    """One point of the search: a device per member, and the stream settings.

    The settings are those the runner takes: workers of the CPU members in
    ``stage_workers`` (``workers=0``: one batch at a time, none), ``process`` in
    ``worker_kind`` for stages run by worker processes, prefetch enough to feed every
    worker (:func:`settled` keeps them so).
    """

    placement: tuple[tuple[str, str], ...]
    settings: StreamSettings = field(compare=False, hash=False)
    _key: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", self.settings.key())

    @property
    def place(self) -> dict[str, str]:
        return dict(self.placement)

    @property
    def workers(self) -> dict[str, int]:
        """The workers of each CPU member (none one batch at a time)."""
        return self.settings.stage_workers

    @property
    def processes(self) -> set[str]:
        """The stages run by worker processes."""
        return {m for m, k in self.settings.worker_kind.items() if k == "process"}

    def with_(self, placement: tuple[tuple[str, str], ...] | None = None, **changes: Any) -> Candidate:
        """This candidate moved to ``placement`` and/or with settings ``changes``: process workers only
        for stages on the CPU, torch's threads only for a step on the CPU, prefetch as :func:`settled`."""
        settings = self.settings.override(**changes)
        if placement is None:
            return Candidate(self.placement, settled(settings))
        place = dict(placement)
        kinds = {m: k for m, k in settings.worker_kind.items() if place.get(m) == "cpu"}
        step = self.placement[-1][0]
        threads = settings.torch_threads if place.get(step) in (None, "cpu") else None
        return Candidate(placement, settled(settings.override(worker_kind=kinds, torch_threads=threads)))


def settled(settings: StreamSettings) -> StreamSettings:
    """Settings as the search holds them: one batch at a time has no stage workers or kinds (and the
    default prefetch); with workers, prefetch feeds every worker (:func:`prefetch_for`)."""
    if settings.sequential:
        return settings.override(stage_workers={}, worker_kind={}, prefetch=2)
    return settings.override(workers=1, prefetch=prefetch_for(settings.stage_workers))


def make(placement: tuple[tuple[str, str], ...], workers: dict[str, int], *, cache: str | None = None,
         pin: bool = True, processes: tuple[str, ...] = (), threads: int | None = None,
         sequential: bool = False) -> Candidate:
    """A candidate with ``workers`` per CPU member (or one batch at a time)."""
    if sequential:
        settings = StreamSettings(workers=0, cache=cache, pin_memory=pin, torch_threads=threads)
    else:
        settings = StreamSettings(workers=1, stage_workers=workers, prefetch=prefetch_for(workers), cache=cache,
                                  pin_memory=pin, worker_kind={m: "process" for m in processes},
                                  torch_threads=threads)
    return Candidate(placement, settings)


def prefetch_for(workers: dict[str, int]) -> int:
    """Queue places: at least 2, and as many as the most workers of one stage (each gets a batch)."""
    return min(MAX_PREFETCH, max([2, *workers.values()]))


def device_title(profile: StreamProfile, device: str) -> str:
    """A device in words: ``the CPU``, ``GPU gpu:0``, ``gpu-sim (simulated test device)``."""
    if device == "cpu":
        return "the CPU"
    if device in profile.simulated:
        return f"{device} ({profile.device_titles.get(device, 'simulated test device')})"
    return f"{profile.device_titles.get(device, 'accelerator')} {device}"


# -- the search space --------------------------------------------------------------------------
def options(profile: StreamProfile) -> dict[str, list[str]]:
    """Member → the devices it was measured on (the source stays on the CPU)."""
    return {s.name: (["cpu"] if s.role == "source" else [d for d in profile.devices if d in s.seconds])
            for s in profile.stages}


def worker_options(profile: StreamProfile, member: str, kind: str = "thread") -> list[int]:
    st = profile.stage(member)
    if member == profile.source:
        return list(range(0, min(profile.cores, 8) + 1)) if profile.source_kind != "iterable" else [1]
    most = max([1, *[r.workers for r in st.scaling if r.kind == kind]])
    return list(range(1, most + 1))


def kind_options(profile: StreamProfile, member: str) -> list[str]:
    """``thread``, and ``process`` where the profile measured process workers for the stage."""
    st = profile.stage(member)
    return ["thread", *(["process"] if st.role == "batch" and any(r.kind == "process" for r in st.scaling) else [])]


def cache_options(profile: StreamProfile, epochs: int) -> list[str | None]:
    if epochs < 2 or not profile.batches_per_epoch:
        return [None]
    # after a per-batch stage only: the runner offers batches to its cache as stages finish them
    return [None, *[s.name for s in profile.stages if s.cacheable and s.role == "batch"]]


def torch_options(profile: StreamProfile, place: dict[str, str]) -> list[int | None]:
    """torch's own intra-op threads, and each other count measured for a step on the CPU."""
    if place.get(profile.step) != "cpu":
        return [None]
    return [None, *sorted(profile.stage(profile.step).torch_seconds)]


def pin_options(profile: StreamProfile) -> list[bool]:
    both = any({"pinned", "pageable"} <= set(c.seconds) for c in profile.copies)
    return [True, False] if both else [True]


def _cpu_members(profile: StreamProfile, place: dict[str, str]) -> list[str]:
    """Members whose workers matter under ``place``: CPU batch stages, and a DataLoader source."""
    out = [s.name for s in profile.stages if s.role == "batch" and place[s.name] == "cpu"]
    return ([profile.source] if profile.source_kind != "iterable" else []) + out


def candidates(profile: StreamProfile, epochs: int) -> Iterator[Candidate]:
    """Every candidate of the space, placements first."""
    opts = options(profile)
    names = list(opts)
    for devs in itertools.product(*(opts[n] for n in names)):
        place = tuple(zip(names, devs))
        cpu = _cpu_members(profile, dict(place))
        for kinds in itertools.product(*(kind_options(profile, m) for m in cpu)):
            procs = tuple(m for m, k in zip(cpu, kinds) if k == "process")
            for ws in itertools.product(*(worker_options(profile, m, k) for m, k in zip(cpu, kinds))):
                for cache in cache_options(profile, epochs):
                    for pin in pin_options(profile):
                        for threads in torch_options(profile, dict(place)):
                            yield make(place, dict(zip(cpu, ws)), cache=cache, pin=pin, processes=procs,
                                       threads=threads)
        for cache in cache_options(profile, epochs):
            for pin in pin_options(profile):
                for threads in torch_options(profile, dict(place)):
                    yield make(place, {}, cache=cache, pin=pin, threads=threads, sequential=True)


def space_size(profile: StreamProfile, epochs: int) -> int:
    opts = options(profile)
    total = 0
    for devs in itertools.product(*opts.values()):
        n = len(torch_options(profile, dict(zip(opts, devs))))
        for m in _cpu_members(profile, dict(zip(opts, devs))):
            n *= sum(len(worker_options(profile, m, k)) for k in kind_options(profile, m))
        total += n + len(torch_options(profile, dict(zip(opts, devs))))  # and one batch at a time
    return total * len(cache_options(profile, epochs)) * len(pin_options(profile))


# -- scoring -------------------------------------------------------------------------------------
class Scorer:
    """Predictions of candidates under one objective (cached)."""

    def __init__(self, profile: StreamProfile, objective: str, epochs: int):
        self.profile, self.objective, self.epochs = profile, objective, epochs
        self.seen: dict[Candidate, Prediction] = {}

    def predict(self, c: Candidate) -> Prediction:
        if c not in self.seen:
            self.seen[c] = predict(self.profile, c.place, c.settings, epochs=self.epochs)
        return self.seen[c]

    def value(self, pred: Prediction) -> float:
        """Larger is better: samples per second, or the mean over the epochs for total time."""
        return pred.mean_samples_per_s if self.objective == "total_time" else pred.samples_per_s

    def score(self, c: Candidate) -> float:
        return self.value(self.predict(c))


def _cost(c: Candidate, rule: dict[str, str], profile: StreamProfile | None = None) -> tuple:
    """Among ties: fewer workers, threads rather than processes, no cache (else the latest cache point:
    it removes the most work from later epochs), torch's own threads, fewer departures from the rule of
    thumb."""
    s = c.settings
    later = -profile.members.index(s.cache) if profile is not None and s.cache in profile.members else 0
    return (sum(c.workers.values()), len(c.processes), s.cache is not None, later,
            s.torch_threads is not None, sum(rule.get(m) != d for m, d in c.placement))


def search(profile: StreamProfile, scorer: Scorer, rule: Candidate) -> tuple[list[Candidate], str, int]:
    """The candidates best first (ties broken by :func:`_cost`), how they were searched, and how many."""
    size = space_size(profile, scorer.epochs)
    if size <= EXHAUSTIVE_LIMIT:
        pool = list(candidates(profile, scorer.epochs))
        how = f"exhaustive over {size:,} candidates"
    else:
        pool = _climb(profile, scorer, rule)
        how = f"hill climbing from the rule of thumb ({size:,} candidates is too many to try each)"
    scored = sorted(pool, key=scorer.score, reverse=True)
    top = scorer.score(scored[0])
    place = rule.place
    ties = sorted([c for c in scored if scorer.score(c) >= top * (1 - TIE)], key=lambda c: _cost(c, place, profile))
    rest = [c for c in scored if c not in set(ties)]
    return ties + rest, how, len(pool)


def neighbours(profile: StreamProfile, c: Candidate, epochs: int) -> Iterator[Candidate]:
    """Single changes: one member's device, one stage's workers, the cache point, pinned copies, one
    batch at a time (or workers again)."""
    place, s = c.place, c.settings
    if s.sequential:
        yield c.with_(workers=1, stage_workers={m: _default_workers(profile, m) for m in _cpu_members(profile, place)})
    else:
        yield c.with_(workers=0)
    workers = c.workers
    for m, devs in options(profile).items():
        for d in devs:
            if d != place[m]:
                new = {**place, m: d}
                ws = {k: workers.get(k, 1) for k in _cpu_members(profile, new)}
                yield c.with_(placement=tuple(new.items()), stage_workers=ws)
    for m in _cpu_members(profile, place) if not s.sequential else []:
        kind = s.kind_of(m)
        for w in worker_options(profile, m, kind):
            if w != workers.get(m):
                yield c.with_(stage_workers={**workers, m: w})
        for other in kind_options(profile, m):
            if other != kind:
                kinds = {p: k for p, k in s.worker_kind.items() if p != m} | ({m: other} if other != "thread" else {})
                w = min(workers.get(m, 1), max(worker_options(profile, m, other)))
                yield c.with_(worker_kind=kinds, stage_workers={**workers, m: w})
    for cache in cache_options(profile, epochs):
        if cache != s.cache:
            yield c.with_(cache=cache)
    for threads in torch_options(profile, place):
        if threads != s.torch_threads:
            yield c.with_(torch_threads=threads)
    for pin in pin_options(profile):
        if pin != s.pin_memory:
            yield c.with_(pin_memory=pin)


def _climb(profile: StreamProfile, scorer: Scorer, start: Candidate) -> list[Candidate]:
    seen = [start]
    cur = start
    while True:
        near = list(neighbours(profile, cur, scorer.epochs))
        seen += near
        best = max(near, key=scorer.score, default=cur)
        if scorer.score(best) <= scorer.score(cur) * (1 + 1e-9):
            return seen
        cur = best


# -- baselines and what-ifs ----------------------------------------------------------------------
def rule_of_thumb(profile: StreamProfile) -> dict[str, str]:
    """Preprocess on the CPU, train or infer on the first accelerator (where each can run)."""
    opts = options(profile)
    accel = next((d for d in profile.devices if d != "cpu"), None)
    out = {}
    for s in profile.stages:
        want = accel if s.role == "step" and s.kind in ("training", "inference") and accel else "cpu"
        out[s.name] = want if want in opts[s.name] else opts[s.name][0]
    return out


def _candidate(profile: StreamProfile, place: dict[str, str], workers: int = 1, cache: str | None = None,
               pin: bool = True) -> Candidate:
    ws = {m: (workers if m != profile.source else _source_default(profile)) for m in _cpu_members(profile, place)}
    return make(tuple(place.items()), ws, cache=cache, pin=pin)


def _default_workers(profile: StreamProfile, member: str) -> int:
    return _source_default(profile) if member == profile.source else 1


def _source_default(profile: StreamProfile) -> int:
    return profile.loader.num_workers if profile.loader is not None else 0


def baselines(profile: StreamProfile, scorer: Scorer, plan_value: float) -> list[Alternative]:
    """The usual settings, predicted: ``num_workers=0``, ``workers=cores`` with pinned memory, the rule of
    thumb, and the user's DataLoader when the source returns one."""
    rule = rule_of_thumb(profile)
    out = []
    rows = [("num_workers=0", "every batch through every stage in turn", StreamSettings(workers=0), None),
            ("rule of thumb", "preprocess on the CPU, the step on the accelerator; 1 worker per stage",
             None, _candidate(profile, rule)),
            (f"workers={profile.cores}, pin_memory", f"{profile.cores} workers per CPU stage, pinned copies", None,
             _candidate(profile, rule, workers=profile.cores, pin=True))]
    if profile.loader is not None:
        lo = profile.loader
        rows.append(("your DataLoader", f"as given: num_workers={lo.num_workers}, pin_memory={lo.pin_memory}",
                     None, _candidate(profile, rule)))
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
    changed = [m for m in wb if wa.get(m) != wb[m] or sa.kind_of(m) != sb.kind_of(m)]
    if changed:
        m = changed[0]
        kind = ("DataLoader worker processes" if m == profile.source else
                "process workers" if m in b.processes else "workers")
        return f"{wb[m]} {kind} on {m}"
    if sa.cache != sb.cache:
        return f"cache after {sb.cache} (from epoch 2)" if sb.cache else "no cache"
    if sa.torch_threads != sb.torch_threads:
        return (f"{sb.torch_threads} torch intra-op thread{'s' if sb.torch_threads != 1 else ''} for the step"
                if sb.torch_threads else "torch's own intra-op threads")
    return "pinned copies" if sb.pin_memory else "pageable copies"


# -- reasons -------------------------------------------------------------------------------------
def seconds_of(profile: StreamProfile, c: Candidate, member: str) -> float:
    """A member's seconds per batch under ``c``: on its device, at ``c``'s torch threads where measured."""
    st = profile.stage(member)
    dev = c.place[member]
    threads = c.settings.torch_threads
    if dev == "cpu" and threads in st.torch_seconds:
        return st.torch_seconds[threads]
    return st.seconds[dev]


def _stage_reason(profile: StreamProfile, scorer: Scorer, c: Candidate, member: str, pred: Prediction) -> str:
    """Why ``member`` runs where it does under ``c``, in numbers."""
    st = profile.stage(member)
    dev = c.place[member]
    t = seconds_of(profile, c, member)
    rate = pred.rate_of(member)
    per = f"{rate.batches_per_s:.4g} batches/s" if rate else "not limiting"
    if member == profile.source:
        w = c.workers.get(member)
        extra = f" with {w} DataLoader worker processes" if w else ""
        return f"reads batches on the CPU{extra}: {fmt_s(t)} per batch → {per}"
    if dev == "cpu" and c.settings.sequential:
        why = f"on the CPU: {fmt_s(t)} per batch, one batch at a time → {per}"
    elif dev == "cpu":
        w = c.workers.get(member, 1)
        why = f"on the CPU: {fmt_s(t)} per batch" + (" per worker" if st.role == "batch" else "")
        kind = c.settings.kind_of(member)
        if st.role == "batch" and w > 1:
            why += f"; {w} {kind} workers run {st.speedup(w, kind):.2f}× one (measured)"
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
        alt = c.with_(placement=tuple(new.items()), stage_workers={m: ws.get(m, 1) for m in _cpu_members(profile, new)})
        v = scorer.score(alt)
        if not v or not here:
            ratio = ""
        elif abs(v / here - 1) <= TIE:
            ratio = " (the same)"
        else:
            ratio = f" ({here / v:.2f}× slower)" if here > v else f" ({v / here:.2f}× faster)"
        out.append(f"on {device_title(profile, d)} the stream would run {v:,.0f} samples/s{ratio}")
    return ("; " + "; ".join(out)) if out else ""


def _plan_reasons(profile: StreamProfile, scorer: Scorer, c: Candidate, pred: Prediction, how: str) -> list[str]:
    out = [f"predicted {pred.samples_per_s:,.1f} samples/s ({pred.batches_per_s:.4g} batches/s); "
           f"bottleneck: {pred.bottleneck}" + _next_rate(pred)]
    dev = c.place[profile.step]
    take = profile.consumer_samples_per_s.get(dev)
    if take:
        share = pred.samples_per_s / take
        out.append(f"the step alone takes {take:,.1f} samples/s on prepared batches on {device_title(profile, dev)}; "
                   f"the stream feeds it {min(share, 1):.0%} of that" +
                   (": preprocessing holds it back" if take / max(pred.samples_per_s, 1e-12) > 1.3 else ""))
    cfg = c.settings
    if cfg.cache and pred.total_s is not None:
        none = scorer.predict(c.with_(cache=None))
        out.append(f"cache after {cfg.cache}: epochs 2..{pred.epochs} start after it "
                   f"({pred.later_batches_per_s:.4g} batches/s instead of {pred.batches_per_s:.4g}); "
                   f"{fmt_s(pred.total_s)} over {pred.epochs} epochs instead of {fmt_s(none.total_s or 0)}")
    busiest = max(c.workers.items(), key=lambda kv: kv[1], default=None)
    if cfg.sequential:
        par = max((x for x in scorer.seen if not x.settings.sequential and x.place == c.place), key=scorer.score,
                  default=None)
        out.append("one batch at a time, no workers: nothing to overlap pays for the cores workers would take"
                   + (f" (the best setting with workers: {scorer.score(par):,.1f} samples/s)" if par else ""))
    elif busiest and busiest[1] > 2:
        out.append(f"prefetch {cfg.prefetch}: each of {busiest[0]}'s {busiest[1]} workers has a batch waiting")
    else:
        out.append(f"prefetch {cfg.prefetch}: the next batch is ready while one is worked on")
    out.append(_pin_reason(profile, c))
    threads = _threads_reason(profile, c)
    if threads:
        out.append(threads)
    out.append(f"searched: {how}")
    return out


def _next_rate(pred: Prediction) -> str:
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
        return (f"pin_memory={c.settings.pin_memory}: copies to the GPU take {fmt_s(pin)} pinned, {fmt_s(page)} pageable "
                "per batch (all values measured)")
    sims = [d for d in profile.devices if d in profile.simulated]
    if sims:
        return (f"pin_memory has no effect on {device_title(profile, sims[0])}: its copies are copies in host "
                "memory")
    return "pin_memory: no copies to an accelerator"



# -- the plan ------------------------------------------------------------------------------------
def _objective(profile: StreamProfile, objective: str, epochs: int) -> str:
    if objective == "auto":
        return "total_time" if epochs > 1 and profile.batches_per_epoch else "throughput"
    if objective not in ("throughput", "total_time"):
        raise PlacerError(f"unknown stream objective {objective!r}; use throughput, total_time or auto")
    if objective == "total_time" and not profile.batches_per_epoch:
        raise PlacerError("total_time needs the batches of an epoch, which the profile could not count")
    return objective


def plan_from_profile(profile: StreamProfile, *, objective: str = "auto", epochs: int | None = None
                      ) -> tuple[StreamPlan, list[Candidate], Scorer]:
    """The best candidate for a profiled stream, explained (no measuring).

    Returns
    -------
    (StreamPlan, ranked candidates, Scorer)
        The plan, every candidate searched best first, and the scorer (for verification).
    """
    t0 = time.perf_counter()
    e = profile.epochs if epochs is None else epochs
    scorer = Scorer(profile, _objective(profile, objective, e), e)
    rule = _candidate(profile, rule_of_thumb(profile))
    ranked, how, n = search(profile, scorer, rule)
    plan = explain(profile, scorer, ranked[0], how, n)
    plan.planning_s = time.perf_counter() - t0
    return plan, ranked, scorer


def explain(profile: StreamProfile, scorer: Scorer, c: Candidate, how: str = "", n: int = 0) -> StreamPlan:
    """The :class:`StreamPlan` of candidate ``c``: settings, prediction, reasons, baselines, what-ifs."""
    pred = scorer.predict(c)
    cfg = c.settings
    value = scorer.value(pred)
    stages = []
    for s in profile.stages:
        dev = c.place[s.name]
        rate = pred.rate_of(s.name)
        stages.append(StageDecision(
            name=s.name, device=dev, workers=0 if cfg.sequential else c.workers.get(s.name, 1),
            worker_kind=cfg.kind_of(s.name),
            seconds_per_batch=seconds_of(profile, c, s.name), batches_per_s=rate.batches_per_s if rate else 0.0,
            reason=_stage_reason(profile, scorer, c, s.name, pred)))
    start_name = "your DataLoader" if profile.loader is not None else "the rule of thumb"
    notes = [*profile.notes, *pred.notes]
    return StreamPlan(
        pipeline=profile.pipeline, source=profile.source, step=profile.step, objective=scorer.objective,
        epochs=scorer.epochs, placement=c.place, settings=cfg, predicted_samples_per_s=value,
        predicted_total_s=pred.total_s, bottleneck=pred.bottleneck,
        consumer_samples_per_s=profile.consumer_samples_per_s.get(c.place[profile.step]), stages=stages,
        reasons=_plan_reasons(profile, scorer, c, pred, how), baselines=baselines(profile, scorer, value),
        what_if=what_if(profile, scorer, _candidate(profile, rule_of_thumb(profile)), start_name),
        candidates=n, search=how, notes=list(dict.fromkeys(notes)), profile_s=profile.seconds)


def stream_config(plan: StreamPlan | list[StreamPlan], **extra: Any) -> StreamSettings:
    """The :class:`StreamSettings` a plan (or the plans of several streams, merged) chose; ``extra`` on top."""
    plans = plan if isinstance(plan, list) else [plan]
    return StreamSettings.merge([p.settings for p in plans]).override(**extra)


# -- measuring and verifying --------------------------------------------------------------------
def measure(pipeline: Pipeline, source: str, placement: dict[str, str], config: StreamSettings,
            inventory: Inventory, consts: dict[str, Any]) -> tuple[float, int]:
    """Samples per second (steady state) and batches of a short run of one stream."""
    from placer.executor.stream.runner import StreamRun

    devices = {m: inventory.resolve(d, stage=m) for m, d in placement.items()}
    _, stats = StreamRun(pipeline, source, devices, consts, config).run()
    return stats.samples_per_s, stats.batches


def verify(pipeline: Pipeline, profile: StreamProfile, ranked: list[Candidate], scorer: Scorer,
           inventory: Inventory, consts: dict[str, Any], budget_s: float) -> tuple[Candidate, list[Verification]]:
    """Run the best few distinct candidates (one of them with other torch intra-op threads for a step on
    the CPU, where the profile measured them), interleaved, several rounds; keep the predicted best
    unless another measured faster by more than the noise.

    Every round runs each candidate once, in turn, so that a change of load on a shared
    machine falls on all of them alike; each run reads as many batches as the budget
    allows at the candidate's rate (predicted, then as measured; at least
    :data:`VERIFY_BATCHES`, at most the stream's whole length). Three rounds always run,
    up to five while the budget lasts. The predicted best is replaced only by a candidate
    whose median exceeds its own by more than :data:`MIN_GAIN` *and* that ran faster
    than it in most rounds (the noise of a shared machine moves whole rounds; within a
    round it mostly cancels); among several, the fastest median.
    """
    top = _distinct(ranked, VERIFY)
    total = (profile.batches_per_epoch or 0) * scorer.epochs or None
    rounds = VERIFY_ROUNDS
    runs: dict[int, list[tuple[float, int, float]]] = {i: [] for i in range(len(top))}
    skipped: set[int] = set()
    t_end = time.perf_counter() + budget_s
    for r in range(rounds):
        for i, c in enumerate(top):
            if i in skipped or (r >= MIN_VERIFY_ROUNDS and time.perf_counter() > t_end):
                continue
            share = budget_s / (len(top) * MIN_VERIFY_ROUNDS)
            rate = scorer.predict(c).batches_per_s  # then as measured: a model that is off sizes runs badly
            if runs[i]:
                rate = statistics.median(b / t for _, b, t in runs[i] if t > 0)
            n = max(VERIFY_BATCHES, int(rate * share * 0.8))
            n = min(n, total) if total else n
            t = time.perf_counter()
            try:
                sps, b = measure(pipeline, profile.source, c.place, c.settings.override(max_batches=n), inventory,
                                 consts)
                runs[i].append((sps, b, time.perf_counter() - t))
            except PlacerError:  # a setting this executor cannot run here: not verified
                skipped.add(i)
    done = [i for i in range(len(top)) if runs[i]]
    if 0 not in done:
        return top[0], []
    med = {i: statistics.median(x for x, _, _ in runs[i]) for i in done}
    rows = [Verification(name="plan" if i == 0 else f"candidate {i + 1}", placement=top[i].place,
                         config=top[i].settings.decisions(),
                         predicted_samples_per_s=scorer.score(top[i]),
                         measured_samples_per_s=med[i], batches=runs[i][-1][1],
                         runs=[x for x, _, _ in runs[i]]) for i in done]
    better = [i for i in done[1:] if med[i] > med[0] * (1 + MIN_GAIN) and _wins(runs[i], runs[0])]
    chosen = top[max(better, key=lambda i: med[i])] if better else top[0]
    return chosen, rows


def _wins(mine: list[tuple[float, int, float]], plan: list[tuple[float, int, float]]) -> bool:
    """Whether ``mine`` ran faster than the plan in most of the rounds both ran (at least two): runs of
    one round share the machine's load of that moment, so comparing within rounds cancels most of it."""
    pairs = list(zip(mine, plan))
    return len(pairs) >= 2 and sum(a[0] > b[0] for a, b in pairs) * 2 > len(pairs)


def _distinct(ranked: list[Candidate], n: int) -> list[Candidate]:
    """The first ``n`` candidates that differ in more than the workers of one stage by one; the last
    place goes to the best with other torch intra-op threads for the step when none of them has other
    threads (how a step shares the cores with workers is the model's least certain term, so it is
    measured)."""
    out: list[Candidate] = []
    for c in ranked:
        if all(_far(c, o) for o in out):
            out.append(c)
        if len(out) == n:
            break
    threads = out[0].settings.torch_threads if out else None
    if len(out) > 1 and all(c.settings.torch_threads == threads for c in out):
        other = next((c for c in ranked if c.settings.torch_threads != threads), None)
        if other is not None:
            out[-1] = other
    return out


def _far(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` and ``b`` differ in more than the workers of one stage by one."""
    # prefetch follows the workers (:func:`settled`)
    rest = {"stage_workers", "prefetch"}
    if a.placement != b.placement or a.settings.model_dump(exclude=rest) != b.settings.model_dump(exclude=rest):
        return True
    wa, wb = a.workers, b.workers
    return sum(abs(wa.get(k, 1) - wb.get(k, 1)) for k in {*wa, *wb}) > 1


def plan_stream(pipeline: Pipeline, *, source: str | None = None, budget_s: float = 10.0,
                inventory: Inventory | None = None, objective: str = "auto", epochs: int | None = None,
                verify_runs: bool = True, profile: StreamProfile | None = None) -> StreamPlan:
    """Profile, model and plan one stream of ``pipeline`` on this machine.

    Parameters
    ----------
    pipeline : Pipeline
    source : str, optional
        The stream's source (default: the first stream).
    budget_s : float
        Seconds for profiling (about half) and verifying the best few candidates by
        short measured runs, interleaved (the rest; skipped when under a second is left;
        the three rounds it always runs may take longer).
    inventory : Inventory, optional
        The devices (default: discovered; ``gpu-sim`` under ``PLACER_TEST_DEVICES=1``).
    objective : {"auto", "throughput", "total_time"}
        Samples per second in steady state, or seconds over the epochs (where a
        cache point pays off); ``auto``: total time when there are several epochs.
    epochs : int, optional
        Epochs for ``total_time`` (default: the source's).
    verify_runs : bool
        Verify the best few candidates by running them.
    profile : StreamProfile, optional
        Plan from this profile instead of measuring (no verification).

    Returns
    -------
    StreamPlan
    """
    from placer.stream.profile import one_shot_inputs, profile_stream

    p = pipeline.validate()
    if not p.streams():
        raise PlacerError(f"pipeline {p.name!r} has no stream to plan")
    source = source or next(iter(p.streams()))
    if profile is not None:
        return plan_from_profile(profile, objective=objective, epochs=epochs)[0]
    inv = inventory or discover()
    t0 = time.perf_counter()
    consts = one_shot_inputs(p, source, inv)
    prof = profile_stream(p, source, budget_s=0.5 * budget_s, inventory=inv, consts=consts)
    plan, ranked, scorer = plan_from_profile(prof, objective=objective, epochs=epochs)
    left = budget_s - (time.perf_counter() - t0)
    if verify_runs and left >= 1.0:
        chosen, rows = verify(p, prof, ranked, scorer, inv, consts, left)
        if chosen != ranked[0]:
            plan = explain(prof, scorer, chosen, plan.search, plan.candidates)
            plan.notes.append("the predicted best ran slower than another candidate by more than the runs' "
                              "spread; the faster one was kept")
        plan.verified = rows
    plan.planning_s = time.perf_counter() - t0 - prof.seconds
    return plan


def plan_streams(pipeline: Pipeline, **kwargs: Any) -> list[StreamPlan]:
    """:func:`plan_stream` for every stream of ``pipeline`` (the budget split between them)."""
    streams = list(pipeline.validate().streams())
    budget = kwargs.pop("budget_s", 10.0) / max(1, len(streams))
    return [plan_stream(pipeline, source=s, budget_s=budget, **kwargs) for s in streams]
