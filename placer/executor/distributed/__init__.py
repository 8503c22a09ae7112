"""Running a pipeline on an existing dask.distributed cluster.

May import: placer.pipeline, placer.executor.*; distributed inside functions, so that
importing this package stays cheap. Planning for a cluster lives in :mod:`placer.cluster`.

Modules
-------
connection  connecting to a scheduler (:func:`connect`), the errors a cluster raises
inventory   the workers and their devices (:func:`cluster_devices`), a placement checked against them
tasks       what runs on a worker: a stage, a copy, stopping a cancelled task
lanes       :class:`DaskLanes`, the engine's lanes on the cluster

This package re-exports their public names and runs a pipeline (:func:`run_on_cluster`).

The same :class:`~placer.executor.engine.Engine` drives the cluster: only the lanes
differ. :class:`DaskLanes` gives the engine its usual lanes (a pool of waiting
threads per lane, as :class:`~placer.executor.engine.ThreadLanes`), but a stage's
task submits it to the cluster with ``client.submit`` and waits for it, and the
engine's values are :class:`distributed.Future` objects: data stays on the workers
between stages, and only the final outputs are gathered to the client.

Routing follows the convention of dask-cuda's ``LocalCUDACluster``: a worker that
has a GPU declares the resource ``GPU`` (``dask worker ADDRESS --resources GPU=1``).

* a stage on the CPU may run on any worker;
* a stage on a GPU device (``gpu``, ``gpu:N``, ``gpu-sim``) is submitted with
  ``resources={"GPU": 1}``, so only a GPU worker runs it, one at a time per GPU,
  on that worker's own first GPU (dask-cuda gives each worker one GPU) or, for
  ``gpu-sim``, that worker's simulated test device;
* a copy to a GPU device is submitted with ``resources={"GPU": 0}``: it runs on a
  GPU worker without taking the GPU's slot (the engine's links never occupy a
  device), and a copy to the host runs where the data is.

Resources are requested per task at submission, not as graph annotations, which
graph optimisation may drop.

Faults. When a worker dies, the scheduler reschedules the tasks it was running on
another suitable worker and recomputes the results it held that are still needed
(the engine holds a future for every stage's output until the run ends); a task
that kills ``distributed.scheduler.allowed-failures`` workers (default 3) fails
with ``KilledWorker``. ``retries`` re-runs a stage that *raised*; it is 0 by
default because a deterministic stage that raises once raises again.

Stage functions travel with each task, pickled by cloudpickle by reference; the
modules that are not installed packages (a pipeline ``.py`` file, a helper or test
module) are sent to every worker as source first and executed there under their own
names (:mod:`placer.executor.shipping`), so workers need placer and the libraries
the stages import (torch, numpy, ...), not the pipeline's file. A stage that cannot
be pickled is refused before anything runs, naming the stage and the object.
"""

from __future__ import annotations

import sys
from typing import Any

from placer.executor.distributed.connection import (
    ClusterError,
    ClusterProfileError,
    SchedulerAddressError,
    SchedulerLostError,
    SchedulerUnreachableError,
    check_address,
    connect,
    scheduler_lost,
)
from placer.executor.distributed.inventory import (
    GPU_RESOURCE,
    WorkerInfo,
    cluster_devices,
    cluster_workers,
    cost_devices,
    resolve_on_cluster,
)
from placer.executor.distributed.lanes import DaskLanes, done_event
from placer.executor.distributed.tasks import TaskCancelled, stop_when_cancelled, worker_device
from placer.executor.shipping import ShippingError, ship_by_value, ship_code, stage_payloads
from placer.pipeline import as_pipeline

def run_on_cluster(pipeline: Any, placement: Any, scheduler: Any, *, workers: int | None = None,
                   size: int | None = None, retries: int = 0, stage_timeout: float | None = None):
    """Run ``pipeline`` on the dask cluster at ``scheduler`` (an address or a Client).

    What :func:`placer.executor.execute` does with ``scheduler=``: the devices are
    read from the cluster, the placement is checked against them before anything
    runs, and the one engine runs the pipeline on :class:`DaskLanes`.

    Returns
    -------
    Run
        As :func:`~placer.executor.execute`; each stage record names its ``worker``,
        and ``run.outputs`` holds only the final outputs.
    """
    from placer.executor import Prepared  # the package's own entry point, loaded before this one runs

    p = as_pipeline(pipeline)
    p.validate()
    with connect(scheduler) as client:
        inv = cluster_devices(client)
        devices = resolve_on_cluster(p, placement, inv)
        w = int(workers or inv.get("cpu").workers)
        acc = sorted({d.name for d in devices.values() if d.is_accelerator})
        lanes = DaskLanes(client, w, acc, stage_payloads(p, ship_code(client, p)), retries=retries)
        with Prepared(p, inventory=inv, devices=devices, workers=w, size=size, lanes=lanes,
                      stage_timeout=stage_timeout) as prepared:
            return prepared.run()


def is_client(obj: Any) -> bool:
    """Whether ``obj`` is a :class:`distributed.Client` (without importing distributed needlessly)."""
    mod = sys.modules.get("distributed")
    return mod is not None and isinstance(obj, mod.Client)


__all__ = [
    "GPU_RESOURCE",
    "ClusterError",
    "ClusterProfileError",
    "DaskLanes",
    "SchedulerAddressError",
    "SchedulerLostError",
    "SchedulerUnreachableError",
    "ShippingError",
    "TaskCancelled",
    "WorkerInfo",
    "check_address",
    "cluster_devices",
    "cluster_workers",
    "connect",
    "cost_devices",
    "done_event",
    "is_client",
    "resolve_on_cluster",
    "run_on_cluster",
    "scheduler_lost",
    "ship_by_value",
    "ship_code",
    "stage_payloads",
    "stop_when_cancelled",
    "worker_device",
]
