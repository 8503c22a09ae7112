"""Running on a real dask.distributed cluster of worker processes on 127.0.0.1.

What every kind of lanes does (routing, copies, digests, failures) is tested on an
in-process cluster in test_executor.py, with the diamond pipeline imported from
there. Here: what needs worker processes or a scheduler address (the cluster's
devices, the link between workers, the CLI, faults and unreachable schedulers).

The clusters are a scheduler and worker processes (nannies) started here, one
thread each; one worker declares ``GPU=1`` and, since the worker processes inherit
this process's ``PLACER_TEST_DEVICES=1`` and ``NUMBA_ENABLE_CUDASIM=1`` (set by
conftest), runs ``gpu-sim`` stages.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from placer.errors import StageFailedError
from placer.executor import execute
from test_executor import GPU_STAGES, diamond
from warm_cli import run as run_placer

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[2]


# -- clusters ----------------------------------------------------------------------------------
def start_cluster(cpu_workers: int = 1, gpu_workers: int = 1):
    """A scheduler and worker processes on 127.0.0.1 (``gpu*`` workers declare GPU=1)."""
    from distributed import Nanny, Scheduler, SpecCluster

    opts = {"nthreads": 1, "memory_limit": "2GiB", "host": "127.0.0.1"}
    workers = {f"cpu{i}": {"cls": Nanny, "options": dict(opts)} for i in range(cpu_workers)}
    workers |= {f"gpu{i}": {"cls": Nanny, "options": {**opts, "resources": {"GPU": 1}}}
                for i in range(gpu_workers)}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False,
                                               "dashboard_address": "127.0.0.1:0"}}
    return SpecCluster(workers=workers, scheduler=scheduler, asynchronous=False)


def addresses(client) -> dict[str, str]:
    """Worker name -> address."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {str(w["name"]): a for a, w in info.items()}


@pytest.fixture(scope="module")
def cluster():
    with start_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def local():
    return execute(diamond(), "all=cpu")


# -- the cluster --------------------------------------------------------------------------------
@pytest.mark.slow
def test_cluster_lists_gpu_sim_as_a_simulated_device_never_a_gpu(client):
    from placer.executor.distributed import cluster_devices, cost_devices

    inv = cluster_devices(client)
    assert inv.get("cpu").workers == 2
    sim = inv.get("gpu-sim")
    assert sim is not None and sim.kind == "sim" and not sim.is_gpu
    assert inv.gpus == [] and "GPU" in inv.unavailable["torch.cuda"]
    assert "gpu" not in {d["kind"] for d in cost_devices(inv).values()}


@pytest.mark.slow
def test_worker_to_worker_link_is_measured(client):
    from placer.cluster import measure_worker_link

    sizes = [1 << 12, 1 << 20, 1 << 22]
    link = measure_worker_link(client, sizes=sizes, repeats=3)
    assert link.src != link.dst and {link.src, link.dst} <= set(addresses(client).values())
    assert [len(r) for r in link.raw_seconds] == [3, 3, 3]
    assert all(t > 0 for r in link.raw_seconds for t in r)
    big = min(link.raw_seconds[-1])  # the line goes through each size's fastest copy (noise only adds time)
    assert 0.2 < link.seconds(sizes[-1]) / big < 5.0, link


@pytest.mark.slow
def test_a_client_passed_in_stays_open_after_a_failed_run(client):
    p = diamond()

    def broken(load, device):
        raise ValueError("bad rows")

    p.add(name="check", fn=broken, inputs=["load"])
    with pytest.raises(StageFailedError, match="'check'.*bad rows") as err:
        execute(p, "all=cpu", scheduler=client)
    assert err.value.stage == "check"
    assert client.submit(sum, [1, 2], pure=False).result() == 3


