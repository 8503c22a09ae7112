"""Where work happens: this machine, or a dask.distributed cluster.

May import: placer.{site_facts,devices,errors,pipeline,data}; placer.profile, placer.costmodel,
placer.target, placer.executor, placer.loader, placer.precision and placer.cluster inside methods, so that importing a site
stays cheap.

A site answers the three questions the advise flow (:mod:`placer.advisor`) asks of
the place it plans for:

- ``inventory()``: which devices are there;
- ``costs(pipeline, size=..., budget_s=...)``: what every stage costs on each of them,
  and what the network between them costs, as :class:`Costs` (the profile, the cost
  model fitted to it, the devices to plan over, notes);
- ``execute(pipeline, placement)``: run a placement there and return the measured
  :class:`~placer.data.run.Run`.

:class:`LocalSite` is this machine (local dask threads, local GPUs);
:class:`ClusterSite` is a dask.distributed cluster, profiled on its workers
(:mod:`placer.cluster`). :func:`open_site` picks one from a ``scheduler`` argument.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from placer.site_facts import Costs
from placer.devices import Inventory, discover
from placer.pipeline import Pipeline


def accelerators(inv: Inventory) -> list[str]:
    """Accelerators of an inventory: real GPUs, and the simulated device when enabled."""
    return [d.name for d in inv.devices if d.is_accelerator]


class LocalSite:
    """This machine: profiled and run in this process (dask threads, local GPUs).

    Parameters
    ----------
    inventory : Inventory, optional
        The devices (default: :func:`placer.devices.discover`).
    executor : {"auto", "inline", "threads"}
        How runs dispatch stages (see :func:`placer.executor.execute`).
    cache : ProfileCache, False or None
        The profile cache (None: the default one; False: none).
    """

    name = "this machine"

    def __init__(self, inventory: Inventory | None = None, *, executor: str = "auto", cache: Any = None):
        self._inventory = inventory
        self.executor, self.cache = executor, cache

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = discover()
        return self._inventory

    def measure(self, pipeline: Any, *, size: int | None, budget_s: float | None, **profile_options: Any):
        """Profile ``pipeline`` here (:func:`placer.profile.profile`; options pass through)."""
        from placer.profile import profile

        options = {"progress": False, "cache": self.cache, **profile_options}
        return profile(pipeline, size=size, budget_s=budget_s, inventory=self.inventory(), **options)

    def costs(self, pipeline: Any, *, size: int | None, budget_s: float | None, describe: str | None = None,
              precision: str | None = None, **profile_options: Any) -> Costs:
        """Profile ``pipeline`` here and fit the cost model (with ``describe``: a device this machine lacks).

        Each stage's allowed lower precisions (declared, or every torch stage's with ``precision``
        ``auto``) are run here and compared with fp32 (:mod:`placer.profile.precision`); stages
        ``precision`` fixes (``"train=bf16"``) are planned in that precision.
        """
        built = None
        if precision:  # a mistake in --precision is named before anything is measured
            from placer.precision import parse_precision_option

            built = built_pipeline(pipeline, size)
            parse_precision_option(precision, built.stages)
        prof = self.measure(pipeline, size=size, budget_s=budget_s, **profile_options)
        fixed = attach_precision_checks(prof, pipeline, size, precision)
        costs = costs_from_profile(prof, size=size, describe=describe, inventory=self.inventory())
        for model in {id(m): m for m in (costs.model, costs.target_model)}.values():
            model.fixed_precision = dict(fixed)
        return costs

    def execute(self, pipeline: Pipeline, placement: Mapping[str, str] | str, *, warmup: bool = False,
                stream: Any = None, precision: Mapping[str, str] | None = None):
        """Run ``placement`` here (once untimed first with ``warmup``) and return the measured run.

        ``stream`` (a :class:`~placer.stream.StreamConfig`) says how the pipeline's streams run;
        ``precision`` (stage → precision) what stages run in (default: fp32).
        """
        from placer.executor import execute

        inv = self.inventory()
        spec = placement if isinstance(placement, str) else dict(placement)
        if warmup:
            execute(pipeline, spec, executor=self.executor, inventory=inv, stream=stream, precision=precision)
        return execute(pipeline, spec, executor=self.executor, inventory=inv, size=pipeline.size, stream=stream,
                       precision=precision)


class ClusterSite:
    """A dask.distributed cluster: profiled on its workers, run there, its network charged.

    Parameters
    ----------
    client : distributed.Client
        A connected client (see :func:`open_site`).
    """

    def __init__(self, client: Any):
        self.client = client
        self.name = f"the cluster at {getattr(client, 'scheduler', None) and client.scheduler.address}"
        self._inventory: Inventory | None = None

    def inventory(self) -> Inventory:
        from placer.executor.distributed import cluster_devices

        if self._inventory is None:
            self._inventory = cluster_devices(self.client)
        return self._inventory

    def costs(self, pipeline: Any, *, size: int | None, budget_s: float | None, describe: str | None = None,
              precision: str | None = None, **options: Any) -> Costs:
        """Profile ``pipeline`` on the workers and measure the network (:func:`placer.cluster.cluster_costs`).

        Lower precisions are not planned on a cluster (``precision`` is ignored; a run may still fix
        one with ``execute(..., precision=)``).

        A described device is not planned on a cluster: ``describe`` is ignored.
        """
        from placer.cluster import cluster_costs

        costs = cluster_costs(pipeline, self.client, size=size, budget_s=budget_s, **options)
        self._inventory = costs.inventory
        return costs

    def execute(self, pipeline: Pipeline, placement: Mapping[str, str] | str, *, warmup: bool = False,
                stream: Any = None, precision: Mapping[str, str] | None = None):
        """Run ``placement`` on the cluster (once untimed first with ``warmup``); a stream's CPU per-batch
        stages run there as tasks, with ``stream`` (a :class:`~placer.stream.StreamConfig`) on top."""
        from placer.executor import execute

        spec = placement if isinstance(placement, str) else dict(placement)
        if warmup:
            execute(pipeline, spec, scheduler=self.client, stream=stream, precision=precision)
        return execute(pipeline, spec, scheduler=self.client, size=pipeline.size, stream=stream, precision=precision)


def built_pipeline(pipeline: Any, size: int | None) -> Pipeline:
    """A built pipeline from a reference (a file, ``module:function``), a ``build`` function or a pipeline."""
    from placer.loader import load_pipeline
    from placer.pipeline import as_pipeline

    if isinstance(pipeline, str):
        return load_pipeline(pipeline, size)
    if callable(pipeline) and not isinstance(pipeline, Pipeline):
        return as_pipeline(pipeline(size))
    return as_pipeline(pipeline)


def attach_precision_checks(prof: Any, pipeline: Any, size: int | None, precision: str | None) -> dict[str, str]:
    """Check the accuracy of each allowed (or fixed) lower precision here and keep the checks in
    ``prof``'s stages; return the stages ``precision`` (``--precision``'s text) fixes.

    The checks run at the largest size the profile measured (a plan for a larger size
    predicts from those measurements, and must not run the stage at that size here)."""
    from placer.precision import parse_precision_option
    from placer.profile.precision import allowed, check_precisions

    measured = [n for n in (getattr(prof, "measured_sizes", None) or []) if n]
    at = min(size, max(measured)) if size and measured else size  # the profiled input, never a larger planned size
    p = built_pipeline(pipeline, at)
    auto, fixed = parse_precision_option(precision, p.stages)
    todo = allowed(p, auto)
    for n, v in fixed.items():
        if v != "fp32" and v not in todo.get(n, ()):
            todo[n] = (*todo.get(n, ()), v)
    if not todo:
        return fixed
    for n, found in check_precisions(p, todo).items():
        if n in prof.stages:
            prof.stages[n].precision_checks = found
    smaller = [m for m in measured if at and m < at]
    if smaller:  # a second size: autocast's difference as a line over size (fixed casts, growing activations)
        from placer.profile.precision import count_precisions

        for n, by in count_precisions(built_pipeline(pipeline, min(smaller)), todo).items():
            for c in getattr(prof.stages.get(n), "precision_checks", []):
                if c.precision in by:
                    c.counted = [by[c.precision], *c.counted]
    return fixed


def costs_from_profile(prof: Any, *, size: int | None = None, describe: Any = None,
                       inventory: Inventory | None = None) -> Costs:
    """:class:`Costs` from a profile (measured here, or loaded from a file).

    The devices to plan over are the CPU and the profile's accelerators, plus the GPUs
    of ``describe`` (a target: ``h200``, a file ``placer describe`` wrote, or a
    :class:`~placer.target.TargetDescription`) when given. The target's own plan
    (``Costs.plan(target=True)``) is over its CPU and GPUs: this machine's CPU times
    scaled to the target's CPU (:func:`placer.target.host_scale`). Without an inventory
    (a saved profile), the profile's own devices stand in for it.
    """
    from placer.costmodel.model import CostModel
    from placer.target import host_scale, load_target

    target = load_target(describe) if describe else None
    notes: list[str] = []
    scale = target_model = None
    if target is not None:
        scale = host_scale(prof, target, here_host=inventory.host if inventory is not None else None, notes=notes)
        target_model = CostModel(prof, describe=[target], cpu_scale=scale,
                                 target_cpu=target.cpu if scale is not None else None)
    # this machine's model: its own CPU; a described GPU still pays its own host's time
    model = CostModel(prof, describe=[target] if target else None, host_scale=scale)
    here = ["cpu", *[d for d, spec in prof.devices.items() if spec.get("kind", "cpu") != "cpu"
                     and d in model.devices]]  # every profiled accelerator, whatever its kind
    at = size or prof.target_size or max(prof.measured_sizes or prof.sizes or [0]) or None
    host = {k: v for k, v in prof.machine.items() if v is None or isinstance(v, (str, int, float))}
    inv = inventory if inventory is not None else Inventory(devices=[], host=host)
    costs = Costs(inv, prof, model, here, at, described=list(model.described), target=target,
                  target_model=target_model)
    costs.target_notes = notes
    return costs


@contextlib.contextmanager
def open_site(scheduler: Any = None, *, inventory: Inventory | None = None, executor: str = "auto",
              cache: Any = None) -> Iterator[LocalSite | ClusterSite]:
    """This machine, or (with ``scheduler``: an address or a Client) the cluster there, for the block."""
    if scheduler is None:
        yield LocalSite(inventory, executor=executor, cache=cache)
        return
    from placer.executor.distributed import connect

    with connect(scheduler) as client:
        yield ClusterSite(client)
