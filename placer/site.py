"""Where work happens: this machine, or a dask.distributed cluster.

May import: placer.{devices,errors,pipeline,data}; placer.profile, placer.costmodel,
placer.target, placer.executor and placer.cluster inside methods, so that importing a site
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

from placer.data.costs import CostTable
from placer.devices import Inventory, discover
from placer.pipeline import Pipeline


class Costs:
    """What planning knows about a pipeline at a site: measurements, model, devices, network.

    Attributes
    ----------
    inventory : Inventory
        The site's devices.
    profile : Profile
        The stages as measured (under the site's device names).
    model : CostModel
        Fitted to ``profile`` (and to any described device).
    devices : list of str
        The devices to plan over: the CPU and every accelerator with measurements.
    size : int
        The size to plan for.
    network : dict or None
        ``{"latency_s", "bandwidth_Bps"}`` between the machines devices run on (a
        cluster's workers); None on one machine.
    notes : list of str
        Where each device was profiled, what the network measured.
    described : list of str
        Devices the site lacks, predicted from a description (planned apart, see
        :meth:`plan` with ``devices``).
    no_accelerator_reason : str or None
        Why the site has no accelerator to plan over, when that is worth a warning
        on the plan (a cluster without GPU workers).
    """

    no_accelerator_reason: str | None = None
    #: how the target's predictions were made (CPU scaling), for its plan
    target_notes: list[str] = []
    #: what the site is called in a plan's reasons
    where = "this machine"

    def __init__(self, inventory: Inventory, profile: Any, model: Any, devices: list[str], size: int,
                 network: dict[str, float] | None = None, notes: list[str] | None = None,
                 described: list[str] | None = None, target: Any = None, target_model: Any = None):
        self.inventory, self.profile, self.model = inventory, profile, model
        self.devices, self.size = devices, size
        self.network, self.notes = network, list(notes or [])
        self.described = list(described or [])
        #: the described machine (a placer.target.TargetDescription) and its cost model, whose
        #: ``cpu`` is the target's CPU when the target describes one
        self.target = target
        self.target_model = target_model if target_model is not None else model

    def table(self, size: float | None = None, devices: list[str] | None = None, *,
              target: bool = False) -> CostTable:
        """The :class:`~placer.data.costs.CostTable` at ``size`` (default :attr:`size`) over ``devices``
        (default :attr:`devices`; with ``target``, the target's CPU and GPUs), with the network when
        there is one."""
        if target:
            return self.target_model.table(self.size if size is None else size,
                                           devices=devices or ["cpu", *self.described])
        table = self.model.table(self.size if size is None else size, devices=devices or self.devices)
        if self.network is None or len(table.devices) < 2:
            return table
        doc = table.model_dump(exclude_defaults=True)
        doc["network"] = dict(self.network)
        return CostTable.model_validate(doc)

    def predictions(self, size: float | None = None) -> dict[str, dict[str, dict]]:
        """Stage → device → the prediction (value, error, label) at ``size``, described devices included."""
        at = self.size if size is None else size
        out = {s: {d: pr.model_dump() for d, pr in devs.items()}
               for s, devs in self.model.predictions(at, self.devices).items()}
        if self.described:
            for s, devs in self.target_model.predictions(at, self.described).items():
                out.setdefault(s, {}).update({d: pr.model_dump() for d, pr in devs.items()})
        return out

    def plan(self, *, objective: str = "makespan", method: str = "auto", deadline_s: float | None = None,
             size: float | None = None, devices: list[str] | None = None, target: bool = False):
        """The best placement at ``size`` over ``devices``, with crossover sizes over the same devices
        (with ``target``: over the described target machine, its CPU included).

        Returns
        -------
        Plan
            As :func:`placer.optimize.plan`.
        """
        from placer.optimize import plan

        at = self.size if size is None else size

        def cost_at(s: float) -> CostTable:
            return self.table(s, devices, target=target)

        result = plan(cost_at(at), objective=objective, method=method, deadline_s=deadline_s,
                      cost_at=cost_at, size=at)
        why = self.no_accelerator_reason
        if target and self.target is not None:
            result.warnings += [n for n in self.target_notes if n not in result.warnings]
        if why and len(result.devices) == 1 and not target:
            for st in result.stages:
                st.reason += f" ({self.where} has no GPU: {why})"
            result.warnings.append(f"every stage is planned on the CPU: {why}")
        return result


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
              **profile_options: Any) -> Costs:
        """Profile ``pipeline`` here and fit the cost model (with ``describe``: a device this machine lacks)."""
        prof = self.measure(pipeline, size=size, budget_s=budget_s, **profile_options)
        return costs_from_profile(prof, size=size, describe=describe, inventory=self.inventory())

    def execute(self, pipeline: Pipeline, placement: Mapping[str, str] | str, *, warmup: bool = False,
                stream: Any = None):
        """Run ``placement`` here (once untimed first with ``warmup``) and return the measured run.

        ``stream`` (a :class:`~placer.stream.StreamConfig`) says how the pipeline's streams run.
        """
        from placer.executor import execute

        inv = self.inventory()
        spec = placement if isinstance(placement, str) else dict(placement)
        if warmup:
            execute(pipeline, spec, executor=self.executor, inventory=inv, stream=stream)
        return execute(pipeline, spec, executor=self.executor, inventory=inv, size=pipeline.size, stream=stream)


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
              **options: Any) -> Costs:
        """Profile ``pipeline`` on the workers and measure the network (:func:`placer.cluster.cluster_costs`).

        A described device is not planned on a cluster: ``describe`` is ignored.
        """
        from placer.cluster import cluster_costs

        costs = cluster_costs(pipeline, self.client, size=size, budget_s=budget_s, **options)
        self._inventory = costs.inventory
        return costs

    def execute(self, pipeline: Pipeline, placement: Mapping[str, str] | str, *, warmup: bool = False,
                stream: Any = None):
        """Run ``placement`` on the cluster (once untimed first with ``warmup``); a stream's CPU per-batch
        stages run there as tasks, with ``stream`` (a :class:`~placer.stream.StreamConfig`) on top."""
        from placer.executor import execute

        spec = placement if isinstance(placement, str) else dict(placement)
        if warmup:
            execute(pipeline, spec, scheduler=self.client, stream=stream)
        return execute(pipeline, spec, scheduler=self.client, size=pipeline.size, stream=stream)


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
