"""The advise flow, the one orchestration: costs → plan → run (plan and baselines) → report facts.

May import: placer.{pipeline,devices,loader,errors,files,site,report,digest,log,decide}, placer.data;
placer.executor.distributed's errors, placer.target, placer.stream.{planner,precision,rounds,target,work,offload}
inside functions.
torch, dask and numba are
reached only through the site (its profiler and executor).

Every step asks a :mod:`site <placer.site>` (this machine or a dask cluster): its
``costs`` (profile and cost model, with the network on a cluster), ``Costs.plan``,
and its ``execute``. :func:`advise` is what ``placer advise`` runs;
:func:`best_placement` is what ``placer run`` uses when no placement is given;
``placer plan`` and ``placer profile`` call the same site steps. Each step is a small
function, so a caller can stop after any of them and save its result.

The simulated test device (``gpu-sim``, only under ``PLACER_TEST_DEVICES=1``) is
profiled, planned and run like any accelerator here, and reported as what it is.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.data.stream import StreamSettings
from placer.devices import Inventory
from placer.errors import PlacerError, StageFailedError
from placer.log import get_logger
from placer.pipeline import Pipeline
from placer.site import ClusterSite, Costs, LocalSite, accelerators, built_pipeline, open_site  # noqa: F401

#: seconds of profiling allowed by default (`placer advise --budget-s`)
DEFAULT_BUDGET_S = 30.0
#: seconds of profiling `placer run` spends to choose a placement
RUN_BUDGET_S = 10.0
#: devices that may be described for planning when absent (see placer/data/)
TARGETS = ("h200",)

log = get_logger(__name__)


@dataclass
class Advised:
    """Everything the advise flow produced; each part serialises to JSON.

    In a notebook it displays as its report's summary; ``to_pandas()`` gives its tables.

    Attributes
    ----------
    pipeline : Pipeline
        The built pipeline.
    size : int or None
        The size planned and run at.
    profile : Profile
        The measurements (None for a pipeline with streams).
    plan : Plan
        The chosen placement with its reasons (None with streams: see ``stream_plans``).
    run : Run
        The measured run of the plan.
    baselines : dict of str to Run
        ``all_cpu``, ``all_gpu``, ``rule_of_thumb`` as measured (a stream's usual settings).
    costs : CostTable
        The cost table planned from.
    predictions : dict
        Stage → device → the prediction at ``size`` (value, label, error).
    target : dict or None
        The plan for a described absent device (predictions only).
    facts : ReportFacts
        What the report says.
    timings : dict of str to float
        Seconds each step took.
    inventory : Inventory
        The devices.
    stream_plans : list of StreamPlan
        Each stream's plan, for a pipeline with streams.
    stream_target_plans : list of StreamPlan
        Each stream's plan for the described machine ``target=`` names (every number a
        prediction for it); empty without a described target.
    """

    pipeline: Pipeline
    size: int | None
    profile: Any
    plan: Any
    run: Any
    baselines: dict[str, Any] = field(default_factory=dict)
    costs: Any = None
    predictions: dict[str, dict[str, dict]] = field(default_factory=dict)
    target: dict[str, Any] | None = None
    facts: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    inventory: Any = None
    #: for a pipeline with streams: each stream's plan (:class:`~placer.data.stream.StreamPlan`)
    stream_plans: list[Any] = field(default_factory=list)
    #: with a named ``target``: each stream's plan for that machine (every number a prediction)
    stream_target_plans: list[Any] = field(default_factory=list)

    def tables(self) -> dict[str, list[dict]]:
        """The report's tables (``stages``, ``transfers``, ``what_if``) as lists of rows."""
        return self.facts.tables()

    def to_pandas(self, table: str = "stages"):
        """One of the report's tables as a ``pandas.DataFrame``; see :meth:`placer.data.views.Views.to_pandas`.

        Parameters
        ----------
        table : {"stages", "transfers", "what_if"}
            Which table.
        """
        return self.facts.to_pandas(table)

    def _repr_html_(self) -> str:
        return self.facts._repr_html_()

    def save(self, folder: str | Path) -> dict[str, Path]:
        """Write profile, plan, runs and facts as JSON files in ``folder``; return their paths."""
        from placer.files import write_text_atomic

        folder = Path(folder)
        docs = {"profile": self.profile, "plan": self.plan, "run": self.run, "costs": self.costs,
                "inventory": self.inventory,
                **{f"run-{k}": v for k, v in self.baselines.items()},
                **{f"stream-plan-{sp.source}": sp for sp in self.stream_plans},
                **{f"stream-target-plan-{sp.source}": sp for sp in self.stream_target_plans}}
        out = {}
        if self.profile is not None:  # the shape `placer profile -o` saves
            import json

            from placer.data.documents import profile_document
            from placer.site import costs_from_profile

            model = costs_from_profile(self.profile, size=self.size).model
            doc = profile_document(self.profile, model, self.size)
            out["profile"] = write_text_atomic(folder / "profile.json", json.dumps(doc, indent=1, default=str))
            docs.pop("profile")
        for name, obj in docs.items():
            if obj is None:
                continue
            text = obj.model_dump_json(indent=1, by_alias=True)
            out[name] = write_text_atomic(folder / f"{name}.json", text)
        if self.facts is not None:
            out["report"] = write_text_atomic(folder / "report.json", self.facts.to_json())
        return out


