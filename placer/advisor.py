"""The advise flow: profile → cost model → plan → run (plan and baselines) → report facts.

May import: placer.{pipeline,devices,loader,errors,profile,costmodel,optimize,executor,
report}. torch, dask and numba are reached only through the profiler and the
executor.

:func:`advise` is what ``placer advise`` runs; :func:`best_placement` is what
``placer run`` uses when no placement is given. Each step is a small function, so
a caller can stop after any of them and save its result.

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

from placer.devices import Inventory, discover
from placer.errors import PlacerError
from placer.pipeline import Pipeline, as_pipeline

#: seconds of profiling allowed by default (`placer advise --budget-s`)
DEFAULT_BUDGET_S = 30.0
#: seconds of profiling `placer run` spends to choose a placement
RUN_BUDGET_S = 10.0
#: devices that may be described for planning when absent (see placer/data/)
TARGETS = ("h200",)


@dataclass
class Advised:
    """Everything the advise flow produced; each part serialises to JSON."""

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

    def save(self, folder: str | Path) -> dict[str, Path]:
        """Write profile, plan, runs and facts as JSON files in ``folder``; return their paths."""
        from placer.files import write_text_atomic

        folder = Path(folder)
        docs = {"profile": self.profile, "plan": self.plan, "run": self.run, "costs": self.costs,
                "inventory": self.inventory,
                **{f"run-{k}": v for k, v in self.baselines.items()}}
        out = {}
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


def accelerators(inv: Inventory) -> list[str]:
    """Accelerators of this machine: real GPUs, and the simulated device when enabled."""
    return [d.name for d in inv.devices if d.is_accelerator]


def resolve_target(target: str | None, inv: Inventory) -> str | None:
    """The absent device to plan for: ``auto`` means the H200 when this machine has no GPU."""
    if target in (None, "", "none"):
        return None
    t = target.lower()
    if t == "auto":
        return None if inv.gpus else "h200"
    if t not in TARGETS:
        raise PlacerError(f"unknown target {target!r}; use {', '.join(TARGETS)}, auto or none")
    return t


def profile_step(pipeline: Any, size: int | None, budget_s: float, inv: Inventory, cache: Any = None):
    """Measure the pipeline's stages (cached profiles are reused, changed stages re-measured)."""
    from placer.profile import profile

    return profile(pipeline, size=size, budget_s=budget_s, inventory=inv, progress=False, cache=cache)


def model_step(prof, target: str | None):
    from placer.costmodel.model import CostModel

    return CostModel(prof, describe=[target] if target else None)


def plan_step(model, size: float, devices: list[str], objective: str = "makespan"):
    """The plan over ``devices`` at ``size``, with crossover sizes over the same devices."""
    from placer.optimize import plan

    def cost_at(s: float):
        return model.table(s, devices=devices)

    return plan(cost_at(size), objective=objective, cost_at=cost_at, size=size)


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


def run_step(pipeline: Pipeline, placement: Mapping[str, str], executor: str, warmup: bool, inv: Inventory):
    """Execute a placement (once untimed first with ``warmup``) and return the measured run."""
    from placer.executor import execute

    if warmup:
        execute(pipeline, dict(placement), executor=executor, inventory=inv)
    return execute(pipeline, dict(placement), executor=executor, inventory=inv, size=pipeline.size)


def target_step(model, size: float, target: str, objective: str = "makespan") -> dict[str, Any]:
    """A plan for the described absent device (predictions only), as report data."""
    described = next(iter(model.described))
    desc = model.described[described]
    devices = ["cpu", described]
    p = plan_step(model, size, devices, objective)
    cpu = p.baselines.get("all_cpu")
    return {"device": described, "label": desc.name, "placement": dict(p.placement),
            "predicted_s": p.predicted_makespan_s, "all_cpu_predicted_s": cpu,
            "speedup": (cpu / p.predicted_makespan_s) if cpu and p.predicted_makespan_s else None,
            "crossover_size": {s.name: s.crossover_size for s in p.stages}}


class _Timed:
    """Runs each step inside ``step(name)`` and keeps its seconds in ``timings``."""

    def __init__(self, step: Callable[[str], Any]):
        self.step = step
        self.timings: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        with self.step(name):
            out = fn()
        self.timings[name] = time.perf_counter() - t0
        return out


def _as_built(pipeline: Any, size: int | None) -> Pipeline:
    """A built pipeline from a reference, a ``build`` function or a pipeline."""
    from placer.loader import load_pipeline

    if isinstance(pipeline, str):
        return load_pipeline(pipeline, size)
    if callable(pipeline) and not isinstance(pipeline, Pipeline):
        return as_pipeline(pipeline(size))
    return as_pipeline(pipeline)


