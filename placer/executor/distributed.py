"""Running a pipeline on an existing dask.distributed cluster.

May import: placer.pipeline, placer.devices, placer.placement, placer.errors,
placer.executor.*, numpy, pydantic; distributed and cloudpickle inside functions, so
that importing this module stays cheap. Planning for a cluster lives in
:mod:`placer.cluster`.

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

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel, Field

from placer.devices import SIM, Device, Inventory, is_real_gpu, kinds, test_devices_enabled
from placer.errors import DeviceError, DeviceUnavailableError
from placer.executor.engine import ThreadLanes
from placer.executor.shipping import (
    ModuleSource,
    ShippingError,
    dumps_stage,
    installed,
    ship_modules,
    stage_objects,
)
from placer.pipeline import Pipeline

#: the worker resource that marks a GPU worker (dask-cuda's convention)
GPU_RESOURCE = "GPU"
#: seconds to wait for the scheduler when connecting by address
CONNECT_TIMEOUT_S = 10.0
#: seconds between a worker's checks whether the stage task it runs was cancelled
CANCEL_POLL_S = 0.2
#: seconds to wait for a client to close (a lost scheduler must not hold the exit up)
CLOSE_TIMEOUT_S = 2.0


class ClusterError(DeviceError):
    """The cluster cannot run the pipeline (unreachable, or lacks a device a stage needs)."""


class SchedulerUnreachableError(ClusterError):
    """No dask scheduler answered at the address within the timeout."""


class SchedulerAddressError(ClusterError, ValueError):
    """The scheduler address is malformed (a usage error: nothing was contacted)."""


class ClusterProfileError(ClusterError):
    """Profiling the pipeline on a worker failed (planning for the cluster)."""


# -- connecting -----------------------------------------------------------------------
def check_address(scheduler: str) -> str:
    """``scheduler`` as an address dask can connect to (``tcp://`` by default), checked without connecting.

    Raises
    ------
    SchedulerAddressError
        Naming what is wrong (no port, an ``http://`` dashboard address, an unknown
        scheme) and the form to use.
    """
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    address = scheduler.strip() if isinstance(scheduler, str) else scheduler
    form = "give the scheduler's address as tcp://HOST:PORT (the one `dask scheduler` prints; default port 8786)"
    if not isinstance(address, str) or not address:
        raise SchedulerAddressError(f"scheduler address {scheduler!r} is empty or not a string; {form}")
    if any(c.isspace() for c in address):
        raise SchedulerAddressError(f"scheduler address {address!r} contains spaces; {form}")
    scheme, loc = parse_address(address, strict=False)
    if scheme in ("http", "https"):
        raise SchedulerAddressError(
            f"scheduler address {address!r} is a web (dashboard) address; the scheduler itself listens "
            f"on another port: {form}")
    if scheme not in backends:
        raise SchedulerAddressError(
            f"scheduler address {address!r} has the unknown scheme {scheme!r} (dask knows "
            f"{', '.join(sorted(backends))}); {form}")
    if scheme != "inproc":
        try:
            host, port = parse_host_port(loc)
        except (ValueError, TypeError) as exc:
            raise SchedulerAddressError(f"scheduler address {address!r} is not HOST:PORT ({exc}); {form}") from None
        if not host or not 0 < int(port) < 65536:
            raise SchedulerAddressError(f"scheduler address {address!r} has no host or a port outside 1-65535; {form}")
    return address if "://" in address else f"{scheme}://{address}"


@contextlib.contextmanager
def connect(scheduler: Any, *, timeout: float | None = None) -> Iterator[Any]:
    """A :class:`distributed.Client` for ``scheduler`` (an address or a Client).

    A Client passed in is used as it is and left open; one made here from an
    address is closed on exit. ``timeout`` defaults to :data:`CONNECT_TIMEOUT_S`.

    Raises
    ------
    SchedulerAddressError
        When the address is malformed (checked before anything is contacted).
    SchedulerUnreachableError
        When no scheduler answers at the address within ``timeout`` seconds.
    """
    from distributed import Client

    if isinstance(scheduler, Client):
        with _lost_scheduler(scheduler, str(scheduler.scheduler.address)):
            yield scheduler
        return
    if not isinstance(scheduler, str):
        raise SchedulerAddressError(
            f"scheduler must be an address like tcp://HOST:8786 or a distributed.Client, "
            f"got {scheduler!r}"
        )
    address = check_address(scheduler)
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    with _quiet_client_log():
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise SchedulerUnreachableError(
                f"cannot reach the dask scheduler at {address} within {timeout:g} s "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no answer'}); "
                "start one with `dask scheduler` and check the address and port"
            ) from None
        try:
            with _lost_scheduler(client, address):
                yield client
        finally:
            with contextlib.suppress(Exception):
                client.close(timeout=CLOSE_TIMEOUT_S)


class SchedulerLostError(ClusterError):
    """The connection to the scheduler was lost while placer used the cluster."""


def scheduler_lost(client: Any) -> bool:
    """Whether ``client`` has lost its scheduler (reconnecting, or closed because it could not)."""
    return getattr(client, "status", "running") in ("connecting", "closing", "closed")


@contextlib.contextmanager
def _lost_scheduler(client: Any, address: str) -> Iterator[None]:
    """Any error raised in the block after the scheduler went away becomes one :class:`SchedulerLostError`."""
    try:
        yield
    except SchedulerLostError:
        raise
    except Exception as exc:
        if not scheduler_lost(client):
            raise
        stage = getattr(exc, "stage", None)
        during = f" while stage {stage!r} ran" if stage else ""
        err = SchedulerLostError(
            f"lost the connection to the dask scheduler at {address}{during}; the run stopped "
            "(the outputs held on the workers are gone with it); check that the scheduler is running "
            "and run again",
            stage=stage,
        )
        err.run = getattr(exc, "run", None)
        raise err from None


class _DropClientErrors:
    """A logging filter: drops distributed.client's own report of a lost scheduler (placer raises one error)."""

    def filter(self, record: Any) -> bool:
        return record.levelno < 40  # ERROR and above: the reconnect failure, said once by placer instead


@contextlib.contextmanager
def _quiet_client_log() -> Iterator[None]:
    import logging

    log = logging.getLogger("distributed.client")
    f = _DropClientErrors()
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)