Step = Callable[[str], Any]


def _no_step(_name: str):
    return contextlib.nullcontext()


def resolve_target(target: str | None, inv: Inventory) -> str | None:
    """The machine to plan for besides this one: ``auto`` means the H200 machine when this
    machine has no GPU; a path names a description ``placer describe`` wrote."""
    if target in (None, "", "none"):
        return None
    t = target.lower()
    if t == "auto":
        return None if inv.gpus else "h200"
    if t in TARGETS:
        return t
    if Path(target).suffix == ".json" or Path(target).exists():
        from placer.target import load_target

        load_target(target)  # a clear error now, naming the field, rather than after profiling
        return target
    raise PlacerError(f"unknown target {target!r}; use {', '.join(TARGETS)}, auto or none, "
                      "or a JSON file `placer describe` wrote")


def baseline_placements(pipeline: Pipeline, accelerator: str | None) -> dict[str, dict[str, str]]:
    """All-CPU, and with an accelerator all-on-it and the rule of thumb.

    The rule of thumb puts training and inference on the accelerator and everything
    else on the CPU; a stage without an implementation for a device stays on the other.
    """
    stages = pipeline.stages
    out = {"all_cpu": {n: "cpu" for n in stages}}
    if accelerator is None:
        return out

    def on(n: str, want_gpu: bool) -> str:
        can_gpu = stages[n].impl_for("gpu") is not None
        can_cpu = stages[n].impl_for("cpu") is not None
        return accelerator if (want_gpu and can_gpu) or not can_cpu else "cpu"

    out["all_gpu"] = {n: on(n, True) for n in stages}
    out["rule_of_thumb"] = {n: on(n, stages[n].kind in ("training", "inference")) for n in stages}
    return out


def target_step(costs: Costs, target: str, objective: str = "makespan") -> dict[str, Any]:
    """A plan for the described machine (predictions only: its CPU and its first GPU), as report data.

    Its all-CPU time and speed-up are on the target's own CPU when the target describes
    one (this machine's CPU times scaled to it), else on this machine's CPU.
    """
    described = costs.described[0]
    desc = costs.target_model.described[described]
    p = costs.plan(objective=objective, devices=["cpu", described], target=True)
    cpu = p.baselines.get("all_cpu")
    on = costs.target_model.target_cpu
    here = costs.profile.machine
    return {"device": described, "label": desc.name, "placement": dict(p.placement),
            "predicted_s": p.predicted_makespan_s, "all_cpu_predicted_s": cpu,
            "speedup": (cpu / p.predicted_makespan_s) if cpu and p.predicted_makespan_s else None,
            "crossover_size": {s.name: s.crossover_size for s in p.stages},
            "machine": costs.target.name if costs.target is not None else desc.name,
            "cpu": on.model if on is not None else f"{here.get('cpu_model', 'this CPU')} (this machine)",
            "cpu_cores": on.cores if on is not None else here.get("cores"),
            "cpu_source": "described" if on is not None else "this machine",
            "ties": [t.model_dump() for t in getattr(p, "ties", [])],
            "notes": list(costs.target_notes), **precision_facts(p, costs.profile)}


def precision_facts(plan: Any, profile: Any) -> dict[str, Any]:
    """A plan's precisions as report data: per stage the precision, the times per precision, the
    accuracy checks and the reason (stages with a lower precision allowed or fixed), and the notes."""
    stages = [s for s in plan.stages if s.precision_s]
    checks = {n: [c.model_dump() for c in sp.precision_checks] for n, sp in profile.stages.items()
              if sp.precision_checks}
    return {"precision": dict(plan.precision), "precision_s": {s.name: s.precision_s for s in stages},
            "precision_checks": checks, "precision_reasons": {s.name: s.reason for s in stages},
            "precision_notes": list(plan.precision_notes)}


class _Timed:
    """Runs each step inside ``step(name)`` and keeps its seconds in ``timings``."""

    def __init__(self, step: Callable[[str], Any]):
        self.step = step
        self.timings: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        log.info("%s ...", name)
        with self.step(name):
            out = fn()
        self.timings[name] = time.perf_counter() - t0
        log.info("%s: done in %.2f s", name, self.timings[name])
        return out


