"""Planning for a dask.distributed cluster: its devices, its network, its plan.

May import: placer.executor.distributed, placer.executor.shipping, placer.devices, placer.errors, placer.pipeline,
placer.site_facts, pydantic;
distributed, placer.loader, placer.profile, placer.costmodel and placer.optimize inside
functions.

:func:`plan_for_cluster` reads the cluster's devices, profiles the pipeline on its
workers (the CPU on a CPU worker, each GPU kind on a GPU worker), measures the network
between workers (:func:`measure_worker_link`), and plans over the cluster's devices
with the network charged in the cost table (``docs/cluster.md``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from placer.devices import SIM, Inventory
from placer.executor.distributed import (
    GPU_RESOURCE,
    ClusterError,
    ClusterProfileError,
    WorkerInfo,
    cluster_devices,
    cluster_workers,
    connect,
    cost_devices,
    ShippingError,
    ship_code,
    stage_payloads,
)
from placer.executor.shipping import by_reference, ship_modules
from placer.errors import validation_line
from placer.pipeline import Pipeline
from placer.site_facts import Costs


# -- measuring the network between workers -------------------------------------------------
class WorkerLink(BaseModel):
    """Measured copies of arrays between two workers, and the fitted link."""

    src: str
    dst: str
    sizes: list[int]
    #: per size, the measured seconds of each repeat (from the receiving worker's log)
    raw_seconds: list[list[float]]
    latency_s: float
    bandwidth_Bps: float
    rel_error: float = 0.0

    def seconds(self, nbytes: float) -> float:
        """Predicted seconds to move ``nbytes`` between the two workers."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth_Bps

    def table_link(self) -> dict[str, float]:
        """The one-line form ``{"latency_s", "bandwidth_Bps"}`` of the cost table's links."""
        return {"latency_s": self.latency_s, "bandwidth_Bps": self.bandwidth_Bps}


