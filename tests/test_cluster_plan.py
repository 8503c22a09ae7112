"""Planning for a dask.distributed cluster, and the network the cost table charges.

The cluster tests run a scheduler and two worker processes on 127.0.0.1, one
thread each: ``cpu0``, and ``gpu0``, which declares ``GPU=1`` and, since the
worker processes inherit this process's ``PLACER_TEST_DEVICES=1`` and
``NUMBA_ENABLE_CUDASIM=1`` (set by conftest), has the simulated test device
``gpu-sim``. The pipeline below is a chain::

    make ──▶ square ──▶ total

The network charge itself is tested on hand-built tables, where the amount it
adds is known exactly.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
from pathlib import Path

import pytest

from placer import Pipeline
from placer.optimize import CostTable, plan, simulate
from placer.optimize.exact import branch_and_bound, chain_dp, exhaustive
from placer.optimize.problem import Problem
from tests.synthetic import random_table
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[1]
NET = {"latency_s": 0.002, "bandwidth_Bps": 5e8}


# -- the pipeline (shipped to the workers by value: this module is not installed) ------------
def _make(device, n: int):
    import torch

    return torch.arange(n * 16, dtype=torch.float32).reshape(n, 16).to(device)


def _square(make, device):
    return make * make


def _total(square, device):
    return square.sum(1)


def build(size: int | None = None) -> Pipeline:
    n = size or 4000
    p = Pipeline("chain", size=n)
    p.add(name="make", fn=_make, params={"n": n})
    p.add(name="square", fn=_square, inputs=["make"])
    p.add(name="total", fn=_total, inputs=["square"])
    return p


# -- the network in the cost table (no cluster) ---------------------------------------------------
def chain_table(network: dict | None = None, devices: tuple[str, ...] = ("gpu",)) -> CostTable:
    """cpu-only ``a`` -> ``b`` -> ``c`` (``b`` and ``c`` also on the accelerators); 1 GB outputs."""
    doc = {
        "devices": {"cpu": {"kind": "cpu"}, **{d: {"kind": "gpu"} for d in devices}},
        "link": {"h2d": {"latency_s": 1e-4, "bandwidth_Bps": 1e10},
                 "d2h": {"latency_s": 2e-4, "bandwidth_Bps": 8e9}},
        "stages": [{"name": "a", "output_bytes": 1e9, "seconds": {"cpu": 1.0}},
                   {"name": "b", "inputs": ["a"], "output_bytes": 5e8, "seconds": {"cpu": 4.0, "gpu": 0.5}},
                   {"name": "c", "inputs": ["b"], "output_bytes": 2e8, "seconds": {"cpu": 3.0, "gpu": 0.25}}],
    }
    if network is not None:
        doc["network"] = network
    return CostTable.model_validate(doc)


def net_s(nbytes: float) -> float:
    return NET["latency_s"] + nbytes / NET["bandwidth_Bps"]


@pytest.mark.parametrize("placement, crossings", [
    # a -> b crosses to the GPU, b -> c back to the host: the output of a and of b cross
    ({"a": "cpu", "b": "gpu", "c": "cpu"}, ["a", "b"]),
    # the sink ends on the GPU: its copy home crosses too
    ({"a": "cpu", "b": "gpu", "c": "gpu"}, ["a", "c"]),
    ({"a": "cpu", "b": "cpu", "c": "cpu"}, []),
])
def test_the_network_adds_exactly_its_time_at_every_device_change_of_a_chain(placement, crossings):
    without = simulate(chain_table(), placement)
    with_net = simulate(chain_table(NET), placement)
    out = {st.name: st.output_bytes for st in chain_table().stages}
    added = sum(net_s(out[s]) for s in crossings)
    assert math.isclose(with_net.makespan_s - without.makespan_s, added, rel_tol=1e-9, abs_tol=1e-12)
    # each copy's event carries its network time; no other copy appears
    before = {(t.data, t.dst): t.seconds for t in without.transfers}
    after = {(t.data, t.dst): t.seconds for t in with_net.transfers}
    assert before.keys() == after.keys() and len(after) == len(crossings)
    for (data, dst), s in after.items():
        assert math.isclose(s - before[(data, dst)], net_s(out[data]), rel_tol=1e-9)


def test_a_copy_between_two_gpus_crosses_the_network_once():
    placement = {"a": "cpu", "b": "gpu:0", "c": "gpu:1"}
    t0, t1 = chain_table(devices=("gpu:0", "gpu:1")), chain_table(NET, devices=("gpu:0", "gpu:1"))
    b_to_c = {(t.data, t.dst): t.seconds for t in simulate(t1, placement).transfers}[("b", "gpu:1")]
    link = t0.link
    assert math.isclose(b_to_c, link.d2h.seconds(5e8) + link.h2d.seconds(5e8) + net_s(5e8), rel_tol=1e-12)
    added = simulate(t1, placement).makespan_s - simulate(t0, placement).makespan_s
    assert math.isclose(added, net_s(1e9) + net_s(5e8) + net_s(2e8), rel_tol=1e-9)


def test_a_slow_network_keeps_work_on_the_cpu_that_a_fast_bus_sends_to_the_gpu():
    assert plan(chain_table()).placement == {"a": "cpu", "b": "gpu", "c": "gpu"}
    slow = {"latency_s": 0.01, "bandwidth_Bps": 1e8}  # 10 s for a's output alone
    p = plan(chain_table(slow))
    assert p.placement == {"a": "cpu", "b": "cpu", "c": "cpu"}
    assert math.isclose(p.predicted_makespan_s, 8.0)


@pytest.mark.parametrize("seed", range(12))
def test_searches_agree_with_the_simulator_when_the_network_is_charged(seed):
    rng = random.Random(seed)
    table = random_table(rng, rng.randint(3, 6), accelerators=2)
    net = {"latency_s": rng.uniform(1e-5, 1e-2), "bandwidth_Bps": rng.uniform(1e8, 1e10)}
    table = CostTable.model_validate({**table.model_dump(exclude_defaults=True), "network": net})
    pb = Problem(table)
    for objective in ("makespan", "throughput"):
        best, _ = exhaustive(pb, objective)
        found, place = branch_and_bound(pb, objective)
        assert math.isclose(found, best, rel_tol=1e-9), objective
    chain = random_table(rng, 5, accelerators=2, chain=True)
    chain = CostTable.model_validate({**chain.model_dump(exclude_defaults=True), "network": net})
    cp = Problem(chain)
    value, place = chain_dp(cp)
    assert math.isclose(value, exhaustive(cp)[0], rel_tol=1e-9)
    assert math.isclose(simulate(chain, cp.placement(place)).makespan_s, value, rel_tol=1e-9)


def test_network_field_is_validated_and_round_trips(tmp_path):
    from placer.optimize import CostTableError

    with pytest.raises(CostTableError, match="network.bandwidth_Bps"):
        CostTable.from_json(json.dumps({**json.loads(chain_table().model_dump_json()),
                                        "network": {"latency_s": 0.0, "bandwidth_Bps": 0}}))
    chain_table(NET).save(tmp_path / "t.json")
    assert CostTable.load(tmp_path / "t.json").network.model_dump() == NET


# -- several GPUs on a cluster (described workers, no cluster needed) -----------------------------
class _FakeClient:
    class scheduler:  # noqa: N801 - mimics Client.scheduler.address
        address = "tcp://10.0.0.5:8786"


def _point(size: int, seconds: float, out: float):
    from placer.profile import Point

    return Point(size=size, median_s=seconds, iqr_s=0.0, reps=3, raw_times=[seconds] * 3,
                 output_bytes=out)


def _fake_profile(local: str, kind: str, scale: float):
    """Two parallel heavy branches off one load; ``scale`` slows every stage."""
    from placer.costmodel.bus import Link, TransferModel
    from placer.profile import DeviceProfile, Profile, StageProfile

    shape = {"load": ([], 0.01), "left": (["load"], 1.0), "right": (["load"], 1.0),
             "join": (["left", "right"], 0.01)}
    stages = {}
    for name, (inputs, base) in shape.items():
        pts = [_point(s, base * scale * s / 100, 1e5 * s) for s in (100, 200, 400)]
        stages[name] = StageProfile(name=name, inputs=inputs, key=name,
                                    devices={local: DeviceProfile(device=local, kind=kind, points=pts)})
    link = Link(latency_s=1e-5, bandwidth_Bps=1e10, points=[(1e3, 1e-5), (1e8, 1e-2)])
    transfer = {} if kind == "cpu" else {
        local: TransferModel(device=local, links={"h2d": {"fresh": link, "staged": link},
                                                  "d2h": {"fresh": link}})}
    return Profile(pipeline="two", fingerprint=local, sizes=[100, 200, 400], measured_sizes=[100, 200, 400],
                   target_size=400, stages=stages, transfer=transfer)


def test_two_gpu_workers_are_two_devices_profiled_once_and_both_used():
    from placer.costmodel.model import CostModel
    from placer.cluster import ClusterCosts, WorkerLink, _merge_profiles, _profile_jobs, plan_from_costs
    from placer.executor.distributed import WorkerInfo, cluster_devices

    h200 = [("NVIDIA H200", 141 << 30)]
    # what each GPU worker's discovery reports: its own gpu:0
    found = [{"name": "gpu:0", "kind": "gpu", "index": 0, "label": "NVIDIA H200", "memory_bytes": 141 << 30,
              "backends": ["torch"]}]
    workers = [
        WorkerInfo(address="tcp://10.0.0.6:1", name="cpu0", nthreads=8),
        WorkerInfo(address="tcp://10.0.0.7:1", name="g0", nthreads=1, resources={"GPU": 1}, gpus=h200,
                   accelerators=found),
        WorkerInfo(address="tcp://10.0.0.8:1", name="g1", nthreads=1, resources={"GPU": 1}, gpus=h200,
                   accelerators=found),
    ]
    inv = cluster_devices(_FakeClient(), workers)
    assert [d.name for d in inv.devices if d.kind == "gpu"] == ["gpu:0", "gpu:1"]
    assert inv.get("cpu").workers == 10
    jobs = _profile_jobs(workers, inv)
    # one profile per kind of GPU (on its first worker), standing for both gpu:N
    assert {k: (w.name, local, names) for k, (w, local, names) in jobs.items()} == {
        "cpu": ("cpu0", "cpu", ["cpu"]), "gpu0": ("g0", "gpu:0", ["gpu:0", "gpu:1"])}
    prof = _merge_profiles({"cpu": _fake_profile("cpu", "cpu", 10.0),
                            "gpu0": _fake_profile("gpu:0", "gpu", 1.0)}, jobs, inv)
    link = WorkerLink(src="a", dst="b", sizes=[1, 2], raw_seconds=[[1e-3], [2e-3]],
                      latency_s=1e-3, bandwidth_Bps=1e9)
    costs = ClusterCosts(inv, prof, CostModel(prof), link, 400, [])
    table = costs.table()
    assert table.devices["cpu"].workers == 10
    assert {n: d.kind for n, d in table.devices.items()} == {"cpu": "cpu", "gpu:0": "gpu", "gpu:1": "gpu"}
    assert table.network.model_dump() == {"latency_s": 1e-3, "bandwidth_Bps": 1e9}
    assert table.seconds("left", "gpu:1") == table.seconds("left", "gpu:0") < table.seconds("left", "cpu")
    p = plan_from_costs(costs)
    # the two heavy branches run at once, one on each GPU
    assert {p.placement["left"], p.placement["right"]} == {"gpu:0", "gpu:1"}


# -- a real cluster -------------------------------------------------------------------------------
needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="dask.distributed is not installed")


def start_cluster(gpu_workers: int, cpu_workers: int):
    from distributed import Nanny, Scheduler, SpecCluster

    opts = {"nthreads": 1, "memory_limit": "2GiB", "host": "127.0.0.1"}
    workers = {f"cpu{i}": {"cls": Nanny, "options": dict(opts)} for i in range(cpu_workers)}
    workers |= {f"gpu{i}": {"cls": Nanny, "options": {**opts, "resources": {"GPU": 1}}}
                for i in range(gpu_workers)}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False,
                                               "dashboard_address": "127.0.0.1:0"}}
    return SpecCluster(workers=workers, scheduler=scheduler, asynchronous=False)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """The workers' profile cache (they inherit the environment when they start)."""
    old = os.environ.get("PLACER_CACHE_DIR")
    os.environ["PLACER_CACHE_DIR"] = str(tmp_path_factory.mktemp("worker-cache"))
    yield os.environ["PLACER_CACHE_DIR"]
    if old is None:
        os.environ.pop("PLACER_CACHE_DIR", None)
    else:
        os.environ["PLACER_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def cluster(cache_dir):
    with start_cluster(gpu_workers=1, cpu_workers=1) as c:
        yield c


def names(client) -> dict[str, str]:
    return {str(w["name"]): a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}


@pytest.fixture(scope="module")
def costs(client):
    from placer.cluster import cluster_costs

    return cluster_costs(build, client, size=4000, budget_s=3.0, link_sizes=(1 << 12, 1 << 18, 1 << 21),
                         cache=False)


@needs_dask
@pytest.mark.slow
def test_devices_and_measurements_come_from_the_cluster(client, costs):
    w = names(client)
    table = costs.table()
    assert costs.devices == ["cpu", "gpu-sim"]
    assert table.devices["cpu"].workers == 2  # both workers' threads
    assert table.devices["gpu-sim"].kind == "sim" and "not a GPU" in table.devices["gpu-sim"].label
    assert costs.profile.machine["profiled_on"] == {"cpu": w["cpu0"], "sim": w["gpu0"]}
    for st in table.stages:
        assert set(st.seconds) == {"cpu", "gpu-sim"} and all(s > 0 for s in st.seconds.values()), st.name
    assert table.link is not None  # the host<->device copies, measured on the GPU worker
    assert costs.size == 4000 and max(costs.profile.measured_sizes) <= 4000  # profiled up to N, never beyond


@needs_dask
@pytest.mark.slow
def test_the_network_is_measured_between_a_cpu_and_a_gpu_worker_and_charged(client, costs):
    w = names(client)
    link = costs.link
    assert (link.src, link.dst) == (w["cpu0"], w["gpu0"])
    assert all(t > 0 for r in link.raw_seconds for t in r) and link.bandwidth_Bps > 0
    table = costs.table()
    assert table.network.model_dump() == link.table_link()
    assert any(f"network {w['cpu0']} -> {w['gpu0']}" in n for n in costs.notes)
    # the same placement costs more with the network, by its time for each crossing
    placement = {"make": "cpu", "square": "gpu-sim", "total": "cpu"}
    bare = CostTable.model_validate(table.model_dump(exclude={"network"}))
    out = {st.name: st.output_bytes for st in table.stages}
    added = link.latency_s * 2 + (out["make"] + out["square"]) / link.bandwidth_Bps
    diff = simulate(table, placement).makespan_s - simulate(bare, placement).makespan_s
    assert math.isclose(diff, added, rel_tol=1e-9)


@needs_dask
@pytest.mark.slow
def test_plan_cli_for_the_cluster_prints_json_and_saves_the_costs(cluster, client, sim_env, tmp_path):
    saved = tmp_path / "costs.json"
    out = run_placer(["plan", "pipelines/tabular.py",
         "--size", "2000", "--scheduler", cluster.scheduler_address, "--budget-s", "3", "--json",
         "--save-costs", str(saved)], via="-c",
        cwd=ROOT, env=sim_env, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc["placement"]) == {"load", "clean", "features", "train", "predict"}
    assert set(doc["placement"].values()) <= {"cpu", "gpu-sim"}
    assert doc["devices"] == {"cpu": "cpu", "gpu-sim": "sim"}
    assert doc["size"] == 2000
    table = CostTable.load(saved)
    assert table.network is not None and table.network.bandwidth_Bps > 0
    assert table.devices["cpu"].workers == 2
    # the plan printed is the plan of the table saved
    assert plan(table).placement == doc["placement"]


@needs_dask
def test_run_without_a_placement_plans_for_the_cluster(cluster, client, monkeypatch):
    import placer.advisor
    from placer.executor import execute
    from placer.loader import load_pipeline
    from placer.site import open_site

    monkeypatch.setattr(placer.advisor, "RUN_BUDGET_S", 2.0)
    p = load_pipeline(str(ROOT / "pipelines" / "tabular.py"), 2000)
    with open_site(cluster.scheduler_address) as site:
        placement, why = placer.advisor.best_placement(p, 2000, site, reference="pipelines/tabular.py")
    assert isinstance(placement, dict), why
    assert why.startswith("planned for the cluster") and "2 s profile" in why
    run = execute(p, placement, scheduler=client)
    assert run.outputs_digest == execute(p, "all=cpu").outputs_digest


@needs_dask
@pytest.mark.slow
def test_advise_on_the_cluster_runs_plan_and_baselines_there(cluster, client, tmp_path):
    from placer.advisor import advise
    from placer.executor import execute
    from placer.report import write_report

    advised = advise(build, size=2000, budget_s=2.0, scheduler=client)
    workers = set(names(client).values())
    for run in (advised.run, *advised.baselines.values()):
        assert run.executor == "distributed"
        assert {s.worker for s in run.stages} <= workers and all(s.worker for s in run.stages)
    assert set(advised.baselines) >= {"all_cpu", "all_gpu"}
    assert "gpu-sim" in advised.costs.devices and advised.costs.network is not None
    local = execute(build(2000), "all=cpu").outputs_digest
    assert advised.run.outputs_digest == local
    assert all(r.outputs_digest == local for r in advised.baselines.values())
    out = write_report(advised.facts, tmp_path / "cluster.md", "md")
    text = out.read_text()
    assert "gpu-sim" in text and "simulated" in text


@needs_dask
@pytest.mark.slow
def test_a_cluster_without_a_gpu_worker_plans_everything_on_the_cpu_and_says_why(cache_dir):
    from distributed import Client

    from placer.cluster import plan_for_cluster

    with start_cluster(gpu_workers=0, cpu_workers=1) as c, Client(c, set_as_default=False) as cl:
        cl.wait_for_workers(1, timeout=60)
        p = plan_for_cluster(build, cl, size=400, budget_s=1.0, cache=False)
    assert set(p.placement.values()) == {"cpu"} and p.devices == {"cpu": "cpu"}
    assert all("declares a GPU resource" in s.reason for s in p.stages)
    assert any("--resources GPU=1" in w for w in p.warnings)


PARAM_FILE = '''
from placer import Pipeline


def build(size=None, *, extra: int = 0):
    p = Pipeline("params", size=size or 100)
    p.add(name="base", fn=lambda device: 1.0)
    for i in range(extra):
        p.add(name=f"extra{i}", fn=lambda device: 2.0)
    return p
'''


@pytest.mark.slow
def test_build_parameters_reach_the_workers_builds(client, tmp_path):
    """``placer plan --scheduler ... -p extra=2``: the workers build the pipeline with the parameter too."""
    from placer.cluster import cluster_costs
    from placer.loader import build_params

    f = tmp_path / "params_pipe.py"
    f.write_text(PARAM_FILE)
    with build_params(extra=2):
        costs = cluster_costs(str(f), client, size=100, budget_s=2.0, link_sizes=(1 << 12, 1 << 16), cache=False)
    assert set(costs.profile.stages) == {"base", "extra0", "extra1"}