def _baseline_runs(p: Pipeline, plan_run: Any, accelerator: str | None, run: Callable[[dict], Any],
                   timed: _Timed) -> dict[str, Any]:
    """Measured runs of the baselines; a baseline equal to a placement already run reuses it."""
    runs: dict[str, Any] = {}
    for key, placement in baseline_placements(p, accelerator).items():
        same = next((r for r in [plan_run, *runs.values()] if r.placement == placement
                     and all(getattr(s, "precision", "fp32") == "fp32" for s in r.stages)), None)
        runs[key] = same or timed(f"run {key.replace('_', '-')}", lambda pl=placement: run(pl))
    return runs


def advise(
    pipeline: str | Pipeline,
    *,
    size: int | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    target: str | None = "auto",
    objective: str = "makespan",
    executor: str = "auto",
    baselines: bool = True,
    warmup: bool = True,
    inventory: Inventory | None = None,
    cache: Any = None,
    step: Callable[[str], Any] = _no_step,
    scheduler: Any = None,
    progress: Any = None,
    precision: str | None = None,
) -> Advised:
    """Profile, plan, run the plan and the baselines that can run here, and gather the facts.

    Parameters
    ----------
    pipeline : str or Pipeline
        A pipeline file or ``module:function`` (profiled at several sizes), or a
        built pipeline (profiled at its own size).
    size : int, optional
        The size to plan and run at (default: the pipeline's default).
    budget_s : float
        Profiling time budget in seconds (on a cluster: on each worker).
    target : {"auto", "h200", "none"} or path
        Also plan for a machine this is not, from its description (``auto``: the H200
        machine when there is no GPU here; a path: a file ``placer describe`` wrote),
        its own CPU included. Predictions only; not on a cluster.
    objective : {"makespan", "throughput", "cost"}
        What the plan minimises.
    executor : {"auto", "inline", "threads"}
        How runs on this machine dispatch stages.
    baselines : bool
        Also run all-CPU, all-on-the-accelerator and the rule of thumb.
    warmup : bool
        Run each placement once untimed before the measured run.
    inventory : Inventory, optional
        This machine's devices (default: discovered).
    cache : ProfileCache, False or None
        The profile cache (None: the default one; False: none).
    step : callable, optional
        ``step(name)`` returns a context manager around each step (for progress).
    scheduler : str or distributed.Client, optional
        Advise for a dask.distributed cluster instead of this machine: profile on
        its workers, plan over its devices with the network between workers
        charged (:mod:`placer.cluster`), and run the plan and the baselines there.
    progress : rich.progress.Progress, optional
        A live display to add the profiling task (percent done, ETA) to; profiling
        on this machine only.
    precision : str, optional
        ``--precision``'s text: ``auto`` (every torch stage may take tf32 or bf16, each checked
        for accuracy here first) and/or ``STAGE=PRECISION`` pairs, each fixing a stage's precision.
        Stages' own declarations (``precision=`` on a stage or the pipeline) apply either way.

    Returns
    -------
    Advised
    """
    with open_site(scheduler, inventory=inventory, executor=executor, cache=cache) as site:
        return advise_on(site, pipeline, size=size, budget_s=budget_s, target=target, objective=objective,
                         baselines=baselines, warmup=warmup, step=step, progress=progress, precision=precision)