# -- what the cluster has --------------------------------------------------------------
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
    from placer.devices import discover

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
    from placer.placement import resolve

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
    from placer.placement import parse_spec

    if isinstance(placement, str):
        raw = parse_spec(placement, pipeline.order())
    elif hasattr(placement, "placement"):
        raw = dict(placement.placement)
    else:
        raw = dict(placement or {})
    dev = str(raw.get(stage) or pipeline.stages[stage].pin or "cpu").strip().lower()
    return dev


# -- shipping stages -------------------------------------------------------------------
def ship_by_value(fns: Sequence[Any]) -> None:
    """Have cloudpickle pickle these functions' modules by value when they are not installed.

    For one fresh process that takes the parent's ``sys.path`` (a stream's process
    workers); dask workers get the modules as source instead (:mod:`placer.executor.shipping`).
    """
    import cloudpickle

    registered = set(cloudpickle.list_registry_pickle_by_value())
    for fn in fns:
        name = getattr(fn, "__module__", None)
        if name and name != "__main__" and name not in registered and not installed(name):
            cloudpickle.register_pickle_by_value(sys.modules[name])
            registered.add(name)


def stage_payloads(pipeline: Pipeline, modules: Sequence[ModuleSource] = ()) -> dict[str, bytes]:
    """Each stage, pickled for the workers, which have ``modules`` (see :func:`ship_code`).

    Raises
    ------
    ShippingError
        Naming the stage and the object that cannot be pickled.
    """
    return {n: dumps_stage(st, modules) for n, st in pipeline.stages.items()}


def ship_code(client: Any, pipeline: Pipeline) -> list[ModuleSource]:
    """Install the pipeline's modules that are not installed on the cluster's workers."""
    return ship_modules(client, stage_objects(pipeline.stages.values()))


# -- what runs on the workers ------------------------------------------------------------
def worker_device(name: str) -> Device:
    """The device of this worker that a placement's device name means.

    A GPU name means the worker's own first GPU (each GPU worker has one); any other
    name (``cpu``, ``gpu-sim``, another kind's) the worker's device of that name.
    """
    from distributed import get_worker

    from placer.devices import discover

    inv = discover()
    if not is_real_gpu(name):
        return inv.resolve(name)
    if not inv.gpus:
        raise DeviceUnavailableError(
            f"worker {get_worker().address} declares the {GPU_RESOURCE} resource but has no CUDA GPU "
            f"({inv.unavailable.get('torch.cuda', 'torch found none')}); fix the worker or place the "
            "stage on cpu"
        )
    return inv.gpus[0]


def _remote_stage(payload: bytes, device: str, inputs: dict[str, tuple[Any, dict]]) -> tuple[Any, dict]:
    """Run one stage on this worker; return its output and what the record needs."""
    import cloudpickle
    from distributed import get_worker

    from placer.executor.stagecall import call_stage
    from placer.executor.transfer import nbytes

    w = get_worker()
    stage = cloudpickle.loads(payload)
    dev = worker_device(device)
    args = {a: v[0] for a, v in inputs.items()}
    t0 = time.time()
    with stop_when_cancelled(w):
        out = call_stage(stage, dev, args, workers=w.state.nthreads)
    t1 = time.time()
    lane = device if dev.is_accelerator else "cpu"
    return out, {"worker": w.address, "lane": f"{lane}@{w.address}", "wall_start": t0, "wall_end": t1,
                 "output_bytes": nbytes(out)}


