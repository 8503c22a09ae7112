"""Searching a stream's settings: the candidates, their predictions, and the best first.

May import: placer.data.stream, placer.stream.model.

A candidate is a placement and the :class:`~placer.data.stream.StreamSettings` the
runner would take (:class:`Candidate`). The space is small: a device per stage (those
it has implementations for), 1..N thread workers per CPU stage (N: the most measured;
process workers too where the profile measured them, as ``ScalingRow(kind="process")``),
DataLoader worker processes for a Dataset or DataLoader source (or a thread-pool
loader's threads, 2 up to the count the profile measured them at), pinned or pageable
copies (only where a real GPU measured both), torch's intra-op threads for a step on
the CPU (where measured), one batch at a time, and a cache point (only over several
epochs). :func:`search` tries each up to :data:`EXHAUSTIVE_LIMIT` candidates, else
climbs from the rule of thumb (the best single change, repeated); among candidates
within :data:`TIE` of the best, :func:`tie_cost` prefers the fewest workers. Prefetch
does not change the modelled steady state; it is set so that every worker of every
stage has a batch waiting (:func:`prefetch_for`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from placer.data.stream import StreamProfile, StreamSettings
from placer.stream.model import StreamPrediction, predict

#: candidates searched exhaustively; beyond it, hill climbing
EXHAUSTIVE_LIMIT = 20_000
#: candidates within this relative distance of the best count as ties (fewer workers win)
TIE = 0.01
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

    @property
    def remote(self) -> set[str]:
        """The stages run as tasks on a cluster."""
        return {m for m, k in self.settings.worker_kind.items() if k == "dask"}

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
    kinds = {m: k for m, k in settings.worker_kind.items() if settings.stage_workers.get(m, 1) > 0}
    return settings.override(workers=1, worker_kind=kinds, prefetch=prefetch_for(settings.stage_workers))


def make(placement: tuple[tuple[str, str], ...], workers: dict[str, int], *, cache: str | None = None,
         pin: bool = True, processes: tuple[str, ...] = (), threads: int | None = None,
         sequential: bool = False, remote: dict[str, int] | None = None,
         loader_threads: str | None = None) -> Candidate:
    """A candidate with ``workers`` per CPU member (or one batch at a time); ``remote``: stage → batches per
    task of the stages run as tasks on a cluster; ``loader_threads``: a Dataset or DataLoader source read by
    a thread-pool loader's threads (its workers), not DataLoader's worker processes."""
    remote = remote or {}
    if sequential:
        settings = StreamSettings(workers=0, cache=cache, pin_memory=pin, torch_threads=threads)
    else:
        settings = StreamSettings(workers=1, stage_workers=workers, prefetch=prefetch_for(workers), cache=cache,
                                  pin_memory=pin, worker_kind={**{m: "process" for m in processes},
                                                               **dict.fromkeys(remote, "dask"),
                                                               **({loader_threads: "thread"} if loader_threads
                                                                  else {})},
                                  torch_threads=threads, stage_group=dict(remote))
    return Candidate(placement, settings)


def prefetch_for(workers: dict[str, int]) -> int:
    """Queue places: at least 2, and as many as the most workers of one stage (each gets a batch)."""
    return min(MAX_PREFETCH, max([2, *workers.values()]))


# -- the space --------------------------------------------------------------------------------------
def options(profile: StreamProfile) -> dict[str, list[str]]:
    """Member → the devices it was measured on (the source stays on the CPU)."""
    return {s.name: (["cpu"] if s.role == "source" else [d for d in profile.devices if d in s.seconds])
            for s in profile.stages}


def worker_options(profile: StreamProfile, member: str, kind: str = "thread") -> list[int]:
    st = profile.stage(member)
    if member == profile.source:
        if profile.source_kind == "iterable":
            return [1]
        if kind == "thread":  # a thread-pool loader: 2 up to the threads measured (1: the source's own thread)
            return list(range(2, max([1, *[r.workers for r in st.scaling if r.kind == "thread"]]) + 1))
        # here, at most 8 (each is measured in verification); on a described target, up to its cores
        return list(range(0, (profile.cores if profile.target else min(profile.cores, 8)) + 1))
    if kind == "dask":  # tasks in flight: powers of two up to the cluster's threads, and its threads
        n = profile.cluster.threads if profile.cluster is not None else 1
        return sorted({*(1 << i for i in range(n.bit_length()) if 1 << i <= n), n})
    most = max([1, *[r.workers for r in st.scaling if r.kind == kind]])
    return list(range(1, most + 1))


def kind_options(profile: StreamProfile, member: str) -> list[str]:
    """``thread``, ``process`` where the profile measured process workers for the stage, and ``dask``
    where the profile has a cluster (:attr:`StreamProfile.cluster`). A Dataset or DataLoader source:
    ``process`` (DataLoader's worker processes), and ``thread`` (a thread-pool loader) where the profile
    measured the source read by several threads."""
    st = profile.stage(member)
    if member == profile.source and profile.source_kind != "iterable":
        return ["process", *(["thread"] if any(r.kind == "thread" and r.workers >= 2 for r in st.scaling) else [])]
    batch = st.role == "batch"
    return ["thread", *(["process"] if batch and any(r.kind == "process" for r in st.scaling) else []),
            *(["dask"] if batch and profile.cluster is not None else [])]


def remote_groups(profile: StreamProfile, members: list[str], kinds: tuple[str, ...]) -> dict[str, int]:
    """Batches per task of the members run as tasks on the profile's cluster (:func:`choose_group`)."""
    from placer.stream.remote import choose_group

    return {m: choose_group(profile, m, profile.cluster) for m, k in zip(members, kinds) if k == "dask"}


def cache_options(profile: StreamProfile, epochs: int) -> list[str | None]:
    if epochs < 2 or not profile.batches_per_epoch:
        return [None]
    # after a per-batch stage (the runner offers batches to its cache as stages finish them), or at a
    # reshuffling Dataset source, by sample (its samples read back in each epoch's new order)
    return [None, *[s.name for s in profile.stages if s.cacheable and s.role == "batch"
                    or s.role == "source" and s.cached_read_s is not None]]


def torch_options(profile: StreamProfile, place: dict[str, str]) -> list[int | None]:
    """torch's own intra-op threads, and each other count measured for a step on the CPU."""
    if place.get(profile.step) != "cpu":
        return [None]
    return [None, *sorted(profile.stage(profile.step).torch_seconds)]


def pin_options(profile: StreamProfile) -> list[bool]:
    both = any({"pinned", "pageable"} <= set(c.seconds) for c in profile.copies)
    return [True, False] if both else [True]


def cpu_members(profile: StreamProfile, place: dict[str, str]) -> list[str]:
    """Members whose workers matter under ``place``: CPU batch stages, and a DataLoader source."""
    out = [s.name for s in profile.stages if s.role == "batch" and place[s.name] == "cpu"]
    return ([profile.source] if profile.source_kind != "iterable" else []) + out


def candidates(profile: StreamProfile, epochs: int) -> Iterator[Candidate]:
    """Every candidate of the space, placements first."""
    opts = options(profile)
    names = list(opts)
    for devs in itertools.product(*(opts[n] for n in names)):
        place = tuple(zip(names, devs))
        cpu = cpu_members(profile, dict(place))
        for kinds in itertools.product(*(kind_options(profile, m) for m in cpu)):
            procs = tuple(m for m, k in zip(cpu, kinds) if k == "process" and m != profile.source)
            pool = next((m for m, k in zip(cpu, kinds) if k == "thread" and m == profile.source), None)
            groups = remote_groups(profile, cpu, kinds)
            for ws in itertools.product(*(worker_options(profile, m, k) for m, k in zip(cpu, kinds))):
                for cache in cache_options(profile, epochs):
                    for pin in pin_options(profile):
                        for threads in torch_options(profile, dict(place)):
                            yield make(place, dict(zip(cpu, ws)), cache=cache, pin=pin, processes=procs,
                                       threads=threads, remote=groups, loader_threads=pool)
        for cache in cache_options(profile, epochs):
            for pin in pin_options(profile):
                for threads in torch_options(profile, dict(place)):
                    yield make(place, {}, cache=cache, pin=pin, threads=threads, sequential=True)


def space_size(profile: StreamProfile, epochs: int) -> int:
    opts = options(profile)
    total = 0
    for devs in itertools.product(*opts.values()):
        n = len(torch_options(profile, dict(zip(opts, devs))))
        for m in cpu_members(profile, dict(zip(opts, devs))):
            n *= sum(len(worker_options(profile, m, k)) for k in kind_options(profile, m))
        total += n + len(torch_options(profile, dict(zip(opts, devs))))  # and one batch at a time
    return total * len(cache_options(profile, epochs)) * len(pin_options(profile))


# -- scoring and searching --------------------------------------------------------------------------
class Scorer:
    """Predictions of candidates under one objective (cached)."""

    def __init__(self, profile: StreamProfile, objective: str, epochs: int):
        self.profile, self.objective, self.epochs = profile, objective, epochs
        self.seen: dict[Candidate, StreamPrediction] = {}

    def predict(self, c: Candidate) -> StreamPrediction:
        if c not in self.seen:
            self.seen[c] = predict(self.profile, c.place, c.settings, epochs=self.epochs)
        return self.seen[c]

    def value(self, pred: StreamPrediction) -> float:
        """Larger is better: samples per second, or the mean over the epochs for total time."""
        return pred.mean_samples_per_s if self.objective == "total_time" else pred.samples_per_s

    def score(self, c: Candidate) -> float:
        return self.value(self.predict(c))


def tie_cost(c: Candidate, rule: dict[str, str], profile: StreamProfile | None = None) -> tuple:
    """Among ties: this machine's workers rather than a cluster's, fewer workers, one batch at a time (a stream
    predicted no faster than its members taking turns, :func:`placer.stream.chain.alternating`, gains nothing
    from its threads), threads rather than processes, no cache (else the latest cache point:
    it removes the most work from later epochs), torch's own threads, fewer departures from the rule of
    thumb."""
    s = c.settings
    later = -profile.members.index(s.cache) if profile is not None and s.cache in profile.members else 0
    return (len(c.remote), sum(c.workers.values()), not s.sequential, len(c.processes), s.cache is not None, later,
            s.torch_threads is not None, sum(rule.get(m) != d for m, d in c.placement))


def search(profile: StreamProfile, scorer: Scorer, rule: Candidate) -> tuple[list[Candidate], str, int]:
    """The candidates best first (ties broken by :func:`tie_cost`), how they were searched, and how many."""
    size = space_size(profile, scorer.epochs)
    if size <= EXHAUSTIVE_LIMIT:
        pool = list(candidates(profile, scorer.epochs))
        how = f"exhaustive over {size:,} candidates"
    else:
        pool = _climb(profile, scorer, rule)
        how = f"hill climbing from the rule of thumb ({size:,} candidates is too many to try each)"
    pool = [keep_workers(profile, c, scorer.epochs) for c in pool]
    scored = sorted(pool, key=scorer.score, reverse=True)
    top = scorer.score(scored[0])
    place = rule.place
    ties = sorted([c for c in scored if scorer.score(c) >= top * (1 - TIE)], key=lambda c: tie_cost(c, place, profile))
    rest = [c for c in scored if c not in set(ties)]
    ranked = [keep_workers(profile, useful(profile, scorer, c), scorer.epochs) for c in ties + rest]
    return list(dict.fromkeys(ranked)), how, len(pool)


def keep_workers(profile: StreamProfile, c: Candidate, epochs: int) -> Candidate:
    """``c`` with its source's worker processes kept between epochs (``persistent_workers``) where that
    applies: several epochs, a source whose epochs read the same dataset, unchanged
    (``StreamProfile.same_source``), worker processes for it, and no cache at it (whose later epochs
    read the kept samples, not the loader). Keeping them is never slower: starting them once instead
    of once per epoch (the model prices start and stop per start, :func:`placer.stream.chain.worker_bounds`),
    with the same batches."""
    s = c.settings
    want = bool(profile.same_source and epochs > 1 and not s.sequential and s.cache != profile.source
                and s.stage_workers.get(profile.source, 0) > 0 and not s.loader_threads(profile.source))
    return c if s.persistent_workers == want else c.with_(persistent_workers=want)


def useful(profile: StreamProfile, scorer: Scorer, c: Candidate) -> Candidate:
    """``c`` with no more workers than the model finds useful on this machine.

    Each CPU member's workers are lowered one at a time while the prediction stays within
    :data:`TIE` of ``c``'s: a worker the model predicts no gain from is not asked for (a
    search that did not see every count, e.g. hill climbing, can otherwise keep some).
    """
    if c.settings.sequential:
        return c
    floor = scorer.score(c) * (1 - TIE)
    cur = c
    changed = True
    while changed:
        changed = False
        for m, w in sorted(cur.workers.items()):
            least = 0 if m == profile.source else 1
            if w <= least:
                continue
            fewer = cur.with_(stage_workers={**cur.workers, m: w - 1})
            if scorer.score(fewer) >= floor:
                cur, changed = fewer, True
    return cur


def neighbours(profile: StreamProfile, c: Candidate, epochs: int) -> Iterator[Candidate]:
    """Single changes: one member's device, one stage's workers, the cache point, pinned copies, one
    batch at a time (or workers again)."""
    place, s = c.place, c.settings
    if s.sequential:
        yield c.with_(workers=1, stage_workers={m: default_workers(profile, m) for m in cpu_members(profile, place)})
    else:
        yield c.with_(workers=0)
    workers = c.workers
    for m, devs in options(profile).items():
        for d in devs:
            if d != place[m]:
                new = {**place, m: d}
                ws = {k: workers.get(k, 1) for k in cpu_members(profile, new)}
                yield c.with_(placement=tuple(new.items()), stage_workers=ws)
    for m in cpu_members(profile, place) if not s.sequential else []:
        kind = kind_here(profile, s, m)
        for w in worker_options(profile, m, kind):
            if w != workers.get(m):
                yield c.with_(stage_workers={**workers, m: w})
        for other in kind_options(profile, m):
            if other != kind:
                default = "process" if m == profile.source else "thread"  # a source's kind unset: processes
                kinds = {p: k for p, k in s.worker_kind.items() if p != m} | ({m: other} if other != default else {})
                counts = worker_options(profile, m, other)
                w = min(max(workers.get(m, 1), min(counts)), max(counts))
                groups = {p: g for p, g in s.stage_group.items() if p != m}
                if other == "dask":
                    groups |= remote_groups(profile, [m], ("dask",))
                yield c.with_(worker_kind=kinds, stage_workers={**workers, m: w}, stage_group=groups)
    for cache in cache_options(profile, epochs):
        if cache != s.cache:
            yield c.with_(cache=cache)
    for threads in torch_options(profile, place):
        if threads != s.torch_threads:
            yield c.with_(torch_threads=threads)
    for pin in pin_options(profile):
        if pin != s.pin_memory:
            yield c.with_(pin_memory=pin)


def kind_here(profile: StreamProfile, s: StreamSettings, member: str) -> str:
    """The kind of ``member``'s workers under ``s``: a Dataset or DataLoader source's are DataLoader's
    worker processes unless a thread-pool loader's threads are set (:meth:`StreamSettings.loader_threads`)."""
    if member == profile.source and profile.source_kind != "iterable":
        return "thread" if s.worker_kind.get(member) == "thread" else "process"
    return s.kind_of(member)


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


# -- the rule of thumb -----------------------------------------------------------------------------
def rule_of_thumb(profile: StreamProfile) -> dict[str, str]:
    """Preprocess on the CPU, train or infer on the first accelerator (where each can run)."""
    opts = options(profile)
    accel = next((d for d in profile.devices if d != "cpu"), None)
    out = {}
    for s in profile.stages:
        want = accel if s.role == "step" and s.kind in ("training", "inference") and accel else "cpu"
        out[s.name] = want if want in opts[s.name] else opts[s.name][0]
    return out


def rule_candidate(profile: StreamProfile, place: dict[str, str], workers: int = 1, cache: str | None = None,
               pin: bool = True) -> Candidate:
    ws = {m: (workers if m != profile.source else source_default(profile)) for m in cpu_members(profile, place)}
    return make(tuple(place.items()), ws, cache=cache, pin=pin)


def default_workers(profile: StreamProfile, member: str) -> int:
    return source_default(profile) if member == profile.source else 1


def source_default(profile: StreamProfile) -> int:
    return profile.loader.num_workers if profile.loader is not None else 0