def advise_on(site: LocalSite | ClusterSite, pipeline: str | Pipeline, *, size: int | None = None,
              budget_s: float = DEFAULT_BUDGET_S, target: str | None = "auto", objective: str = "makespan",
              baselines: bool = True, warmup: bool = True, step: Callable[[str], Any] = _no_step,
              progress: Any = None, precision: str | None = None) -> Advised:
    """:func:`advise` at a :mod:`site <placer.site>`: this machine or a cluster, the same steps."""
    from placer.report import collect

    timed = _Timed(step)
    p = built_pipeline(pipeline, size)
    if p.streams():
        return _advise_stream(site, p, budget_s=budget_s, baselines=baselines, warmup=warmup, timed=timed,
                              target=target, precision=precision)
    if isinstance(pipeline, Pipeline) and p.size is not None:
        size = p.size  # a built pipeline runs (and is measured) at its own size, whatever is asked
    size = p.size if size is None else size
    local = isinstance(site, LocalSite)
    t = resolve_target(target, site.inventory()) if local else None
    shown = {"progress": progress} if local and progress is not None else {}
    if precision:
        shown["precision"] = precision
    costs = timed("profile" if local else "profile on the cluster",
                  lambda: site.costs(pipeline, size=size, budget_s=budget_s, describe=t, **shown))
    chosen = timed("plan", lambda: costs.plan(objective=objective, size=size))
    tgt = timed("target", lambda: target_step(costs, t, objective)) if t else None
    if local:  # a tie that only the spread makes: measure nearer the planned size, then decide again
        from placer.decide import note, remeasure

        costs, said = timed("measure where it decides", lambda: remeasure(
            site, pipeline, costs, size=size, budget_s=budget_s, plans=[chosen, tgt], target=t))
        if said:
            chosen = timed("plan", lambda: costs.plan(objective=objective, size=size))
            tgt = timed("target", lambda: target_step(costs, t, objective)) if t else None
            note(chosen, said)
            if tgt is not None:
                tgt["notes"] = [*tgt.get("notes", []), *(f"{n}: {why}" for n, why in sorted(said.items()))]

    def run(placement: Mapping[str, str], precision: Mapping[str, str] | None = None) -> Any:
        if precision:
            return site.execute(p, placement, warmup=warmup, precision=precision)
        return site.execute(p, placement, warmup=warmup)

    table = costs.table(size, [*costs.devices, *costs.described])
    predictions = costs.predictions(size)
    try:
        plan_run = timed("run plan", lambda: run(chosen.placement, chosen.precision))
        acc = next((d for d in costs.devices if d != "cpu"), None)
        runs = _baseline_runs(p, plan_run, acc, run, timed) if baselines else {}
    except StageFailedError as exc:  # keep what was made: the caller may save it (`advise --save`)
        exc.advised = Advised(pipeline=p, size=size, profile=costs.profile, plan=chosen, run=exc.run,
                              costs=table, predictions=predictions, target=tgt, timings=timed.timings)
        raise
    inv = costs.inventory if not local else site.inventory()
    facts = timed("facts", lambda: collect(plan=chosen, run=plan_run, baselines=runs, pipeline=p, costs=table,
                                           inventory=inv, predictions=predictions, target=tgt))
    check_outputs(facts, plan_run, runs)
    return Advised(pipeline=p, size=size, profile=costs.profile, plan=chosen, run=plan_run, baselines=runs,
                   costs=table, predictions=predictions, target=tgt, facts=facts, timings=timed.timings,
                   inventory=inv)


def check_outputs(facts: Any, plan_run: Any, runs: Mapping[str, Any]) -> None:
    """Compare the plan's outputs with every baseline's, elementwise within the digest's tolerance.

    The report says the options "produced the same outputs" only when they do: a
    difference sets ``facts.summary.digests_agree`` to False and names the option and
    the first output that differs in ``outputs_differ``, even when the digests agree.
    Runs whose outputs are not here (a saved run) keep the digest comparison.
    """
    from placer.digest import compare_outputs

    mine = plan_run.final_outputs if plan_run is not None else {}
    compared = False
    for key, other in runs.items():
        if other is plan_run or other is None or not mine or not other.final_outputs:
            continue
        compared = True
        why = compare_outputs(mine, other.final_outputs)
        if why is not None:
            facts.summary.digests_agree = False
            facts.summary.outputs_differ = f"{key.replace('_', '-')} differs from the plan: {why}"
            return
    if compared and facts.summary.digests_agree is False:
        facts.summary.digests_agree = True  # digests on two sides of a rounding step; the values agree


def explain_threads(facts: Any, plans: list) -> None:
    """Where the outputs differ and a stream plan set torch's intra-op threads, say why they may."""
    threads = StreamSettings.merge([sp.settings for sp in plans]).torch_threads if plans else None
    if facts.summary.outputs_differ and threads:
        facts.summary.outputs_differ += (
            f" (the plan runs the step with {threads} torch intra-op thread{'s' if threads != 1 else ''}, the "
            "usual settings with torch's own: float reductions then run in another order, and a training step "
            "carries the difference into every later step)")


@dataclass(frozen=True)
class Chosen:
    """What :func:`best_placement` chose for ``placer run``: a placement and why, and for a pipeline with
    streams the stream settings chosen with it.

    Attributes
    ----------
    placement : dict or str
        Stage → device, or a placement spec (``all=cpu``).
    why : str
        The reason, in words.
    stream : StreamSettings or None
        The settings to run the pipeline's streams with (None without streams, or when none was planned).
    plans : list of StreamPlan
        The plan of each stream.
    precision : dict
        Stage → the lower precision the plan runs it in (absent: fp32).

    Unpacks as ``(placement, why)``, as it always has.
    """

    placement: dict[str, str] | str
    why: str
    stream: StreamSettings | None = None
    plans: list = field(default_factory=list)
    precision: dict = field(default_factory=dict)

    def __iter__(self):
        return iter((self.placement, self.why))


