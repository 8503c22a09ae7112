"""Planning a stream: the device of each stage, workers, prefetch, pinned copies and a cache point.

May import: placer.pipeline, placer.devices, placer.errors, placer.data.stream, placer.stream.*.

:func:`plan_stream` profiles a stream on this machine (:mod:`placer.stream.profile`),
predicts the throughput of every candidate with the operational model
(:mod:`placer.stream.model`), keeps the best (:mod:`placer.stream.search`), verifies
the best few by short measured runs when the budget allows
(:mod:`placer.stream.verify`), and explains the choice with numbers
(:mod:`placer.stream.reasons`): a reason per stage, baselines and a what-if table of
single changes. :func:`plan_from_profile` is the same choice from a saved profile,
without measuring; :func:`stream_config` gives the settings to run several plans with.

The objective is the stream's own (seconds over its epochs, worker start-up and a
cache's later epochs included, where the batches of an epoch are known; else samples per
second), not one of :mod:`placer.optimize.objectives`:
those score a placement of one-shot stages on a cost table, while this one also
chooses workers and a cache point, and reads a stream profile.
"""

from __future__ import annotations

import time
from typing import Any

from placer.data.stream import StreamPlan, StreamProfile, StreamSettings
from placer.devices import Inventory, discover
from placer.errors import PlacerError
from placer.pipeline import Pipeline
from placer.stream.precision import annotate, apply, check_step
from placer.stream.reasons import explain
from placer.stream.search import (Candidate, Scorer, candidates, make, prefetch_for, rule_candidate, rule_of_thumb,
                                  search)
from placer.stream.verify import verify

__all__ = ["Candidate", "Scorer", "candidates", "make", "plan_from_profile", "plan_stream", "plan_streams",
           "stream_config"]


def _objective(profile: StreamProfile, objective: str, epochs: int) -> str:
    if objective == "auto":
        return "total_time" if profile.batches_per_epoch else "throughput"
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
    rule = rule_candidate(profile, rule_of_thumb(profile))
    ranked, how, n = search(profile, scorer, rule)
    plan = explain(profile, scorer, ranked[0], how, n)
    plan.planning_s = time.perf_counter() - t0
    return plan, ranked, scorer


def stream_config(plan: StreamPlan | list[StreamPlan], **extra: Any) -> StreamSettings:
    """The :class:`StreamSettings` a plan (or the plans of several streams, merged) chose; ``extra`` on top."""
    plans = plan if isinstance(plan, list) else [plan]
    return StreamSettings.merge([p.settings for p in plans]).override(**extra)


def plan_stream(pipeline: Pipeline, *, source: str | None = None, budget_s: float = 10.0,
                inventory: Inventory | None = None, objective: str = "auto", epochs: int | None = None,
                verify_runs: bool = True, profile: StreamProfile | None = None,
                profiles: list[StreamProfile] | None = None, precision: str | None = None,
                step_precisions: list | None = None, cluster: Any = None) -> StreamPlan:
    """Profile, model and plan one stream of ``pipeline`` on this machine.

    Parameters
    ----------
    pipeline : Pipeline
    source : str, optional
        The stream's source (default: the first stream).
    budget_s : float
        Seconds for profiling (about half) and verifying the best few candidates by
        short measured runs, interleaved (the rest; skipped when under a second is left;
        the three rounds it always runs may take longer, and where the plan's gain over one batch
        at a time, or its order with the fastest other candidate, is left undecided, more rounds of
        those may take half the verification's share again; a choice whose DataLoader's worker
        processes feed the step then runs at other read-ahead depths, up to half that share again).
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
    profiles : list, optional
        The profile measured is appended to it (to plan the stream again, for a target).
    precision : str, optional
        ``--precision``'s text. The step's allowed (or fixed) lower precisions are checked for
        accuracy here and planned (:mod:`placer.stream.precision`): the search sees the step's
        time in the precision chosen on each device.
    step_precisions : list, optional
        The step's :class:`~placer.stream.precision.StepPrecision` (or None) is appended to it.
    cluster : distributed.Client, optional
        A dask cluster the stream may offload to: the profile also times each CPU batch stage
        on one of its workers (``StreamStageProfile.remote_ratio``).

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
    prof = profile_stream(p, source, budget_s=0.5 * budget_s, inventory=inv, consts=consts, cluster=cluster)
    if profiles is not None:
        profiles.append(prof)
    sp = check_step(p, source, precision)
    if step_precisions is not None:
        step_precisions.append(sp)
    planned, times, chosen_precision = apply(prof, sp)
    plan, ranked, scorer = plan_from_profile(planned, objective=objective, epochs=epochs)
    left = budget_s - (time.perf_counter() - t0)
    if verify_runs and left >= 1.0:
        plain = plain_candidate(planned)
        chosen, rows = verify(p, planned, ranked, scorer, inv, consts, left, baseline=plain)
        if chosen != ranked[0] or chosen.settings.prefetch != ranked[0].settings.prefetch:
            plan = explain(planned, scorer, chosen, plan.search, plan.candidates)
            plan.notes += _verified_notes(chosen, ranked[0], plain, rows)
        plan.verified = rows
    annotate(plan, sp, times, chosen_precision)
    plan.planning_s = time.perf_counter() - t0 - prof.seconds
    return plan


def plain_candidate(profile: StreamProfile) -> Candidate:
    """The stream as a plain loop runs it: the rule of thumb's placement, one batch at a time, torch's own
    threads (the ``num_workers=0`` baseline)."""
    accel = any(d != "cpu" for d in profile.devices)
    return make(tuple(rule_of_thumb(profile).items()), {}, pin=accel, sequential=True)


def plan_streams(pipeline: Pipeline, **kwargs: Any) -> list[StreamPlan]:
    """:func:`plan_stream` for every stream of ``pipeline`` (the budget split between them)."""
    streams = list(pipeline.validate().streams())
    budget = kwargs.pop("budget_s", 10.0) / max(1, len(streams))
    return [plan_stream(pipeline, source=s, budget_s=budget, **kwargs) for s in streams]


def _verified_notes(chosen: Candidate, best: Candidate, plain: Candidate, rows: list) -> list[str]:
    """What the verification runs changed in the predicted best ``best``: the candidate, and the read-ahead."""
    if chosen == plain:
        return ["the predicted best did not run faster than one batch at a time beyond the runs' noise (by "
                "more than 5 % on the median and in enough interleaved rounds); no change is recommended"]
    out = []
    if chosen != best:
        out.append("the predicted best ran slower than another candidate by more than the runs' spread; the faster "
                   "one was kept")
    depths = {r.name: r for r in rows if r.name.startswith("prefetch ")}
    mine = depths.get(f"prefetch {chosen.settings.prefetch}")
    if mine is not None and len(depths) > 1:
        usual = prefetch_for(chosen.settings.stage_workers)
        others = ", ".join(f"{r.measured_samples_per_s:,.0f} at {r.name.split()[1]}" for r in depths.values()
                           if r is not mine)
        out.append(f"the DataLoader's read-ahead ran at {len(depths)} depths in interleaved rounds: "
                   f"prefetch_factor {chosen.settings.prefetch} at {mine.measured_samples_per_s:,.0f} samples/s "
                   f"({others}); "
                   + (f"{chosen.settings.prefetch} ran faster than {usual} by more than 5 % on the median and in "
                      "most rounds" if chosen.settings.prefetch != usual else
                      f"no other depth ran faster than {usual} by more than 5 % on the median and in most rounds"))
    return out