class TaskCancelled(Exception):
    """Raised in a worker's thread whose stage task was cancelled (a timeout, Ctrl-C, a lost client)."""


@contextlib.contextmanager
def stop_when_cancelled(worker: Any) -> Iterator[None]:
    """Stop the stage running in this worker thread once its task is cancelled.

    dask cannot stop a task that runs; without this, a cancelled stage would hold
    its worker's thread until it ended by itself. A watcher thread polls the task's
    state every :data:`CANCEL_POLL_S` seconds and raises :class:`TaskCancelled` in
    this thread (see :func:`~placer.executor.stagecall.stop_thread`).
    """
    from placer.executor.stagecall import stop_thread

    key = worker.get_current_task()
    ident, lock, done = threading.get_ident(), threading.Lock(), threading.Event()

    def watch() -> None:
        while not done.wait(CANCEL_POLL_S):
            ts = worker.state.tasks.get(key)
            if ts is None or ts.state in ("cancelled", "released", "forgotten"):
                with lock:
                    if not done.is_set():
                        stop_thread(ident, TaskCancelled)
                return

    threading.Thread(target=watch, name=f"placer-watch-{key}", daemon=True).start()
    try:
        yield
    finally:
        with lock:
            done.set()


def _remote_move(value: tuple[Any, dict], device: str) -> tuple[Any, dict]:
    """Copy a stage's output into this worker's ``device``."""
    from distributed import get_worker

    from placer.executor.transfer import to_location

    t0 = time.time()
    moved, nb, pinned = to_location(value[0], worker_device(device))
    t1 = time.time()
    return moved, {"worker": get_worker().address, "wall_start": t0, "wall_end": t1,
                   "bytes": nb, "pinned": pinned}


def _meta(value: tuple[Any, dict]) -> dict:
    return value[1]