def _payload(nbytes: int, salt: int):
    import numpy as np

    a = np.empty(max(1, nbytes // 8), dtype=np.float64)
    a.fill(salt)
    return a


def _size_of(a) -> int:
    return int(a.nbytes)


def _incoming(keys: list[str], dask_worker=None) -> dict[str, float]:
    out = {}
    for entry in list(dask_worker.transfer_incoming_log):
        for k in entry.get("keys", {}):
            if k in keys:
                out[k] = float(entry["duration"])
    return out


def measure_worker_link(
    client: Any,
    *,
    src: str | None = None,
    dst: str | None = None,
    sizes: Sequence[int] = (1 << 12, 1 << 18, 1 << 22),
    repeats: int = 3,
) -> WorkerLink:
    """Measure moving arrays of ``sizes`` bytes from worker ``src`` to worker ``dst``.

    The times are those the receiving worker logs for fetching the data (its
    ``transfer_incoming_log``), so they hold the network and (de)serialisation but
    not scheduling. The line is fitted through each size's fastest copy (noise only adds time). Default
    workers: the first two by address.
    """
    from placer.costmodel.bus import fit_link

    addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if len(addrs) < 2:
        raise ClusterError("measuring the link between workers needs at least two workers")
    src = src or addrs[0]
    dst = dst or next(a for a in addrs if a != src)
    raw: list[list[float]] = []
    for size in sizes:
        keys, futs = [], []
        for r in range(repeats):
            key = f"placer-link-{uuid.uuid4().hex[:8]}"
            a = client.submit(_payload, int(size), r, key=key, workers=[src], allow_other_workers=False)
            b = client.submit(_size_of, a, workers=[dst], allow_other_workers=False, pure=False)
            b.result()
            keys.append(key)
            futs += [a, b]
        got = client.run(_incoming, keys, workers=[dst])[dst]
        client.cancel(futs)
        missing = [k for k in keys if k not in got]
        if missing:
            raise ClusterError(f"worker {dst} logged no transfer for {len(missing)} of {len(keys)} copies")
        raw.append([got[k] for k in keys])
    fastest = [min(r) for r in raw]  # noise only adds time: a busy machine slowed 2 of 3 copies of 4 MiB 7x
    link = fit_link([float(s) for s in sizes], [max(t, 1e-9) for t in fastest])
    return WorkerLink(src=src, dst=dst, sizes=[int(s) for s in sizes], raw_seconds=raw,
                      latency_s=link.latency_s, bandwidth_Bps=link.bandwidth_Bps, rel_error=link.rel_error)


# -- planning for the cluster ----------------------------------------------------------------
#: bytes of the arrays moved between two workers to measure the network
LINK_SIZES = (1 << 12, 1 << 18, 1 << 22)


class _Builder:
    """``build(size, **params)`` of a pipeline, picklable to a worker (its module travels by value).

    ``params`` are the :func:`placer.loader.build_params` in force where it was made
    (``placer plan --scheduler ... -p seed=1``): the workers' builds get them too.
    """

    def __init__(self, build: Any, name: str | None, params: dict[str, Any] | None = None):
        self.build, self.name, self.params = build, name, dict(params or {})

    def __call__(self, size: int | None = None) -> Pipeline:
        import inspect

        from placer.pipeline import as_pipeline

        takes_size = "size" in inspect.signature(self.build).parameters
        built = self.build(size=size, **self.params) if takes_size else self.build(**self.params)
        p = as_pipeline(built, name=self.name)
        if p.size is None:
            p.size = size
        return p


def _pipeline_payload(pipeline: Any, client: Any) -> bytes:
    """The pipeline (reference, ``build`` function or built Pipeline), pickled for ``client``'s workers.

    Its modules that are not installed are sent to the workers as source first
    (:func:`~placer.executor.distributed.ship_code`), so that it pickles by reference.
    """
    import cloudpickle

    from placer.loader import current_build_params, load_builder
    from placer.pipeline import as_pipeline

    params = current_build_params()
    if isinstance(pipeline, str):
        build = load_builder(pipeline)
        obj: Any = _Builder(build, Path(pipeline).stem if pipeline.endswith(".py") else pipeline, params)
    elif callable(pipeline) and not isinstance(pipeline, Pipeline):
        build = pipeline
        obj = _Builder(pipeline, None, params) if params else pipeline
    else:
        obj = as_pipeline(pipeline)
        modules = ship_code(client, obj)
        stage_payloads(obj, modules)  # refuses a stage that cannot be pickled, naming it
        with by_reference(modules):
            return cloudpickle.dumps(obj)
    modules = ship_modules(client, [build])
    with by_reference(modules):
        try:
            return cloudpickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001 - explained, naming the function
            raise ShippingError(
                f"the pipeline's build function {getattr(build, '__qualname__', build)!r} cannot be sent to "
                f"the dask workers ({type(exc).__name__}: {exc}); define it in a pipeline file"
            ) from None


def _remote_profile(payload: bytes, devices: list[str], size: int | None, budget_s: float | None,
                    cache: bool):
    """Run on a worker: profile the pipeline on this worker's ``devices``."""
    import cloudpickle
    from distributed import get_worker

    from placer.devices import discover
    from placer.profile import profile

    inv = discover()
    # a CPU stage on this worker gets its threads, as in a run (see placer.executor.distributed.tasks.stage_task)
    cpu = inv.get("cpu").model_copy(update={"workers": get_worker().state.nthreads})
    inv = inv.model_copy(update={"devices": [cpu if d.name == "cpu" else d for d in inv.devices]})
    return profile(cloudpickle.loads(payload), size=size, budget_s=budget_s, devices=devices,
                   inventory=inv, cache=None if cache else False, count_work_for_absent=False,
                   progress=False)


class ClusterCosts(Costs):
    """What planning knows about a pipeline on a cluster: its devices, measurements and network.

    A :class:`~placer.site_facts.Costs` whose devices are the cluster's (each ``gpu:N`` a GPU
    worker's) and whose network was measured between two workers.

    Attributes
    ----------
    link : WorkerLink or None
        The network measured between two workers (None: one worker, or no accelerator).
    notes : list of str
        Where each device was profiled and what the network measured (the
        workers' own notes, on skipped sizes and noisy or failed measurements,
        are in ``profile.notes``, after these).
    """

    where = "the cluster"

    def __init__(self, inventory: Inventory, profile: Any, model: Any, link: WorkerLink | None,
                 size: int, notes: list[str]):
        devices = [d.name for d in inventory.devices if d.name == "cpu" or d.name in profile.devices]
        super().__init__(inventory, profile, model, devices, size,
                         network=link.table_link() if link is not None else None, notes=notes)
        self.link = link

    @property
    def no_accelerator_reason(self) -> str:
        return self.inventory.unavailable.get("torch.cuda") or "no accelerator of the cluster has measurements"


def cluster_costs(
    pipeline: Any,
    scheduler: Any,
    *,
    size: int | None = None,
    budget_s: float | None = 30.0,
    link_sizes: Sequence[int] = LINK_SIZES,
    link_repeats: int = 3,
    cache: bool = True,
) -> ClusterCosts:
    """Profile ``pipeline`` on the cluster's workers and measure its network.

    The CPU is profiled on one worker (a non-GPU one when there is one), each kind
    of GPU on a GPU worker with that GPU (taking its ``GPU`` resource), and
    ``gpu-sim`` on a GPU worker that has it; the profiles run at the same time,
    each within ``budget_s``. Every ``gpu:N`` of the cluster gets the measurements
    of its kind of GPU. The network is measured from a CPU worker to a GPU worker
    (:func:`measure_worker_link`).

    Parameters
    ----------
    pipeline : str, callable or Pipeline
        A pipeline file or ``module:function``, a ``build(size)`` function, or a
        built pipeline (profiled at its one size). Its code travels to the workers
        by cloudpickle, as a run's stages do.
    scheduler : str or distributed.Client
    size : int, optional
        The size to plan for (profiling measures up to it when the budget allows).
    budget_s : float or None
        Profiling time on each worker.
    link_sizes, link_repeats
        The arrays moved between two workers to measure the network.
    cache : bool
        Let each worker reuse and update its own profile cache.

    Raises
    ------
    ClusterError
        When the cluster is unreachable or has no workers; :class:`ClusterProfileError`
    when profiling on a worker fails (naming the worker and its devices).
    """
    from placer.costmodel.model import CostModel

    with connect(scheduler) as client:
        payload = _pipeline_payload(pipeline, client)
        workers = cluster_workers(client)
        inv = cluster_devices(client, workers)
        jobs = _profile_jobs(workers, inv)
        futs = {key: client.submit(_remote_profile, payload, [local], size, budget_s, cache, workers=[w.address],
                                   resources={GPU_RESOURCE: 1} if local != "cpu" else None, pure=False)
                for key, (w, local, _) in jobs.items()}
        profiles = {}
        for key, fut in futs.items():
            try:
                profiles[key] = fut.result()
            except Exception as exc:  # noqa: BLE001 - reraised naming the worker
                client.cancel(list(futs.values()))
                why = validation_line(exc) or (str(exc).splitlines()[0] if str(exc) else "")
                raise ClusterProfileError(
                    f"profiling {', '.join(jobs[key][2])} on worker {jobs[key][0].address} failed: "
                    f"{type(exc).__name__}: {why}; fix the "
                    "pipeline or the worker, or give a placement"
                ) from None
        notes = [f"{', '.join(names)} profiled on worker {w.address} (as its {local})"
                 for w, local, names in jobs.values()]
        # measured once the profiles are done, so that they do not disturb each other
        link = None
        if len(inv.devices) > 1 and len(workers) > 1:
            link = measure_worker_link(client, **_link_ends(workers), sizes=link_sizes, repeats=link_repeats)
            notes.append(f"network {link.src} -> {link.dst}: latency {link.latency_s * 1e3:.3g} ms, "
                         f"bandwidth {link.bandwidth_Bps / 1e6:.4g} MB/s")
        elif len(inv.devices) > 1:
            notes.append("one worker: data never crosses the network")
    prof = _merge_profiles(profiles, jobs, inv)
    prof.notes[:0] = notes
    plan_size = size or prof.target_size or max(prof.measured_sizes or [1])
    return ClusterCosts(inv, prof, CostModel(prof), link, int(plan_size), notes)


def _profile_jobs(workers: list[WorkerInfo], inv: Inventory) -> dict[str, tuple[WorkerInfo, str, list[str]]]:
    """What to profile where: key -> (worker, its local device name, the cluster devices it stands for)."""
    cpu_worker = next((w for w in workers if not w.is_gpu_worker), workers[0])
    jobs = {"cpu": (cpu_worker, "cpu", ["cpu"])}
    real = [w for w in workers if w.is_gpu_worker and w.gpus]
    by_label: dict[str, list[str]] = {}
    first: dict[str, WorkerInfo] = {}
    for i, w in enumerate(real):  # gpu:i is the i-th GPU worker, as in cluster_devices
        by_label.setdefault(w.gpus[0][0], []).append(f"gpu:{i}")
        first.setdefault(w.gpus[0][0], w)
    for n, (label, names) in enumerate(by_label.items()):
        jobs[f"gpu{n}"] = (first[label], "gpu:0", names)
    if inv.get(SIM) is not None:
        w = next(w for w in workers if w.is_gpu_worker and w.test_devices)
        jobs["sim"] = (w, SIM, [SIM])
    return jobs


def _link_ends(workers: list[WorkerInfo]) -> dict[str, str]:
    """A CPU worker to a GPU worker when the cluster has both (data goes that way first)."""
    gpu = [w.address for w in workers if w.is_gpu_worker]
    cpu = [w.address for w in workers if not w.is_gpu_worker]
    if gpu and cpu:
        return {"src": cpu[0], "dst": gpu[0]}
    return {}


def _merge_profiles(profiles: dict[str, Any], jobs: dict, inv: Inventory):
    """One profile under the cluster's device names, from the workers' profiles."""
    from placer.profile import Profile

    base = profiles["cpu"]
    specs = cost_devices(inv)
    merged = Profile(
        pipeline=base.pipeline, fingerprint=f"cluster:{inv.host.get('scheduler')}",
        machine={**inv.host, "profiled_on": {k: jobs[k][0].address for k in profiles}},
        devices={}, sizes=sorted({s for p in profiles.values() for s in p.sizes}),
        measured_sizes=sorted({s for p in profiles.values() for s in p.measured_sizes}),
        target_size=base.target_size, size_unit=base.size_unit, budget_s=base.budget_s,
        elapsed_s=max(p.elapsed_s for p in profiles.values()), created_at=base.created_at,
        stages={n: sp.model_copy(deep=True) for n, sp in base.stages.items()},
        notes=[f"{jobs[k][0].address}: {note}" for k, p in profiles.items() for note in p.notes],
    )
    for key, prof in profiles.items():
        _, local, names = jobs[key]
        for name in names:
            merged.devices[name] = specs[name]
            if local in prof.transfer:
                merged.transfer[name] = prof.transfer[local].model_copy(update={"device": name})
            for n, sp in prof.stages.items():
                dp = sp.devices.get(local)
                if dp is not None and n in merged.stages:
                    merged.stages[n].devices[name] = dp.model_copy(update={"device": name}, deep=True)
    return merged


def plan_for_cluster(
    pipeline: Any,
    scheduler: Any,
    *,
    size: int | None = None,
    budget_s: float | None = 30.0,
    objective: str = "makespan",
    method: str = "auto",
    deadline_s: float | None = None,
    link_sizes: Sequence[int] = LINK_SIZES,
    link_repeats: int = 3,
    cache: bool = True,
):
    """The best placement of ``pipeline`` on the cluster at ``scheduler``.

    Profiles the stages on the workers and measures the network between them
    (:func:`cluster_costs`), then plans over the cluster's devices (every GPU
    worker's ``gpu:N``, and the CPU with all worker threads), charging the network
    on every copy between two devices (``docs/schedule.md``). Without a GPU worker,
    every stage is planned on the CPU and each stage's reason says why.

    Returns
    -------
    Plan
        As :func:`placer.optimize.plan`; its ``placement`` runs with
        ``execute(pipeline, plan, scheduler=...)``.
    """
    costs = cluster_costs(pipeline, scheduler, size=size, budget_s=budget_s, link_sizes=link_sizes,
                          link_repeats=link_repeats, cache=cache)
    return plan_from_costs(costs, objective=objective, method=method, deadline_s=deadline_s)


def plan_from_costs(costs: ClusterCosts, *, objective: str = "makespan", method: str = "auto",
                    deadline_s: float | None = None):
    """Plan from :func:`cluster_costs` (with crossover sizes over the same devices and network)."""
    return costs.plan(objective=objective, method=method, deadline_s=deadline_s)


__all__ = [
    "ClusterCosts",
    "WorkerLink",
    "cluster_costs",
    "measure_worker_link",
    "plan_for_cluster",
    "plan_from_costs",
]
