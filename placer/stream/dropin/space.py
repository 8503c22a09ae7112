"""The settings the drop-in tries: the first round's, then more workers and other prefetch depths where the
first runs say they may help, and the step's intra-op threads.

May import: placer.data.stream, placer.stream.dropin.trial.
"""

from __future__ import annotations

from placer.data.stream import LoaderSettings
from placer.stream.dropin.trial import Trial


def candidates(user: LoaderSettings, *, cores: int, gpu: bool, iterable: bool) -> list[LoaderSettings]:
    """The settings tried first besides the user's: worker processes 0, 1, 2 and ``cores`` with prefetch
    2 and 4; thread workers (:class:`~placer.executor.stream.threadloader.ThreadLoader`) 1, 2 and ``cores`` with
    prefetch 2 (not for an iterable dataset, whose workers each read their own share). One thread
    worker overlaps loading with the step at no start-up cost, which decides a run of a few seconds
    where worker processes pay their start-up within it.

    For a step on the CPU, each worker count is also tried (prefetch 2) with the step's intra-op
    threads cut to the cores the workers leave (at least one), where that is fewer than the
    user's: workers and the step's threads share the cores, and the pair is what wins or loses
    (workers can win at fewer step threads and lose at the user's).

    The user's own loader with the step at one intra-op thread comes first (a CPU step whose
    threads are more than one): the change that touches nothing but the step's threads, which
    the search must not run out of budget before (worker processes slow to start can spend it).

    They are tried in the order they start in: fewer workers first (processes, then threads, of one
    count), each depth with the step's threads cut right after it; settings slow to
    start (seconds to their first batch) cannot spend the budget before the quick ones are measured.

    More workers than ``cores`` (:func:`more_workers`) and other prefetch depths (:func:`prefetch_depths`)
    are tried afterwards, where the first runs say they may help.
    """
    counts = [user.num_workers] if iterable else sorted({0, 1, 2, cores})
    out = [user.model_copy(update={"torch_threads": 1})] if not gpu and (user.torch_threads or 1) > 1 else []
    for w in counts:
        for pf in (2, 4) if w else (None,):
            s = LoaderSettings(num_workers=w, prefetch_factor=pf, pin_memory=gpu, persistent_workers=w > 0,
                               torch_threads=user.torch_threads)
            if measured_as(s) != measured_as(user) and s not in out:
                out.append(s)
    for w in ([] if iterable else sorted({1, 2, cores})):
        s = LoaderSettings(num_workers=w, prefetch_factor=2, pin_memory=gpu, worker_threads=True,
                           torch_threads=user.torch_threads)
        if measured_as(s) != measured_as(user) and s not in out:
            out.append(s)
    if not gpu:
        for s in list(out):
            left = max(1, cores - s.num_workers)
            if s.num_workers and s.prefetch_factor == 2 and left < (user.torch_threads or 1):
                fewer = s.model_copy(update={"torch_threads": left})
                if fewer not in out:
                    out.append(fewer)
    # sooner to start first (a stable sort: the step's own threads before fewer, at one count and depth)
    return sorted(out, key=lambda s: (s.num_workers, s.worker_threads, s.prefetch_factor or 0))


#: a worker count is worth raising while one more step of it raised the rate by this much
RISE = 0.05