# -- the lanes -----------------------------------------------------------------------------
class DaskLanes(ThreadLanes):
    """Lanes whose stages and copies run as tasks on a dask cluster.

    The engine's slots are kept as usual (``workers`` CPU stages at once, one stage
    per accelerator); each slot's thread submits its task to the cluster and waits.

    Parameters
    ----------
    client : distributed.Client
    workers : int
        CPU stages that may run at once (the cluster's threads).
    accelerators : list of str
        The device names of accelerator lanes.
    payloads : dict
        Each stage pickled (:func:`stage_payloads`).
    retries : int
        Re-runs of a stage that raises (worker deaths are handled by the scheduler).
    gpu_wait_s : float
        How long a GPU task may wait while no GPU worker is in the cluster before the
        run fails (a restarted worker comes back within it).
    """

    name = "distributed"

    def __init__(self, client: Any, workers: int, accelerators: list[str], payloads: dict[str, bytes],
                 *, retries: int = 0, gpu_wait_s: float = 60.0):
        super().__init__(workers, accelerators)
        self.client = client
        self.payloads = payloads
        self.retries = retries
        self.gpu_wait_s = gpu_wait_s
        self.run_id = uuid.uuid4().hex[:8]
        self._futures: list[Any] = []
        self._lock = threading.Lock()

    def lane_name(self, lane: str) -> str:
        return lane

    def _submit(self, fn, *args, key: str, resources: dict | None = None, retries: int = 0):
        fut = self.client.submit(fn, *args, key=key, resources=resources, retries=retries, pure=False)
        with self._lock:
            self._futures.append(fut)
        return fut

    def _wait_meta(self, fut: Any, key: str, needs_gpu: bool) -> dict:
        meta = self.client.submit(_meta, fut, key=f"{key}-meta", pure=False)
        try:
            return self._result(meta, needs_gpu)
        finally:
            meta.release()

    def _result(self, fut: Any, needs_gpu: bool) -> Any:
        no_gpu_since = None
        done = done_event(fut)
        while True:
            if done.wait(1.0):
                return fut.result()
            if not needs_gpu:
                continue
            if _has_gpu_worker(self.client):
                no_gpu_since = None
            elif no_gpu_since is None:
                no_gpu_since = time.monotonic()
            elif time.monotonic() - no_gpu_since > self.gpu_wait_s:
                fut.cancel()
                raise ClusterError(
                    f"no worker with the {GPU_RESOURCE} resource has been in the cluster for "
                    f"{self.gpu_wait_s:g} s; a GPU task cannot run. Start one with "
                    f"`dask worker {self.client.scheduler.address} --resources {GPU_RESOURCE}=1`"
                )

    def run_stage(self, stage, device: Device, args: dict[str, Any], **_) -> tuple[Any, dict]:
        """Submit ``stage`` to a suitable worker; its output stays there (a Future)."""
        gpu = device.is_accelerator
        key = f"placer-{self.run_id}-{stage.name}"
        fut = self._submit(_remote_stage, self.payloads[stage.name], device.name, args, key=key,
                           resources={GPU_RESOURCE: 1} if gpu else None, retries=self.retries)
        return fut, self._wait_meta(fut, key, gpu)

    def transfer(self, value: Any, target: Device, **_) -> tuple[Any, int, bool, dict]:
        """Copy a stage's output into ``target`` on a worker that has it."""
        gpu = target.is_accelerator
        key = f"placer-{self.run_id}-move-{value.key}-{target.name}"
        fut = self._submit(_remote_move, value, target.name, key=key,
                           resources={GPU_RESOURCE: 0} if gpu else None)
        info = self._wait_meta(fut, key, gpu)
        return fut, int(info.pop("bytes")), bool(info.pop("pinned")), info

    def collect(self, outputs: dict[str, Any], final: dict[str, Any], *,
                everything: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """Gather the final outputs (and nothing else) to the client; with ``everything`` (a failed
        run), every finished stage's output, so that none is lost."""
        held = outputs if everything else final
        names = [n for n in held if held[n] is not None]
        if not names:
            return {}, {}
        try:
            values = self.client.gather([held[n] for n in names])
        except Exception:
            if scheduler_lost(self.client) or everything:
                return {}, {}  # the run's own failure (or the lost scheduler) is what gets reported
            raise
        got = {n: v[0] for n, v in zip(names, values)}
        return dict(got), {n: got[n] for n in final if n in got}

    def abandon(self, stage: str, ident: int) -> None:
        """Stage ``stage`` is being stopped: its lane thread too, and its task on the cluster is cancelled."""
        super().abandon(stage, ident)
        prefix = f"placer-{self.run_id}-{stage}"
        with self._lock:
            futs = [f for f in self._futures if f.key == prefix or str(f.key).startswith(prefix + "-")]
        if futs:
            with contextlib.suppress(Exception):
                self.client.cancel(futs, force=True)

    def close(self) -> None:
        super().close()
        with self._lock:
            futs, self._futures = self._futures, []
        if futs:
            with contextlib.suppress(Exception):
                self.client.cancel(futs)


def done_event(fut: Any) -> threading.Event:
    """An event set when ``fut`` finishes (however it finishes).

    Waiting on it, rather than ``fut.result(timeout=...)``, avoids distributed's
    ``sync`` losing a result whose short timeout raced with its arrival.
    """
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    return done


def _has_gpu_worker(client: Any) -> bool:
    info = client.scheduler_info(n_workers=-1)
    return any((w.get("resources") or {}).get(GPU_RESOURCE, 0) >= 1 for w in info.get("workers", {}).values())


# -- running ------------------------------------------------------------------------------
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
    from placer.executor import Prepared
    from placer.pipeline import as_pipeline

    p = as_pipeline(pipeline)
    p.validate()
    with connect(scheduler) as client:
        inv = cluster_devices(client)
        devices = resolve_on_cluster(p, placement, inv)
        w = int(workers or inv.get("cpu").workers)
        acc = sorted({d.name for d in devices.values() if d.is_accelerator})
        lanes = DaskLanes(client, w, acc, stage_payloads(p, ship_code(client, p)), retries=retries)
        placed = {n: d.name for n, d in devices.items()}
        with Prepared(p, placed, inventory=inv, workers=w, size=size, lanes=lanes,
                      stage_timeout=stage_timeout) as prepared:
            return prepared.run()


def is_client(obj: Any) -> bool:
    """Whether ``obj`` is a :class:`distributed.Client` (without importing distributed needlessly)."""
    mod = sys.modules.get("distributed")
    return mod is not None and isinstance(obj, mod.Client)


__all__ = [
    "ClusterError",
    "ClusterProfileError",
    "DaskLanes",
    "SchedulerAddressError",
    "SchedulerLostError",
    "SchedulerUnreachableError",
    "ShippingError",
    "WorkerInfo",
    "check_address",
    "cluster_devices",
    "cluster_workers",
    "connect",
    "done_event",
    "cost_devices",
    "resolve_on_cluster",
    "run_on_cluster",
    "ship_code",
    "stage_payloads",
    "worker_device",
]