@pytest.mark.slow
def test_placer_run_cli_on_the_cluster(cluster, client, sim_env):
    from placer.loader import load_pipeline

    expected = execute(load_pipeline(str(ROOT / "pipelines" / "tabular.py"), 2000), "all=cpu")
    out = run_placer(["run", "pipelines/tabular.py", "--size", "2000",
         "--scheduler", cluster.scheduler_address, "--placement", "all=cpu", "--json"], via="-c",
        cwd=ROOT, env=sim_env, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["outputs_digest"] == expected.outputs_digest
    assert doc["executor"] == "distributed"
    workers = set(addresses(client).values())
    assert [s["name"] for s in doc["stages"]] == ["load", "clean", "features", "train", "predict"]
    assert all(s["worker"] in workers for s in doc["stages"])


# -- faults --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_scheduler_is_a_clear_error_within_the_timeout(monkeypatch):
    from placer.executor import distributed as dist
    from placer.executor.distributed import connection

    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_S", 1.0)
    address = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(dist.SchedulerUnreachableError, match=f"{address}.*dask scheduler"):
        execute(diamond(), "all=cpu", scheduler=address)
    assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_gpu_stage_without_a_gpu_worker_fails_before_anything_runs(tmp_path):
    from distributed import Client

    from placer.executor.distributed import ClusterError

    marker = tmp_path / "ran"
    with start_cluster(cpu_workers=1, gpu_workers=0) as cl, Client(cl, set_as_default=False) as c:
        with pytest.raises(ClusterError, match="stage 'left'.*gpu-sim.*--resources GPU=1") as err:
            execute(diamond(marker=str(marker)), "all=cpu,left=gpu-sim", scheduler=c)
    assert err.value.stage == "left"
    assert not marker.exists()


@pytest.mark.parametrize("gpu_workers, gpus, placement, says", [
    (0, 0, "all=cpu,left=gpu-sim", "no worker of the dask cluster at tcp://h:1 declares a GPU resource"),
    (1, 0, "all=cpu,left=gpu-sim", "has the simulated test device enabled"),
    (1, 0, "all=cpu,left=gpu", "torch 9 was built without CUDA"),
    (2, 2, "all=cpu,left=gpu:2", "the cluster's GPUs are gpu:0, gpu:1"),
])
@pytest.mark.slow
def test_placements_the_cluster_cannot_run_name_the_stage_and_the_reason(gpu_workers, gpus, placement, says):
    from placer.devices import Device, Inventory
    from placer.executor.distributed import ClusterError, resolve_on_cluster

    devices = [Device(name="cpu", kind="cpu", label="CPU", workers=2)]
    devices += [Device(name=f"gpu:{i}", kind="gpu", index=i, label="G") for i in range(gpus)]
    inv = Inventory(devices=devices, host={"scheduler": "tcp://h:1", "gpu_workers": gpu_workers},
                    unavailable={} if gpus else {"torch.cuda": "torch 9 was built without CUDA"})
    with pytest.raises(ClusterError, match="stage 'left' is placed on gpu") as err:
        resolve_on_cluster(diamond(), placement, inv)
    assert says in str(err.value) and err.value.stage == "left"


@pytest.mark.slow
def test_killed_worker_stage_reruns_elsewhere_with_the_same_outputs(tmp_path, local):
    """``right`` sleeps on a CPU worker; that worker's process is killed mid-stage."""
    from distributed import Client

    marker = tmp_path / "pids"
    with start_cluster(cpu_workers=2, gpu_workers=1) as cl, Client(cl, set_as_default=False) as c:
        c.wait_for_workers(3, timeout=60)
        pid_of = c.run(os.getpid)
        killed: list[str] = []

        def kill_first_runner():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if marker.exists() and marker.read_text().strip():
                    pid = int(marker.read_text().split()[0])
                    killed.extend(a for a, p in pid_of.items() if p == pid)
                    os.kill(pid, signal.SIGKILL)
                    return
                time.sleep(0.05)

        killer = threading.Thread(target=kill_first_runner)
        killer.start()
        run = execute(diamond(marker=str(marker), sleep_s=2.0), GPU_STAGES, scheduler=c)
        killer.join()
    assert len(killed) == 1, "the stage never started on a worker"
    assert len(marker.read_text().split()) == 2  # it ran twice: killed, then rerun
    assert run.stage("right").worker != killed[0]
    assert run.outputs_digest == local.outputs_digest