def more_workers(trials: list[Trial], *, cores: int) -> list[LoaderSettings]:
    """The next worker count to try for each kind (processes, threads) whose rate still rises.

    For each kind, the fastest setting measured: when it has the most workers measured for
    its kind and beats the next fewer of that kind (same prefetch and step threads; else
    one fewer worker of the other kind) by :data:`RISE`, one more count (``+1`` up to
    twice the cores, then doubling, at most :data:`MAX_WORKERS`) with the same prefetch.
    Workers beyond the cores pay where loading waits (I/O, sleeps) or releases the GIL.
    An empty list: the rate has stopped rising.
    """
    out = []
    for threads in (False, True):
        kind = [t for t in trials if t.settings.num_workers and t.settings.worker_threads == threads]
        if not kind:
            continue
        top = max(kind, key=lambda t: t.samples_per_s)
        w = top.settings.num_workers
        if w < max(t.settings.num_workers for t in kind) or w >= MAX_WORKERS:
            continue
        below = [t for t in kind if t.settings.num_workers < w
                 and (t.settings.prefetch_factor, t.settings.torch_threads)
                 == (top.settings.prefetch_factor, top.settings.torch_threads)]
        if not below:  # the only count of its kind measured: against the other kind's one fewer
            below = [t for t in trials if t.settings.num_workers == w - 1 and t.settings.num_workers
                     and t.settings.torch_threads == top.settings.torch_threads]
        prev = max(below, key=lambda t: t.settings.num_workers, default=None)
        if prev is not None and top.samples_per_s < prev.samples_per_s * (1 + RISE):
            continue
        nxt = min(MAX_WORKERS, w + 1 if w < 2 * cores else 2 * w)
        out.append(top.settings.model_copy(update={"num_workers": nxt}))
    return out


#: the most workers of one kind the drop-in tries
MAX_WORKERS = 32


#: prefetch depths the drop-in may recommend (batches in flight per worker)
PREFETCH = (1, 2, 4, 8)


def prefetch_depths(best: LoaderSettings, measured: list[LoaderSettings]) -> list[LoaderSettings]:
    """The best setting's workers with the prefetch depths of :data:`PREFETCH` not yet measured."""
    if not best.num_workers:
        return []
    seen = {measured_as(s) for s in measured}
    depths = (best.model_copy(update={"prefetch_factor": pf}) for pf in PREFETCH)
    return [s for s in depths if measured_as(s) not in seen]


#: a worker count whose fastest setting is within this of the fastest's also gets every prefetch depth
DEPTH_NEAR = 0.9


def depth_bases(trials: list[Trial]) -> list[LoaderSettings]:
    """The settings whose other prefetch depths are tried: the fastest with workers, and the fastest
    of another worker count when it is within :data:`DEPTH_NEAR` of it.

    Worker count and depth interact: fewer workers start sooner, and a deeper queue keeps them busy,
    so the fastest count at depth 2 in the first round need not be the fastest at a deeper one.
    """
    with_workers = sorted((t for t in trials if t.settings.num_workers), key=lambda t: -t.score)
    if not with_workers:
        return []
    top = with_workers[0]
    other = next((t for t in with_workers if t.settings.num_workers != top.settings.num_workers), None)
    near = other is not None and other.score >= DEPTH_NEAR * top.score
    return [top.settings] + ([other.settings] if near else [])


def measured_as(s: LoaderSettings) -> LoaderSettings:
    # persistent workers only matter between epochs: a bounded run measures them the same; without
    # workers, neither their kind nor a prefetch depth means anything
    if not s.num_workers:
        return s.model_copy(update={"persistent_workers": False, "worker_threads": False, "prefetch_factor": None})
    return s.model_copy(update={"persistent_workers": False})


def cost(s: LoaderSettings) -> tuple:
    """Orders settings by what they hold: workers (threads before processes), then batches in flight,
    then pinned memory."""
    return (s.num_workers, not s.worker_threads, s.prefetch_factor or 0, s.pin_memory, -(s.torch_threads or 0))


def thread_counts(now: int, workers: int, cores: int) -> list[int]:
    """Intra-op thread counts tried for the step: the cores the workers leave, and 1; fewer than ``now``.

    Tried with or without workers: a step whose threads contend with other work on the
    cores (the loader's, or another program's) can run several times faster on fewer.
    """
    return sorted({n for n in (max(1, cores - workers), 1) if n < now}, reverse=True)


#: rounds of raising the worker count while the rate rises
MORE_ROUNDS = 3


#: runs widening may take: more workers of both kinds for MORE_ROUNDS, then two worker counts' other depths
WIDEN_RUNS = 2 * MORE_ROUNDS + 2 * (len(PREFETCH) - 1)