def _advise_stream(site: LocalSite | ClusterSite, p: Pipeline, *, budget_s: float, baselines: bool, warmup: bool,
                   timed: _Timed, target: str | None = None, precision: str | None = None) -> Advised:
    """The advise flow for a pipeline with streams: plan each stream, run the plan and the usual settings.

    The source, the step and the one-shot stages run on this machine (where the step's
    device is), so the streams are profiled and planned here. At a cluster the profile also
    times each CPU per-batch stage on a worker against here (its ratio, what the model prices
    its batches there at), the cluster is measured (per-task overhead, a batch's round trip) and
    each stream planned again
    with the cluster's workers in the search (remote workers and batches per task per
    CPU stage); the best offload runs, and is kept when the model predicted it faster
    and it measured faster; the other run is shown beside the baselines, and the plan's
    ``offload`` holds predicted and measured samples per second and the network share.

    With a ``target`` named (``h200`` or a file; ``auto`` plans streams here only), each
    stream is also planned for that machine from the same profile
    (:func:`placer.stream.target.plan_for_target`): its predictions go into the stream's
    report facts (``target``) and ``Advised.stream_target_plans``.
    """
    from placer.report import collect
    from placer.data.run import objective_rate
    from placer.stream.planner import plan_streams, stream_config

    here = site if isinstance(site, LocalSite) else LocalSite(executor=getattr(site, "executor", "auto"))
    inv = here.inventory()
    described = None if target in (None, "", "none", "auto") else resolve_target(target, inv)
    profiles: list = []
    steps: list = []
    plans = timed("profile and plan the streams",
                  lambda: plan_streams(p, budget_s=budget_s, inventory=inv, profiles=profiles, precision=precision,
                                       step_precisions=steps,
                                       cluster=site.client if isinstance(site, ClusterSite) else None))
    target_plans = timed("target", lambda: _stream_target_plans(p, described, profiles, inv, steps)) if described else []
    placement = {n: d for sp in plans for n, d in sp.placement.items()}
    in_precision = {n: v for sp in plans for n, v in sp.precision.items()} or None
    options: dict[str, Callable[[], Any]] = {
        "plan": lambda: here.execute(p, placement, warmup=warmup, stream=stream_config(plans), precision=in_precision)}
    for alt in (plans[0].baselines if baselines else []):
        cfg, where = StreamSettings.model_validate(alt.config), {**placement, **alt.placement}
        options[alt.name] = lambda c=cfg, w=where: here.execute(p, w, warmup=warmup, stream=c)
    t0 = time.perf_counter()
    every = {k: [timed(f"run {k}", fn)] for k, fn in options.items()}
    rounds = option_rounds(time.perf_counter() - t0, budget_s) if len(options) > 1 else 1
    if rounds > 1:
        timed("repeat options", lambda: _repeat_options(options, every, rounds))
    objective = plans[0].objective

    def rates_of(runs: list) -> list[float]:
        return [objective_rate(r.streams[0], objective) if r.streams else 0.0 for r in runs]

    if rounds > 1 and PLAIN_LOOP in options:
        timed("repeat plan and plain loop", lambda: claim_rounds(options, every, rates_of, budget_s))
    rates = {k: rates_of(v) for k, v in every.items()}
    chosen = {k: _median_run(v, rates[k]) for k, v in every.items()}
    plan_run = chosen.pop("plan")
    runs: dict[str, Any] = chosen
    for alt in (plans[0].baselines if baselines else []):
        # the objective's measure, as the prediction beside it
        alt.measured_samples_per_s = objective_rate(runs[alt.name].streams[0], objective)
    if isinstance(site, ClusterSite):
        plan_run = _offload_streams(site, p, plans, profiles, placement, plan_run, runs, warmup, timed)
    step_only = {sp.step: sp.consumer_samples_per_s for sp in plans if sp.consumer_samples_per_s}
    facts = timed("facts", lambda: collect(run=plan_run, baselines=runs, pipeline=p, inventory=inv,
                                           step_only=step_only, stream_plans=plans,
                                           option_runs=rates if rounds > 1 else None))
    check_outputs(facts, plan_run, runs)
    explain_threads(facts, plans)
    _add_target_facts(facts, target_plans)
    return Advised(pipeline=p, size=p.size, profile=None, plan=None, run=plan_run, baselines=runs,
                   facts=facts, timings=timed.timings, inventory=inv, stream_plans=plans,
                   stream_target_plans=target_plans)


#: runs of each stream option (the plan and the baselines) when the time allows: a single whole run of a
#: few seconds swings by a quarter on a shared machine, enough to reverse a gain of a fifth
OPTION_ROUNDS = 3


