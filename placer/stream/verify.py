"""Verifying a stream plan by running the best few candidates, interleaved, several rounds.

May import: placer.pipeline, placer.devices, placer.errors, placer.data.stream, placer.data.run,
placer.stream.{model,rounds,search}; placer.executor.stream (the runner) inside
:func:`measure`.

The model's prediction decides the ranking; short measured runs of the best few
distinct candidates (:func:`verify`) replace the predicted best only when another ran
faster by more than the runs' spread, in most rounds. A choice whose DataLoader's worker
processes feed the step then runs at other read-ahead depths (:func:`_depths`), which the
model leaves out.

The rules. Every round runs each candidate once, in turn (:func:`placer.stream.rounds.interleave`), so
that a change of load on a shared machine falls on all of them alike; each run reads as many batches
as the budget allows at the candidate's rate (predicted, then as measured; at least
:data:`VERIFY_BATCHES`, at most the stream's whole length). Three rounds always run, up to five while
the budget lasts. The predicted best is replaced only by a candidate whose median exceeds its own by
more than :data:`~placer.stream.rounds.MIN_GAIN` *and* that ran faster than it in most rounds (the
noise of a shared machine moves whole rounds; within a round it mostly cancels); among several, the
fastest median. The baseline, one batch at a time, is kept unless the choice beats it beyond the
runs' noise (:func:`placer.stream.rounds.beats`, the drop-in's test of a change to a user's settings):
a change within the runs' noise is no advice. Where the choice's median, or its fastest run, is
``MIN_GAIN`` above the baseline's median but its rounds did not settle it (:func:`_undecided`), or
where the fastest other candidate is within ``MIN_GAIN`` of the choice or above it and neither beat
the other beyond the noise, up to :data:`~placer.stream.rounds.SETTLE_ROUNDS` more rounds of those
run, while :data:`SETTLE_SHARE` more of the budget lasts; then of the choice and its rival the one
faster by median over all rounds, and in most of them, is taken (:func:`_settled`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from placer.data.run import objective_rate
from placer.data.stream import StreamProfile, StreamSettings, Verification
from placer.devices import Inventory
from placer.errors import PlacerError
from placer.pipeline import Pipeline
from placer.stream import rounds
from placer.stream.model import SPINNING, in_worker_processes
from placer.stream.rounds import MIN_GAIN, REPEATS, SETTLE_ROUNDS
from placer.stream.search import Candidate, Scorer

#: candidates verified by short measured runs when the budget allows
VERIFY = 3
#: rounds of verification runs (each round runs every candidate once, in turn): at least the first,
#: the rest while the budget lasts
VERIFY_ROUNDS = 5
#: the fewest batches of one verification run
VERIFY_BATCHES = 12
#: more rounds (:data:`~placer.stream.rounds.SETTLE_ROUNDS`) of the choice and its rival, or one batch at a
#: time, when their rounds left their order undecided (:func:`_to_settle`), while this share more of the budget lasts
SETTLE_SHARE = 0.5
#: the DataLoader read-ahead (``prefetch_factor``) depths a choice whose source's worker processes feed the
#: step runs at beside its own (:func:`_depths`), rounds of them, and the share more of the budget they may take
PREFETCH_DEPTHS = (2, 4, 8)
PREFETCH_ROUNDS = 4
PREFETCH_SHARE = 0.5


def measure(pipeline: Pipeline, source: str, placement: dict[str, str], config: StreamSettings,
            inventory: Inventory, consts: dict[str, Any], objective: str = "throughput") -> tuple[float, int]:
    """Samples per second and batches of a short run of one stream: the steady state, or for ``total_time``
    the run's mean (worker start-up included: over a short run, workers that gain in the steady state can
    gain nothing over the whole run)."""
    from placer.executor.stream.runner import StreamRun

    devices = {m: inventory.resolve(d, stage=m) for m, d in placement.items()}
    _, stats = StreamRun(pipeline, source, devices, consts, config).run()
    return objective_rate(stats, objective), stats.batches


def verify(pipeline: Pipeline, profile: StreamProfile, ranked: list[Candidate], scorer: Scorer,
           inventory: Inventory, consts: dict[str, Any], budget_s: float,
           baseline: Candidate | None = None) -> tuple[Candidate, list[Verification]]:
    """Run the best few distinct candidates (one of them with other torch intra-op threads for a step on
    the CPU, where the profile measured them), interleaved, several rounds; keep the predicted best
    unless another measured faster by more than the noise (the rules: the module's docstring).
    ``baseline`` (one batch at a time, the stream as a plain loop runs it) runs in every round too, and
    the choice must beat it beyond the runs' noise to be recommended."""
    top = _distinct(ranked, VERIFY, processes=lambda c: in_worker_processes(profile, c.settings))
    if baseline is not None and baseline not in top:
        top.append(baseline)
    total = (profile.batches_per_epoch or 0) * scorer.epochs or None
    runs: dict[int, list[tuple[float, int, float]]] = {i: [] for i in range(len(top))}
    skipped: set[int] = set()
    t_end = time.perf_counter() + budget_s
    share = budget_s / (len(top) * REPEATS)

    def sample(c: Candidate, into: list[tuple[float, int, float]], seconds: float = share,
               pace: list[tuple[float, int, float]] | None = None) -> bool:
        """One run of ``c`` (about ``seconds`` long) appended to ``into``; False where this executor cannot
        run it here. Its batches: at the pace of the runs in ``into``, else of ``pace``, else as predicted."""
        rate = scorer.predict(c).batches_per_s  # then as measured: a model that is off sizes runs badly
        if into or pace:
            rate = statistics.median(b / t for _, b, t in (into or pace) if t > 0)
        n = max(VERIFY_BATCHES, int(rate * seconds * 0.8))
        n = min(n, total) if total else n
        t = time.perf_counter()
        try:
            sps, b = measure(pipeline, profile.source, c.place, c.settings.override(max_batches=n), inventory,
                             consts, scorer.objective)
        except PlacerError:  # a setting this executor cannot run here: not verified
            return False
        into.append((sps, b, time.perf_counter() - t))
        return True

    def run(i: int) -> None:
        if not sample(top[i], runs[i]):
            skipped.add(i)

    rounds.interleave(list(range(len(top))), run, VERIFY_ROUNDS,
                      fits=lambda r, i: i not in skipped and (r < REPEATS or time.perf_counter() <= t_end))
    done = [i for i in range(len(top)) if runs[i]]
    if 0 not in done:
        return top[0], []
    base = top.index(baseline) if baseline is not None and baseline in top else None
    pick = _pick(runs, done, base)
    settle = _to_settle(runs, done, pick, base)
    if settle:
        # more rounds of those left undecided, while a share more of the budget lasts: the first rounds alone
        # decide between settings within the runs' noise of each other by chance
        t_more = t_end + SETTLE_SHARE * budget_s
        more = rounds.interleave(settle, run, SETTLE_ROUNDS,
                                 more=lambda r: time.perf_counter() <= t_more and not set(settle) & skipped)
        if more:  # without more rounds, the first rule stands
            pick = _settled(runs, done, base, settle)
    pick = _unspun(done, top, pick, lambda i: _spins(scorer, top[i]))
    med = {i: statistics.median(x for x, _, _ in runs[i]) for i in done}
    rows = [Verification(name="plan" if i == 0 else "one batch at a time" if i == base else f"candidate {i + 1}",
                         placement=top[i].place, config=top[i].settings.decisions(),
                         predicted_samples_per_s=scorer.score(top[i]),
                         measured_samples_per_s=med[i], batches=runs[i][-1][1],
                         runs=[x for x, _, _ in runs[i]]) for i in done]
    if base in done and pick != base and not _beats(runs[pick], runs[base]):
        pick = base
    chosen = top[pick]
    if pick != base and loader_feeds_step(profile, chosen):
        chosen, more = _depths(chosen, sample, runs[pick], PREFETCH_SHARE * budget_s)
        rows += [Verification(name=f"prefetch {c.settings.prefetch}", placement=c.place, config=c.settings.decisions(),
                              predicted_samples_per_s=scorer.score(c),
                              measured_samples_per_s=statistics.median(x for x, _, _ in r), batches=r[-1][1],
                              runs=[x for x, _, _ in r]) for c, r in more]
    return chosen, rows


def loader_feeds_step(profile: StreamProfile, c: Candidate) -> bool:
    """Whether ``c``'s stream is a Dataset or DataLoader source read by worker processes (or a thread-pool
    loader's threads) straight into a step on the CPU: the runner's loop of a script
    (:meth:`~placer.executor.stream.runner.StreamRun.loader_feeds_step`), whose read-ahead is the DataLoader's ``prefetch_factor``."""
    if c.settings.sequential or profile.source_kind == "iterable" or len(profile.members) != 2:
        return False
    w = c.settings.stage_workers.get(profile.source, 0)
    return w > 0 and c.place.get(profile.step, "cpu") == "cpu" and c.settings.kind_of(profile.source) != "dask"


Runs = list[tuple[float, int, float]]


def _depths(choice: Candidate, sample: Callable[..., bool], before: Runs,
            budget_s: float) -> tuple[Candidate, list[tuple[Candidate, Runs]]]:
    """The choice at the DataLoader read-ahead depths of :data:`PREFETCH_DEPTHS` (its own among them), in
    interleaved rounds of runs sized to fit three in ``budget_s``, up to :data:`PREFETCH_ROUNDS` while it lasts
    (none where the shortest runs, at the pace of the choice's runs ``before``, would not fit); another depth
    replaces the choice's where it ran :data:`MIN_GAIN` faster on the median and in most rounds (:func:`_pick`),
    else the choice stands.

    The model leaves prefetch out of the steady state (every worker has a batch waiting at the depth the
    search gives), but a DataLoader hands batches out in order, each from its worker in turn, so one slow
    batch stalls the step unless the others have read ahead: a deeper read-ahead can be a sixth faster with
    the same workers.

    Returns the candidate kept and, for each depth run, the candidate and its runs (empty where none ran).
    """
    mine = choice.settings.prefetch
    twins = [choice] + [Candidate(choice.placement, choice.settings.override(prefetch=d))
                        for d in PREFETCH_DEPTHS if d != mine]
    # the shortest run (VERIFY_BATCHES at the choice's measured pace, its start-up as measured) of every depth,
    # three rounds: the least that decides
    shortest = min((t * min(1.0, VERIFY_BATCHES / b) for _, b, t in before if b > 0), default=0.0)
    seconds = budget_s / (len(twins) * REPEATS)
    if len(twins) < 2 or not before or shortest > seconds:
        return choice, []
    runs: dict[int, Runs] = {k: [] for k in range(len(twins))}
    t_end = time.perf_counter() + budget_s
    failed: list[int] = []

    def run(k: int) -> None:
        if not sample(twins[k], runs[k], seconds, before):
            failed.append(k)

    rounds.interleave(list(runs), run, PREFETCH_ROUNDS, fits=lambda r, k: not failed,
                      more=lambda r: r < REPEATS or time.perf_counter() <= t_end)
    if failed:
        return choice, []
    best = _pick(runs, list(runs), None)
    return twins[best], [(c, runs[k]) for k, c in enumerate(twins)]


def _pick(runs: dict[int, list[tuple[float, int, float]]], done: list[int], base: int | None) -> int:
    """The plan (0), or the fastest candidate by median that beat it by :data:`MIN_GAIN` in most rounds
    (the baseline aside: it is weighed against the pick after, :func:`_beats`)."""
    med = {i: statistics.median(x for x, _, _ in runs[i]) for i in done}
    better = [i for i in done[1:] if i != base and med[i] > med[0] * (1 + MIN_GAIN) and _wins(runs[i], runs[0])]
    return max(better, key=lambda i: med[i]) if better else 0


def _rival(runs: dict[int, list[tuple[float, int, float]]], done: list[int], pick: int, base: int | None) -> int | None:
    """The candidate with the fastest median but ``pick`` and the baseline, if any."""
    others = [i for i in done if i not in (pick, base)]
    return max(others, key=lambda i: statistics.median(x for x, _, _ in runs[i])) if others else None


def _to_settle(runs: dict[int, list[tuple[float, int, float]]], done: list[int], pick: int,
               base: int | None) -> list[int]:
    """The candidates whose order the rounds left undecided, in round order: ``pick`` and its rival
    (:func:`_rival`) where the rival's median is within :data:`MIN_GAIN` below the pick's or above it and
    neither beat the other beyond the noise (:func:`_beats`); ``pick`` and the plan (0) where ``pick``
    replaced the plan without beating it beyond the noise; ``pick`` and the baseline where
    :func:`_undecided`. Empty where all is decided."""
    out: set[int] = set()
    rival = _rival(runs, done, pick, base)
    if rival is not None:
        a, b = runs[pick], runs[rival]
        close = statistics.median(x for x, _, _ in b) >= statistics.median(x for x, _, _ in a) * (1 - MIN_GAIN)
        if close and not _beats(a, b) and not _beats(b, a):
            out |= {pick, rival}
    if pick != 0 and 0 in done and 0 != base and not _beats(runs[pick], runs[0]):
        # the model's plan, replaced on most rounds but not beyond the noise: short runs on a shared machine can
        # reverse a large predicted gain by chance, and more rounds tell the two apart
        out |= {pick, 0}
    if base in done and pick != base and _undecided(runs[pick], runs[base]):
        out |= {pick, base}
    return sorted(out)


def _settled(runs: dict[int, list[tuple[float, int, float]]], done: list[int], base: int | None,
             settle: list[int]) -> int:
    """The choice after the settling rounds: :func:`_pick` over all rounds, or the rival settled beside it
    where its median over all rounds is the faster and it ran faster in most of them. Of two settings that
    more rounds still leave within :data:`MIN_GAIN` of each other, the one measured faster is taken: the
    model's ranking, which chose the plan, is the less certain (its predictions can be off by half)."""
    pick = _pick(runs, done, base)
    rival = _rival(runs, done, pick, base)
    if pick in settle and rival in settle:
        med = {i: statistics.median(x for x, _, _ in runs[i]) for i in (pick, rival)}
        if med[rival] > med[pick] and _wins(runs[rival], runs[pick]):
            return rival
    return pick


def _unspun(done: list[int], top: list[Candidate], pick: int, spins: Callable[[int], bool]) -> int:
    """``pick``, or its twin at other torch threads (:func:`_structure`) where the model slows ``pick``'s workers
    (processes or threads) beside the step's spinning OpenMP threads (``spins``, :func:`_spins`) and not the twin's.

    The script's own loop loses those cores; placer's runner, with a queue between the source and the step,
    does not show it, so its runs are no witness between the two, whatever the lead (the script can run the
    spinning setting at half the speed of its twin). The plain loop is weighed after, against the one kept.
    A DataLoader's workers feeding the step run as the script's loop
    (:meth:`~placer.executor.stream.runner.StreamRun.loader_feeds_step`), whose runs show the cost; thread
    stages beside the step do not, and are treated alike."""
    if not spins(pick):
        return pick
    mine = _structure(top[pick])
    return next((i for i in done if i != pick and _structure(top[i]) == mine and not spins(i)), pick)


def _spins(scorer: Scorer, c: Candidate) -> bool:
    """Whether the model slows ``c``'s worker processes beside its step's extra intra-op threads (the rate
    of :func:`placer.stream.rates.spinning` sets its pace)."""
    return scorer.predict(c).bottleneck.startswith(SPINNING)


def _undecided(mine: list[tuple[float, int, float]], base: list[tuple[float, int, float]]) -> bool:
    """Whether ``mine``'s median, or its fastest run, is :data:`MIN_GAIN` above the baseline's median but its
    rounds did not show it beyond the noise (:func:`_beats`): more rounds may. A fastest run that far above is a
    gain the runs' spread may hide, as the drop-in's :func:`~placer.stream.dropin.within_reach`."""
    a, b = [x for x, _, _ in mine], [x for x, _, _ in base]
    return bool(a and b) and max(a) > statistics.median(b) * (1 + MIN_GAIN) and not _beats(mine, base)


def _wins(mine: list[tuple[float, int, float]], plan: list[tuple[float, int, float]]) -> bool:
    """Whether ``mine`` ran faster than the plan in most of the rounds both ran
    (:func:`placer.stream.rounds.most_rounds`): runs of one round share the machine's load of that moment, so comparing within rounds cancels most of it."""
    return rounds.most_rounds([x for x, _, _ in mine], [x for x, _, _ in plan])


def _beats(mine: list[tuple[float, int, float]], base: list[tuple[float, int, float]]) -> bool:
    """Whether ``mine`` beats one batch at a time by more than the noise, as the drop-in asks of a change to
    a user's settings (:func:`placer.stream.rounds.beats`, its runs paired round by round)."""
    return rounds.beats([x for x, _, _ in mine], [x for x, _, _ in base])


def _distinct(ranked: list[Candidate], n: int,
              processes: Callable[[Candidate], bool] = lambda c: bool(c.processes)) -> list[Candidate]:
    """The first ``n`` candidates that differ in more than the workers of one stage by one, and the best
    that runs its stages the other way (in worker processes, or all in this process: ``processes``; a
    Dataset source's workers are processes too, which the verifier's caller says) when they all run
    them one way; the last place of the first ``n`` goes to the best with other torch intra-op threads for
    the step when none of them has other threads (how a step shares the cores with workers is the model's
    least certain term, so it is measured), and the best two structures run with each thread setting where
    the ranking has them; and when they all share one placement, the best with another placement comes too."""
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
    if out and len({processes(c) for c in out}) == 1:
        # the best that runs its stages the other way, in worker processes or in this process: the model's
        # price of worker processes (their start, each batch's trip through shared memory, the cores a
        # step's threads leave them) is, after the step's threads, its least certain term: a ranking without
        # them can miss a setting that runs the script far faster
        other = next((c for c in ranked if processes(c) != processes(out[0])), None)
        if other is not None:
            out.append(other)
    # the best two structures with each of those thread settings: how a step shares the cores decides
    # between structures too (a structure that loses at torch's own threads can win at one)
    settings = list(dict.fromkeys(c.settings.torch_threads for c in out))
    if len(settings) > 1:
        for c in _structures(out)[:2]:
            for t in settings:
                twin = _twin(c, t, ranked)
                if twin is not None and twin not in out:
                    out.append(twin)
    if out and all(c.placement == out[0].placement for c in out):
        # one more: the best elsewhere. Where a stage may run on another device the placement is the
        # largest decision; on a real H200 the model's three best (preprocessing on the GPU) measured
        # a third of their prediction, and the placement that won ran only as the plain loop
        other = next((c for c in ranked if c.placement != out[0].placement), None)
        if other is not None:
            out.append(other)
    return out


def _structure(c: Candidate) -> tuple:
    """``c`` but for its torch intra-op threads."""
    return c.placement, str(c.settings.model_dump(exclude={"torch_threads"}))


def _structures(out: list[Candidate]) -> list[Candidate]:
    """The first candidate of each structure (:func:`_structure`) in ``out``, in order."""
    seen: dict[tuple, Candidate] = {}
    for c in out:
        seen.setdefault(_structure(c), c)
    return list(seen.values())


def _twin(c: Candidate, threads: int | None, ranked: list[Candidate]) -> Candidate | None:
    """The candidate of ``ranked`` that is ``c`` with ``threads`` torch intra-op threads, if any."""
    mine = _structure(c)
    return next((x for x in ranked if x.settings.torch_threads == threads and x.placement == c.placement
                 and _structure(x) == mine), None)


def _far(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` and ``b`` differ in more than the workers of one stage by one."""
    # prefetch follows the workers (:func:`settled`)
    rest = {"stage_workers", "prefetch"}
    if a.placement != b.placement or a.settings.model_dump(exclude=rest) != b.settings.model_dump(exclude=rest):
        return True
    wa, wb = a.workers, b.workers
    return sum(abs(wa.get(k, 1) - wb.get(k, 1)) for k in {*wa, *wb}) > 1
