"""The engine's lanes on a dask cluster: each stage and copy is a task, the values stay on the workers.

May import: placer.devices, placer.executor.engine, placer.executor.distributed.{connection,inventory,tasks}.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

from placer.devices import Device
from placer.executor.distributed.connection import ClusterError, scheduler_lost
from placer.executor.distributed.inventory import GPU_RESOURCE
from placer.executor.distributed.tasks import move_task, stage_task, task_meta
from placer.executor.engine import ThreadLanes


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
        meta = self.client.submit(task_meta, fut, key=f"{key}-meta", pure=False)
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
        fut = self._submit(stage_task, self.payloads[stage.name], device.name, args, key=key,
                           resources={GPU_RESOURCE: 1} if gpu else None, retries=self.retries)
        return fut, self._wait_meta(fut, key, gpu)

    def transfer(self, value: Any, target: Device, **_) -> tuple[Any, int, bool, dict]:
        """Copy a stage's output into ``target`` on a worker that has it."""
        gpu = target.is_accelerator
        key = f"placer-{self.run_id}-move-{value.key}-{target.name}"
        fut = self._submit(move_task, value, target.name, key=key,
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