def option_rounds(first_round_s: float, budget_s: float) -> int:
    """Rounds of the options' runs: the first, and up to :data:`OPTION_ROUNDS` in all while the further rounds
    take at most the profile's budget again (each as long as the first)."""
    if first_round_s <= 0:
        return OPTION_ROUNDS
    return 1 + max(0, min(OPTION_ROUNDS - 1, int(budget_s // first_round_s)))


#: the baseline the plan's claimed speed-up is set against: the stream as a plain loop runs it, one batch at a
#: time (a script as written)
PLAIN_LOOP = "num_workers=0"
#: more rounds of the plan and :data:`PLAIN_LOOP` alone (:func:`claim_rounds`) where their rounds' ratios lie
#: further apart than this share of their median: at most this many, while this share more of the budget lasts
CLAIM_SPREAD = 0.10
CLAIM_ROUNDS = 4
CLAIM_SHARE = 0.5


def claim_rounds(options: Mapping[str, Callable[[], Any]], every: dict[str, list],
                 rates: Callable[[list], list[float]], budget_s: float) -> int:
    """More rounds of the plan and :data:`PLAIN_LOOP`, the two alone, in turn (each round in the other order
    than the last), where their rounds' ratios (plan over plain loop, round by round) lie further apart than
    :data:`CLAIM_SPREAD` of their median: up to :data:`CLAIM_ROUNDS`, while :data:`CLAIM_SHARE` of ``budget_s``
    lasts. Returns the rounds added.

    The plan's speed-up over the plain loop is the report's claim, and a plain loop at torch's own threads
    swings on a shared machine: two rounds whose ratios differ by a third claim their mean, which can be a
    quarter off what the script measures over many rounds."""
    from placer.stream.rounds import interleave, ratio_spread, rotated

    if ratio_spread(rates(every["plan"]), rates(every[PLAIN_LOOP])) <= CLAIM_SPREAD:
        return 0
    t_end = time.perf_counter() + CLAIM_SHARE * budget_s
    return interleave([PLAIN_LOOP, "plan"], lambda k: every[k].append(options[k]()), CLAIM_ROUNDS, order=rotated,
                      more=lambda r: time.perf_counter() < t_end)


def _repeat_options(options: Mapping[str, Callable[[], Any]], every: dict[str, list], rounds: int) -> None:
    """Run every option again until each ran ``rounds`` times; each round in another order (a change of
    the machine's load falls on all of them alike)."""
    from placer.stream.rounds import interleave, rotated

    interleave(list(options), lambda k: every[k].append(options[k]()), rounds - 1,
               order=lambda names, r: rotated(names, r + 1))


def _median_run(runs: list, rates: list[float]) -> Any:
    """The run whose rate is the median of the runs' (the lower middle one of an even count)."""
    order = sorted(range(len(runs)), key=lambda i: rates[i])
    return runs[order[(len(order) - 1) // 2]]


def _stream_target_plans(p: Pipeline, target: str, profiles: list, inv: Inventory, steps: list | None = None) -> list:
    """Each stream planned for ``target`` from its profile taken here and one batch's work counted here
    (the step's in each lower precision it may run in: ``steps``, from :func:`plan_streams`)."""
    from placer.stream.precision import count_step
    from placer.stream.target import plan_for_target
    from placer.stream.work import count_stream_work
    from placer.target import load_target

    desc = load_target(target)
    out = []
    for i, prof in enumerate(profiles):
        notes: list[str] = []
        sp = steps[i] if steps and i < len(steps) else None
        if sp is not None and sp.precisions:
            sp.work = count_step(p, prof.source, [q for q in sp.precisions if q in ("bf16", "fp16")], inventory=inv)
        plan = plan_for_target(prof, desc, count_stream_work(p, prof.source, inventory=inv, notes=notes),
                               step_precision=sp)
        plan.notes.extend(n for n in notes if n not in plan.notes)
        out.append(plan)
    return out


def _add_target_facts(facts: Any, target_plans: list) -> None:
    """Put each stream's plan for a target into its report facts."""
    from placer.report.streams import add_target_plan

    for tp in target_plans:
        for sf in facts.streams or []:
            if sf.source == tp.source:
                add_target_plan(sf, tp)


def _offload_streams(site: ClusterSite, p: Pipeline, plans: list, profiles: list, placement: dict[str, str],
                     plan_run: Any, runs: dict[str, Any], warmup: bool, timed: _Timed) -> Any:
    """Model the streams' CPU per-batch stages on the cluster, run the best offload the model finds, and
    keep it only when the model predicted it faster and it measured faster; the other run is shown as an
    alternative. Each plan gets the offload's facts (``StreamPlan.offload``). Returns the plan's run.

    The cluster is measured once (:func:`placer.stream.offload.probe_cluster`: per-task overhead, a
    batch's round trip, its threads); each stream is planned again with it in the search
    (:func:`placer.stream.offload.plan_offload`), and the best candidate that uses the cluster runs.
    """
    from placer.data.stream import Alternative
    from placer.stream.offload import plan_offload, probe_bytes, probe_cluster
    from placer.stream.planner import stream_config

    info = site.client.scheduler_info(n_workers=-1)["workers"]
    threads = max(1, sum(w.get("nthreads", 1) for w in info.values()))
    offers = {}
    for sp, prof in zip(plans, profiles):
        link = timed(f"measure the cluster for {sp.source}",
                     lambda pr=prof: probe_cluster(site.client, probe_bytes(pr)))
        _, cand, off = plan_offload(prof, link, objective=sp.objective, epochs=sp.epochs)
        if cand is not None:
            offers[sp.source] = (cand, off)
        else:
            sp.notes.append("no CPU per-batch stage to run on the cluster")
    if not offers:
        return plan_run
    cfg = stream_config(plans)
    offload = StreamSettings.merge([offers[sp.source][0].settings if sp.source in offers else sp.settings
                                    for sp in plans])
    where_run = {**placement, **{m: d for c, _ in offers.values() for m, d in c.place.items()}}
    stages = [s.name for _, off in offers.values() for s in off.stages]
    there = timed("run plan with CPU stages on the cluster",
                  lambda: site.execute(p, where_run, warmup=warmup, stream=offload))
    here_sps, there_sps = plan_run.streams[0].samples_per_s, there.streams[0].samples_per_s
    predicted = any(off.chosen for _, off in offers.values())
    where = f"{', '.join(stages)} as tasks on {site.name} ({len(info)} workers, {threads} threads)"
    better = predicted and there_sps > here_sps
    name = "this machine only" if better else "CPU stages on the cluster"
    kept, other = (there, plan_run) if better else (plan_run, there)
    runs[name] = other
    first = offers.get(plans[0].source)
    predicted_other = None if first is None else (
        first[1].local_predicted_samples_per_s if better else first[1].predicted_samples_per_s)
    plans[0].baselines.append(Alternative(
        name=name, change=("the plan's stages on this machine's workers" if better else where),
        placement=dict(placement if better else where_run), config=(cfg if better else offload).decisions(),
        predicted_samples_per_s=predicted_other or 0.0, measured_samples_per_s=other.streams[0].samples_per_s))
    words = (f"measured on the cluster: {where} ran {there_sps:,.1f} samples/s, against {here_sps:,.1f} with "
             f"the plan's workers on this machine")
    why = ("; the cluster is kept" if better else "; this machine is kept" + (
        "" if predicted else " (the model did not predict the cluster faster)"))
    streams_there = {st.source: st for st in there.streams}
    streams_here = {st.source: st for st in plan_run.streams}
    for sp in plans:
        sp.reasons.append(words + why)
        if sp.source not in offers:
            continue
        cand, off = offers[sp.source]
        off.measured_samples_per_s = getattr(streams_there.get(sp.source), "samples_per_s", None)
        off.local_measured_samples_per_s = getattr(streams_here.get(sp.source), "samples_per_s", None)
        off.chosen = better
        off.reason += "; " + words + why
        sp.offload = off
        if better:
            sp.settings = cand.settings
            sp.placement = dict(cand.place)
    return kept


def best_placement(pipeline: Pipeline, size: int | None = None, site: LocalSite | ClusterSite | None = None,
                   reference: Any = None, precision: str | None = None) -> Chosen:
    """The plan's placement for ``placer run`` without ``--placement``, and why.

    On this machine (the default site) with only a CPU the answer is all-CPU at once.
    Otherwise the pipeline is profiled with a small budget (cached), planned over the
    site's devices, and the plan's placement returned. When profiling or planning
    fails, all-CPU with the reason. On a cluster the pipeline's ``reference`` (its
    file or ``module:function``) travels to the workers when given; a cluster that
    cannot be reached or has no workers is an error (the run could not start either).

    A pipeline with streams is planned by :func:`placer.stream.planner.plan_stream`
    on this machine (with or without a GPU: workers and a cache point matter on a
    CPU too), within :data:`RUN_BUDGET_S`; the result's ``stream`` holds the stream
    settings to run with, ``plans`` the stream plans.

    Returns
    -------
    Chosen
        Unpacks as ``(placement, why)``.
    """
    from placer.executor.distributed import ClusterError, ClusterProfileError

    site = site or LocalSite()
    local = isinstance(site, LocalSite)
    if pipeline.streams():
        return _best_for_streams(pipeline, site) if local else _best_for_streams_on_cluster(pipeline, site)
    if local and not accelerators(site.inventory()):
        return Chosen("all=cpu", "all stages on the CPU: this machine has no GPU")
    try:
        what = pipeline if local else reference or pipeline
        extra = {"precision": precision} if precision else {}
        costs = site.costs(what, size=size, budget_s=RUN_BUDGET_S, **extra)
        chosen = costs.plan(size=size or pipeline.size or costs.size)
    except ClusterError as exc:
        if not isinstance(exc, ClusterProfileError):
            raise
        why = exc
    except (PlacerError, ValueError, KeyError) as exc:
        why = exc
    else:
        on = ", ".join(sorted({d for d in chosen.placement.values()}))
        source = f"a {RUN_BUDGET_S:g} s profile" if local else f"a {RUN_BUDGET_S:g} s profile on its workers"
        return Chosen(dict(chosen.placement), (
            f"planned {'' if local else 'for the cluster '}from {source}: predicted makespan "
            f"{chosen.predicted_makespan_s:.4g} s using {on}"), precision=dict(chosen.precision))
    failed = "planning failed" if local else "planning for the cluster failed"
    return Chosen("all=cpu", f"all stages on the CPU: {failed} ({str(why).splitlines()[0]})")


def _best_for_streams(pipeline: Pipeline, site: LocalSite) -> Chosen:
    """Plan every stream of ``pipeline`` here; the one-shot stages stay on the CPU (or their pins)."""
    from placer.stream.planner import plan_streams, stream_config

    try:
        plans = plan_streams(pipeline, budget_s=RUN_BUDGET_S, inventory=site.inventory())
    except (PlacerError, ValueError, KeyError) as exc:
        return Chosen("all=cpu", f"all stages on the CPU, stream settings as given: planning the stream failed "
                                 f"({str(exc).splitlines()[0]})")
    placement = {m: d for plan in plans for m, d in plan.placement.items()}
    return Chosen(placement, "; ".join(stream_summary(plan) for plan in plans), stream_config(plans), list(plans))


def _best_for_streams_on_cluster(pipeline: Pipeline, site: ClusterSite) -> Chosen:
    """Plan every stream here, then again with the cluster's workers in the search (the cluster measured
    once): a stream whose offload the model predicts faster runs its chosen stages as grouped tasks there,
    the others keep this machine's workers (named ``thread`` so the cluster run leaves them here)."""
    from placer.stream.offload import plan_offload, probe_bytes, probe_cluster
    from placer.stream.planner import plan_streams, stream_config

    try:
        profiles: list = []
        plans = plan_streams(pipeline, budget_s=RUN_BUDGET_S, inventory=LocalSite().inventory(), profiles=profiles,
                             cluster=site.client)
        out = []
        for sp, prof in zip(plans, profiles):
            link = probe_cluster(site.client, probe_bytes(prof))
            planned, _, off = plan_offload(prof, link, objective=sp.objective, epochs=sp.epochs)
            out.append(planned if off is not None and off.chosen else _kept_here(sp))
    except (PlacerError, ValueError, KeyError) as exc:
        return Chosen("all=cpu", "all stages on the CPU; the streams' CPU per-batch stages run as tasks on the "
                                 f"cluster (planning the streams failed: {str(exc).splitlines()[0]})")
    placement = {m: d for plan in out for m, d in plan.placement.items()}
    return Chosen(placement, "; ".join(stream_summary(plan) for plan in out), stream_config(out), out)


def _kept_here(plan: Any) -> Any:
    """``plan`` with its CPU per-batch stages' thread workers named, so that a run at a cluster keeps them here."""
    kinds = {m: plan.settings.kind_of(m) for m, d in plan.placement.items()
             if d == "cpu" and m not in (plan.source, plan.step)}
    plan.settings = plan.settings.override(worker_kind=kinds)
    return plan


def stream_summary(plan: Any) -> str:
    """One line on a stream plan: where, how many workers, the cache, the predicted rate and the baseline."""
    on = ", ".join(f"{m}={d}" for m, d in plan.placement.items() if m != plan.source)
    s = plan.settings
    workers = ", ".join(f"{w} {s.kind_of(m)} workers on {m}"
                        + (f" ({s.group_of(m)} batches per task)" if s.group_of(m) > 1 else "")
                        for m, w in s.stage_workers.items()
                        if (w != 1 or s.kind_of(m) == "dask") and m != plan.source)
    base = next((b for b in plan.baselines if b.name == PLAIN_LOOP), None)
    parts = [f"planned stream {plan.source} -> {plan.step} from a {RUN_BUDGET_S:g} s profile: {on}",
             workers, f"cache after {s.cache}" if s.cache else "",
             f"prefetch {s.prefetch}; predicted {plan.predicted_samples_per_s:,.1f} samples/s "
             f"(bottleneck: {plan.bottleneck})"
             + (f", {base.speedup:.2f}x num_workers=0" if base and base.speedup else "")]
    return ", ".join(p for p in parts if p)
