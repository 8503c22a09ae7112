"""What runs on a dask worker: a stage, a copy into the worker's device, and stopping a cancelled task.

May import: placer.devices, placer.errors, placer.executor.{stagecall,transfer},
placer.executor.distributed.inventory; cloudpickle and distributed inside functions
(they run on the worker).

The lanes (:mod:`placer.executor.distributed.lanes`) submit :func:`stage_task` and
:func:`move_task`; each returns its value with what the run's record needs, read by
:func:`task_meta` without moving the value.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from placer.devices import Device, discover, is_real_gpu
from placer.errors import DeviceUnavailableError
from placer.executor.distributed.inventory import GPU_RESOURCE
from placer.executor.stagecall import call_stage, stop_thread
from placer.executor.transfer import nbytes, to_location

#: seconds between a worker's checks whether the stage task it runs was cancelled
CANCEL_POLL_S = 0.2


def worker_device(name: str) -> Device:
    """The device of this worker that a placement's device name means.

    A GPU name means the worker's own first GPU (each GPU worker has one); any other
    name (``cpu``, ``gpu-sim``, another kind's) the worker's device of that name.
    """
    from distributed import get_worker

    inv = discover()  # the worker's own devices
    if not is_real_gpu(name):
        return inv.resolve(name)
    if not inv.gpus:
        raise DeviceUnavailableError(
            f"worker {get_worker().address} declares the {GPU_RESOURCE} resource but has no CUDA GPU "
            f"({inv.unavailable.get('torch.cuda', 'torch found none')}); fix the worker or place the "
            "stage on cpu"
        )
    return inv.gpus[0]


def stage_task(payload: bytes, device: str, inputs: dict[str, tuple[Any, dict]]) -> tuple[Any, dict]:
    """Run one stage on this worker; return its output and what the record needs."""
    import cloudpickle
    from distributed import get_worker

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


def move_task(value: tuple[Any, dict], device: str) -> tuple[Any, dict]:
    """Copy a stage's output into this worker's ``device``."""
    from distributed import get_worker

    t0 = time.time()
    moved, nb, pinned = to_location(value[0], worker_device(device))
    t1 = time.time()
    return moved, {"worker": get_worker().address, "wall_start": t0, "wall_end": t1,
                   "bytes": nb, "pinned": pinned}


def task_meta(value: tuple[Any, dict]) -> dict:
    return value[1]