def _baseline_runs(p: Pipeline, plan_run: Any, accelerator: str | None, run: Callable[[dict], Any],
                   timed: _Timed) -> dict[str, Any]:
    """Measured runs of the baselines; a baseline equal to a placement already run reuses it."""
    runs: dict[str, Any] = {}
    for key, placement in baseline_placements(p, accelerator).items():
        same = next((r for r in [plan_run, *runs.values()] if r.placement == placement), None)
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
        Profiling time budget in seconds.
    target : {"auto", "h200", "none"}
        Also plan for a device this machine lacks, from its description
        (``auto``: the H200 when there is no GPU here). Predictions only.
    step : callable, optional
        ``step(name)`` returns a context manager around each step (for progress).
    scheduler : str or distributed.Client, optional
        Advise for a dask.distributed cluster instead of this machine: profile on
        its workers, plan over its devices with the network between workers
        charged (:mod:`placer.cluster`), and run the plan and the baselines there.

    Returns
    -------
    Advised
    """
    if scheduler is not None:
        from placer.executor.distributed import connect

        with connect(scheduler) as client:
            return _advise_cluster(pipeline, client, size=size, budget_s=budget_s, objective=objective,
                                   baselines=baselines, warmup=warmup, step=step)
    from placer.report import collect

    inv = inventory or discover()
    t = resolve_target(target, inv)
    timed = _Timed(step)
    p = _as_built(pipeline, size)
    size = p.size if size is None else size
    prof = timed("profile", lambda: profile_step(pipeline, size, budget_s, inv, cache))
    model = model_step(prof, t)
    here = ["cpu", *[d for d in accelerators(inv) if d in model.devices]]
    chosen = timed("plan", lambda: plan_step(model, size, here, objective))
    tgt = timed("target", lambda: target_step(model, size, t, objective)) if t else None
    run = timed("run plan", lambda: run_step(p, chosen.placement, executor, warmup, inv))
    acc = next((d for d in here if d != "cpu"), None)
    runs = _baseline_runs(p, run, acc, lambda pl: run_step(p, pl, executor, warmup, inv), timed) if baselines else {}
    costs = model.table(size)
    predictions = {s: {d: pr.model_dump() for d, pr in devs.items()} for s, devs in model.predictions(size).items()}
    facts = timed("facts", lambda: collect(plan=chosen, run=run, baselines=runs, pipeline=p, costs=costs,
                                           inventory=inv, predictions=predictions, target=tgt))
    return Advised(pipeline=p, size=size, profile=prof, plan=chosen, run=run, baselines=runs, costs=costs,
                   predictions=predictions, target=tgt, facts=facts, timings=timed.timings, inventory=inv)


def _advise_cluster(pipeline: str | Pipeline, client: Any, *, size: int | None, budget_s: float,
                    objective: str, baselines: bool, warmup: bool, step: Callable[[str], Any]) -> Advised:
    """:func:`advise` on a cluster: the same steps, with the cluster's devices and network."""
    from placer.cluster import cluster_costs, plan_from_costs
    from placer.executor import execute
    from placer.report import collect

    timed = _Timed(step)
    p = _as_built(pipeline, size)
    size = p.size if size is None else size
    cc = timed("profile on the cluster", lambda: cluster_costs(pipeline, client, size=size, budget_s=budget_s))
    chosen = timed("plan", lambda: plan_from_costs(cc, objective=objective))

    def run_there(placement: dict) -> Any:
        if warmup:
            execute(p, dict(placement), scheduler=client)
        return execute(p, dict(placement), scheduler=client, size=p.size)

    run = timed("run plan", lambda: run_there(chosen.placement))
    acc = next((d for d in cc.devices if d != "cpu"), None)
    runs = _baseline_runs(p, run, acc, run_there, timed) if baselines else {}
    costs = cc.table(size)
    predictions = {s: {d: pr.model_dump() for d, pr in devs.items()}
                   for s, devs in cc.model.predictions(size, cc.devices).items()}
    facts = timed("facts", lambda: collect(plan=chosen, run=run, baselines=runs, pipeline=p, costs=costs,
                                           inventory=cc.inventory, predictions=predictions, target=None))
    return Advised(pipeline=p, size=size, profile=cc.profile, plan=chosen, run=run, baselines=runs, costs=costs,
                   predictions=predictions, target=None, facts=facts, timings=timed.timings,
                   inventory=cc.inventory)


def best_placement(pipeline: Pipeline, size: int | None = None) -> tuple[dict[str, str] | str, str]:
    """The plan's placement for ``placer run`` without ``--placement``, and why.

    With only a CPU here the answer is all-CPU at once. Otherwise the pipeline is
    profiled with a small budget (cached), planned over this machine's devices, and
    the plan's placement returned. When profiling or planning fails, all-CPU with
    the reason.
    """
    inv = discover()
    if not accelerators(inv):
        return "all=cpu", "all stages on the CPU: this machine has no GPU"
    try:
        prof = profile_step(pipeline, size, RUN_BUDGET_S, inv)
        model = model_step(prof, None)
        here = ["cpu", *[d for d in accelerators(inv) if d in model.devices]]
        chosen = plan_step(model, size or pipeline.size or max(prof.measured_sizes or [1]), here)
    except (PlacerError, ValueError, KeyError, ImportError) as exc:
        return "all=cpu", f"all stages on the CPU: planning failed ({str(exc).splitlines()[0]})"
    on = sorted({d for d in chosen.placement.values()})
    return dict(chosen.placement), (
        f"planned from a {RUN_BUDGET_S:g} s profile: predicted makespan "
        f"{chosen.predicted_makespan_s:.4g} s using {', '.join(on)}")
