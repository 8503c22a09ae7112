"""What a dask cluster has: its workers, their devices, and a placement checked against them.

May import: pydantic, placer.devices, placer.errors, placer.pipeline, placer.placement,
placer.executor.distributed.connection.

Each worker reports the accelerators it discovered (:func:`cluster_workers`); the
devices' kinds list the cluster's devices from those reports
(:meth:`~placer.devices.DeviceKind.cluster_devices`). A worker that has a GPU declares
the resource :data:`GPU_RESOURCE` (dask-cuda's convention).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from placer.devices import SIM, Device, Inventory, kinds, test_devices_enabled
from placer.errors import DeviceUnavailableError
from placer.executor.distributed.connection import ClusterError
from placer.pipeline import Pipeline
from placer.placement import parse_spec, resolve

#: the worker resource that marks a GPU worker (dask-cuda's convention)
GPU_RESOURCE = "GPU"


class WorkerInfo(BaseModel):
    """One worker of the cluster, as placer sees it."""

    address: str
    name: str
    nthreads: int
    memory_limit: int | None = None
    resources: dict[str, float] = Field(default_factory=dict)
    #: labels and memory of the CUDA GPUs torch sees on the worker
    gpus: list[tuple[str, int]] = Field(default_factory=list)
    #: the accelerators the worker discovered, as it names them (``Device`` fields)
    accelerators: list[dict[str, Any]] = Field(default_factory=list)
    #: why the worker cannot use a GPU, when it has none
    gpu_unavailable: str | None = None
    test_devices: bool = False
    host: dict[str, str | int | float | None] = Field(default_factory=dict)

    @property
    def is_gpu_worker(self) -> bool:
        """Whether the worker declares the ``GPU`` resource."""
        return self.resources.get(GPU_RESOURCE, 0) >= 1


def _probe() -> dict[str, Any]:
    """Run on a worker: what its devices are (see :class:`WorkerInfo`)."""
    from placer.devices import discover  # on the worker

    inv = discover()
    return {
        "gpus": [(d.label, int(d.memory_bytes or 0)) for d in inv.gpus],
        "accelerators": [d.model_dump() for d in inv.devices if d.is_accelerator],
        "gpu_unavailable": inv.unavailable.get("torch.cuda"),
        "test_devices": test_devices_enabled(),
        "host": dict(inv.host),
    }


def cluster_workers(client: Any) -> list[WorkerInfo]:
    """Every worker of the cluster, with its threads, resources and devices, by address."""
    info = client.scheduler_info(n_workers=-1)
    probes = client.run(_probe) if info.get("workers") else {}
    out = []
    for addr, w in sorted(info.get("workers", {}).items()):
        pr = probes.get(addr, {})
        out.append(WorkerInfo(
            address=addr,
            name=str(w.get("name", addr)),
            nthreads=int(w.get("nthreads", 1)),
            memory_limit=int(w["memory_limit"]) if w.get("memory_limit") else None,
            resources={k: float(v) for k, v in (w.get("resources") or {}).items()},
            gpus=[tuple(g) for g in pr.get("gpus", [])],
            accelerators=list(pr.get("accelerators", [])),
            gpu_unavailable=pr.get("gpu_unavailable"),
            test_devices=bool(pr.get("test_devices")),
            host=pr.get("host", {}),
        ))
    return out


def cluster_devices(client: Any, workers: list[WorkerInfo] | None = None) -> Inventory:
    """The cluster's devices, as an :class:`~placer.devices.Inventory`.

    ``cpu`` stands for every worker thread (any worker runs CPU stages). Each kind of
    accelerator (enabled in this process) lists its devices from what the workers
    that declare the ``GPU`` resource discovered
    (:meth:`~placer.devices.DeviceKind.cluster_devices`): ``gpu:N`` is the N-th GPU
    worker (by address) whose torch sees a CUDA GPU; ``gpu-sim`` is listed when a
    GPU worker has the simulated test device enabled, and it is never a GPU.
    ``unavailable["torch.cuda"]`` says why the cluster has no GPU, when it has none.
    """
    ws = workers if workers is not None else cluster_workers(client)
    address = client.scheduler.address
    if not ws:
        raise ClusterError(
            f"the dask cluster at {address} has no workers; start some with `dask worker {address}`"
        )
    threads = sum(w.nthreads for w in ws)
    mem = [w.memory_limit for w in ws if w.memory_limit]
    first = ws[0].host
    devices = [Device(
        name="cpu", kind="cpu", workers=threads, memory_bytes=sum(mem) if mem else None,
        label=f"CPU: {len(ws)} dask worker{'s' if len(ws) != 1 else ''}, {threads} thread"
              f"{'s' if threads != 1 else ''} ({address}; {first.get('cpu_model', '?')})",
        backends=["numpy", "torch", "numba", "dask"],
    )]
    gpu_workers = [w for w in ws if w.is_gpu_worker]
    for kind in kinds().values():
        if not kind.accelerator or not kind.enabled():
            continue
        found = [(w.address, [Device.model_validate(d) for d in w.accelerators if d.get("kind") == kind.name])
                 for w in gpu_workers]
        found = [(address, own) for address, own in found if own]
        if found:
            devices += kind.cluster_devices(found)
    unavailable = {}
    if not any(d.is_gpu for d in devices):
        unavailable["torch.cuda"] = _no_gpu_reason(address, gpu_workers)
    host = {
        "scheduler": address,
        "workers": len(ws),
        "gpu_workers": len(gpu_workers),
        "cores": threads,
        **{k: first.get(k) for k in ("machine", "cpu_model", "python", "torch", "numba")},
    }
    return Inventory(devices=devices, unavailable=unavailable, host=host)


def _no_gpu_reason(address: str, gpu_workers: list[WorkerInfo]) -> str:
    if not gpu_workers:
        return (f"no worker of the dask cluster at {address} declares a {GPU_RESOURCE} resource; "
                f"start one with `dask worker {address} --resources {GPU_RESOURCE}=1`")
    whys = "; ".join(f"{w.address}: {w.gpu_unavailable or 'no CUDA GPU'}" for w in gpu_workers)
    return f"the workers that declare {GPU_RESOURCE} have no CUDA GPU that torch can use ({whys})"


def cost_devices(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """The cluster's devices in the form of the cost table's ``devices`` map."""
    out = {}
    for d in inventory.devices:
        spec: dict[str, Any] = {"kind": d.kind, "workers": 1 if d.is_accelerator else d.workers,
                                "label": d.label}
        if d.memory_bytes:
            spec["memory_bytes"] = float(d.memory_bytes)
        out[d.name] = spec
    return out


def resolve_on_cluster(pipeline: Pipeline, placement: Any, inventory: Inventory) -> dict[str, Device]:
    """Resolve a placement against the cluster's devices, before anything runs.

    Raises
    ------
    ClusterError
        Naming the stage, when it is placed on a device the cluster lacks.
    """
    try:
        return resolve(pipeline, placement, inventory)
    except DeviceUnavailableError as exc:
        if exc.stage is None:
            raise
        dev = _placed_device(pipeline, placement, exc.stage)
        if dev == SIM and not test_devices_enabled():
            raise
        address = inventory.host.get("scheduler")
        if not inventory.host.get("gpu_workers"):
            why = _no_gpu_reason(str(address), [])
        elif dev == SIM:
            why = (f"no {GPU_RESOURCE} worker of the dask cluster at {address} has the simulated "
                   "test device enabled (PLACER_TEST_DEVICES=1 in the worker's environment)")
        else:
            have = ", ".join(d.name for d in inventory.gpus)
            why = inventory.unavailable.get("torch.cuda") or f"the cluster's GPUs are {have}"
        raise ClusterError(
            f"stage {exc.stage!r} is placed on {dev}, but {why}; place it on cpu or add a GPU worker",
            stage=exc.stage,
        ) from None


def _placed_device(pipeline: Pipeline, placement: Any, stage: str) -> str:
    if isinstance(placement, str):
        raw = parse_spec(placement, pipeline.order())
    elif hasattr(placement, "placement"):
        raw = dict(placement.placement)
    else:
        raw = dict(placement or {})
    dev = str(raw.get(stage) or pipeline.stages[stage].pin or "cpu").strip().lower()
    return dev
