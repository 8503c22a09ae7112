"""Remote CPU workers in the stream model: the arithmetic, grouped tasks, described and running clusters.

The model's cases (per-task overhead, network, compute) run on synthetic profiles; one
127.0.0.1 ``LocalCluster`` of two worker processes (one thread each) serves the tests that
need a running cluster (it costs seconds to start, once for the module).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from placer.data.stream import ClusterLink, ScalingRow, StreamStageProfile as StageProfile, StreamProfile, StreamSettings
from placer.errors import PlacerError
from placer.stream import remote
from placer.stream.offload import (ClusterDescription, describe_link, load_cluster, parse_cluster, plan_offload,
                                   probe_cluster)
from placer.stream.model import predict

ROOT = Path(__file__).resolve().parents[2]
MS = 1e-3


def profile(decode_s: float = 10 * MS, nbytes: int = 1000, cores: int = 2, step_s: float = 1 * MS,
            batches: int = 64) -> StreamProfile:
    """A CPU stream batches → decode → train; decode's input and output each ``nbytes`` per batch."""
    src = {"cpu": 0.01 * MS}
    stages = [
        StageProfile(name="batches", role="source", devices=["cpu"], seconds=src, cpu_seconds=src,
                     out_bytes={"host": nbytes}),
        StageProfile(name="decode", role="batch", devices=["cpu"], seconds={"cpu": decode_s},
                     cpu_seconds={"cpu": decode_s}, reads=["batches"], out_bytes={"host": nbytes},
                     scaling=[ScalingRow(workers=1, batches_per_s=1 / decode_s, speedup=1),
                              ScalingRow(workers=2, batches_per_s=1.9 / decode_s, speedup=1.9)]),
        StageProfile(name="train", role="step", kind="training", devices=["cpu"], seconds={"cpu": step_s},
                     cpu_seconds={"cpu": step_s}, reads=["decode"]),
    ]
    return StreamProfile(pipeline="cpu", source="batches", step="train", members=["batches", "decode", "train"],
                         samples_per_batch=32, batches_per_epoch=batches, cores=cores, devices=["cpu"],
                         device_titles={"cpu": "CPU"}, stages=stages, consumer_samples_per_s={"cpu": 32 / step_s})


def dask(workers: int, group: int = 1) -> StreamSettings:
    return StreamSettings(stage_workers={"decode": workers}, worker_kind={"decode": "dask"},
                          stage_group={"decode": group}, prefetch=4)


# -- the arithmetic --------------------------------------------------------------------------------
def test_tiny_batches_are_bound_by_the_per_task_overhead_and_grouping_lifts_it():
    prof = profile(decode_s=0.1 * MS, nbytes=1000, batches=1000)
    link = ClusterLink(workers=8, threads_per_worker=1, task_s=5 * MS, bandwidth_bytes_per_s=1e9)
    t = remote.terms(prof, "decode", link, 1)
    assert t.bytes == 2000 and t.move_s == pytest.approx(2e-6)
    one = remote.rate(prof, "decode", link, 2, 1)
    assert one == pytest.approx(2 / (5 * MS + 0.1 * MS + 2e-6))  # k g / (o + g (c + m))
    assert remote.bound(prof, "decode", link, 2, 1) == "per-task overhead"
    g = remote.choose_group(prof, "decode", link)
    assert g > 1 and g <= 1000 // (remote.TASKS_PER_THREAD * link.threads)
    assert remote.rate(prof, "decode", link, 2, g) > 1.9 * one


def test_big_batches_are_bound_by_the_network():
    prof = profile(decode_s=0.1 * MS, nbytes=5_000_000)
    link = ClusterLink(workers=16, threads_per_worker=4, task_s=0.1 * MS, bandwidth_bytes_per_s=100e6)
    lim = remote.limits(prof, "decode", link, 16, 4)
    assert lim["network"] == pytest.approx(100e6 / 10_000_000)
    assert remote.rate(prof, "decode", link, 16, 4) == pytest.approx(10.0)
    assert remote.bound(prof, "decode", link, 16, 4) == "network"


def test_an_expensive_stage_is_bound_by_the_clusters_cores():
    prof = profile(decode_s=10 * MS, nbytes=100)
    link = ClusterLink(workers=2, threads_per_worker=1, task_s=0.1 * MS, bandwidth_bytes_per_s=1e9, cpu_scale=0.5)
    # 8 tasks in flight queue at 2 one-thread workers, each batch 5 ms on their (twice as fast) cores
    assert remote.rate(prof, "decode", link, 8, 1) == pytest.approx(2 / (5 * MS))
    assert remote.bound(prof, "decode", link, 8, 1) == "compute"
    # threads of one worker scale as the stage's threads scale here (1.9x at 2)
    two = link.model_copy(update={"workers": 1, "threads_per_worker": 2})
    assert remote.limits(prof, "decode", two, 8, 1)["cluster cores"] == pytest.approx(1.9 / (5 * MS))


def test_the_stream_model_prices_a_dask_stage_with_the_remote_rate_and_charges_this_machine():
    prof = profile(decode_s=10 * MS, nbytes=1000, step_s=0.1 * MS)
    link = ClusterLink(workers=4, threads_per_worker=1, task_s=1 * MS, bandwidth_bytes_per_s=1e9,
                       client_cpu_task_s=0.2 * MS)
    cp = prof.model_copy(update={"cluster": link})
    place = {m: "cpu" for m in prof.members}
    pred = predict(cp, place, dask(4, 2))
    assert pred.rate_of("decode").batches_per_s == pytest.approx(remote.rate(cp, "decode", link, 4, 2))
    assert pred.bottleneck == "decode"
    # on this machine's cores: the workers' compute when the cluster shares them, else only the client's
    cores = next(r for r in pred.rates if r.name == "cores")
    shared = predict(cp.model_copy(update={"cluster": link.model_copy(update={"shares_host": True})}), place,
                     dask(4, 2))
    cores_shared = next(r for r in shared.rates if r.name == "cores")
    assert cores_shared.seconds_per_batch == pytest.approx(cores.seconds_per_batch + 10 * MS / 2, rel=1e-6)
    assert shared.samples_per_s < pred.samples_per_s


def test_the_planner_offloads_only_what_the_model_predicts_faster():
    prof = profile(decode_s=20 * MS, nbytes=1000, cores=2, step_s=0.2 * MS, batches=256)
    big = describe_link(ClusterDescription(nodes=4, cores_per_node=8, bandwidth_gbit_s=10))
    plan, cand, off = plan_offload(prof, big, objective="throughput")
    assert off.chosen and plan.settings.kind_of("decode") == "dask"
    assert off.predicted_samples_per_s > 1.5 * off.local_predicted_samples_per_s
    assert plan.predicted_samples_per_s == pytest.approx(off.predicted_samples_per_s)
    assert off.stages[0].remote_workers <= big.threads and 0 < off.network_share < 1
    assert off.network_bytes_per_s == pytest.approx(2000 * off.predicted_samples_per_s / 32, rel=1e-6)
    # a link too slow for the batches: the model predicts the cluster slower, so this machine's workers stay
    slow = big.model_copy(update={"bandwidth_bytes_per_s": 10_000.0})
    plan, cand, off = plan_offload(prof, slow, objective="throughput")
    assert not off.chosen and "dask" not in plan.settings.worker_kind.values()
    assert off.predicted_samples_per_s < off.local_predicted_samples_per_s
    assert cand is not None and off.stages[0].bound == "network"


def test_a_stage_measured_slower_on_the_workers_is_priced_so_and_can_flip_the_offload():
    prof = profile(decode_s=20 * MS, nbytes=1000, cores=2, step_s=0.2 * MS, batches=256)
    link = ClusterLink(name="tcp://10.0.0.1:8786", source="measured", workers=2, threads_per_worker=2, task_s=1 * MS,
                       bandwidth_bytes_per_s=1e9)
    same = remote.terms(prof, "decode", link, 1)
    assert remote.ratio(prof, "decode", link) == (1.0, "assumed")
    slow = prof.model_copy(deep=True)
    slow.stage("decode").remote_ratio = {link.name: 3.0, "tcp://elsewhere:8786": 0.5}  # only this address counts
    assert remote.ratio(slow, "decode", link) == (3.0, "measured")
    assert remote.terms(slow, "decode", link, 1).compute_s == pytest.approx(3 * same.compute_s)
    # compute-bound on the cluster's four cores: three times slower per batch there, a third of the rate
    assert remote.bound(prof, "decode", link, 4, 1) == remote.bound(slow, "decode", link, 4, 1) == "compute"
    assert remote.rate(slow, "decode", link, 4, 1) == pytest.approx(remote.rate(prof, "decode", link, 4, 1) / 3)
    # four remote cores against this machine's two: the offload wins at 1x, loses at 3x
    plan, _, off = plan_offload(prof, link, objective="throughput")
    assert off.chosen and plan.settings.kind_of("decode") == "dask"
    plan, _, off3 = plan_offload(slow, link, objective="throughput")
    assert not off3.chosen and "dask" not in plan.settings.worker_kind.values()
    assert off3.predicted_samples_per_s < off.predicted_samples_per_s
    assert "'decode' measured 3.0x slower per batch on the cluster's workers than here: priced so" in plan.notes
    # a described cluster: 1 unless the description gives the stage's ratio (which it takes as given)
    d = ClusterDescription(nodes=2, cores_per_node=2, bandwidth_gbit_s=8, task_overhead_ms=1, latency_ms=0)
    assert remote.ratio(slow, "decode", describe_link(d)) == (1.0, "assumed")
    told = describe_link(d.model_copy(update={"stage_ratio": {"decode": 3.0}}))
    assert remote.rate(prof, "decode", told, 4, 1) == pytest.approx(remote.rate(slow, "decode", link, 4, 1), rel=0.01)
    assert "'decode' described 3.0x slower" in " ".join(plan_offload(prof, told, objective="throughput")[0].notes)
    with pytest.raises(PlacerError, match="stage_ratio"):
        parse_cluster('{"nodes": 1, "cores_per_node": 2, "bandwidth_gbit_s": 1, "stage_ratio": {"decode": 0}}')


# -- a described cluster ---------------------------------------------------------------------------
def test_a_description_gives_a_link_and_bad_ones_name_the_field_and_the_fix(tmp_path):
    d = parse_cluster('{"nodes": 3, "cores_per_node": 8, "bandwidth_gbit_s": 25, "latency_ms": 0.5, '
                      '"core_speed": 2}')
    link = describe_link(d)
    assert link.threads == 24 and link.bandwidth_bytes_per_s == pytest.approx(25e9 / 8)
    assert link.task_s == pytest.approx((1.0 + 4 * 0.5) / 1e3) and link.cpu_scale == 0.5
    yml = tmp_path / "c.yaml"
    yml.write_text("nodes: 2\ncores_per_node: 4\nbandwidth_gbit_s: 1\n")
    assert load_cluster(yml).nodes == 2
    cases = {'{"nodes": 0, "cores_per_node": 8, "bandwidth_gbit_s": 1}': ("'nodes'", "at least 1"),
             '{"nodes": 2, "cores_per_node": 8, "bandwidth_gbit_s": -1}': ("'bandwidth_gbit_s'", "Gbit/s"),
             '{"nodes": 2, "cores": 8, "bandwidth_gbit_s": 1}': ("'cores'", "cores_per_node"),
             '{"nodes": 2,': ("not valid JSON", "fix the syntax"),
             '[1, 2]': ("expected an object", "nodes")}
    for text, words in cases.items():
        with pytest.raises(PlacerError) as e:
            parse_cluster(text, where="box.json")
        assert str(e.value).startswith("box.json") and all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(PlacerError, match="cannot read cluster description"):
        load_cluster(tmp_path / "missing.json")


@pytest.mark.slow
def test_placer_plan_with_a_described_cluster_prints_workers_per_stage_and_the_network(tmp_path):
    from typer.testing import CliRunner

    from placer.cli import app

    desc = tmp_path / "cluster.json"
    desc.write_text(json.dumps({"name": "rack", "nodes": 4, "cores_per_node": 16, "bandwidth_gbit_s": 10}))
    args = ["plan", "pipelines/stream_tabular.py", "--size", "96", "--param", "batch=24", "--param", "epochs=1",
            "--cluster", str(desc), "--budget-s", "2"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    off = doc["offload"]
    assert off["cluster"] == "rack" and off["source"] == "described" and off["threads"] == 64
    assert off["stages"] and all(s["remote_workers"] >= 1 and s["group"] >= 1 for s in off["stages"])
    assert off["bandwidth_bytes_per_s"] == pytest.approx(1.25e9) and off["network_share"] >= 0
    assert off["chosen"] == any(k == "dask" for k in doc["worker_kind"].values())
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "cluster rack (described, 64 threads)" in r.output and "of the link)" in r.output
    assert " local" in r.output or " remote" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": 4, "cores_per_node": 0, "bandwidth_gbit_s": 10}')
    r = CliRunner().invoke(app, [*args[:-4], "--cluster", str(bad)])
    assert r.exit_code != 0 and "'cores_per_node'" in r.output


# -- a running cluster -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", memory_limit="2GiB") as c, Client(c) as cl:
        yield cl


@pytest.mark.slow
def test_grouped_tasks_keep_the_order_and_the_outputs_of_the_sequential_run(client, monkeypatch):
    from placer.executor import execute
    from placer.executor.stream.dask_workers import DaskPool
    from placer.loader import load_pipeline
    from placer.stream import StreamConfig

    p = load_pipeline(str(ROOT / "pipelines" / "stream_cache.py"), 80, batch=8, epochs=1, passes=1)
    sequential = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    calls: list[int] = []
    real = DaskPool.call_many

    def counted(self, items):
        calls.append(len(items))
        assert [i.seq for _, i in items] == list(range(items[0][1].seq, items[0][1].seq + len(items)))
        return real(self, items)

    monkeypatch.setattr(DaskPool, "call_many", counted)
    cfg = StreamConfig(stage_workers={"decode": 2, "augment": 2}, worker_kind={"decode": "dask", "augment": "dask"},
                       stage_group={"decode": 3, "augment": 4}, prefetch=2)
    run = execute(p, "all=cpu", stream=cfg, scheduler=client)
    assert run.outputs_digest == sequential.outputs_digest
    batches = math.ceil(80 / 8)
    assert sum(calls) == 2 * batches and max(calls) == 4 and 3 in calls  # both stages, grouped
    assert len(calls) == math.ceil(batches / 3) + math.ceil(batches / 4)  # a short last group at the end


@pytest.mark.slow
def test_the_probe_measures_the_cluster_once_per_address(client):
    link = probe_cluster(client, 1000)
    assert link.workers == 2 and link.threads == 2 and link.shares_host and link.source == "measured"
    assert 0 < link.task_s < 5 and link.bandwidth_bytes_per_s > 1e6 and link.client_cpu_task_s >= 0
    assert not any("is not this machine's" in n for n in link.notes), link.notes  # the same CPU on 127.0.0.1
    assert link.array_ratio is not None and link.array_ratio > 0 and link.cpu_scale == 1.0  # measured, not applied
    assert probe_cluster(client, 2000) is link  # the same size class: cached
    assert probe_cluster(client, 2000, refresh=True) is not link


SLEEPY = """
import time

import numpy as np

from placer import Pipeline


def _batches(size: int):
    for i in range(0, size, 4):
        yield np.arange(i, min(i + 4, size), dtype=np.float64)


def _wait(batches):
    time.sleep(0.004)  # releases the GIL: threads here scale, and so do the cluster's two workers
    return batches * 2.0


def _total(wait, state):
    return (state or 0.0) + float(wait.sum())


def build(size=None):
    n = 96 if size is None else size
    p = Pipeline("sleepy_stream", size=n)
    p.source("batches", batch_size=4, params={"size": n})(_batches)
    p.stage("wait", kind="preprocessing", device="cpu")(_wait)
    p.step("total", kind="other", init=lambda: 0.0)(_total)
    return p
"""


@pytest.mark.slow
def test_advise_on_a_cluster_never_keeps_a_slower_measured_offload(client, monkeypatch, tmp_path):
    import placer.stream.offload as cluster
    from placer.advisor import advise
    from placer.loader import load_pipeline

    (tmp_path / "sleepy_stream.py").write_text(SLEEPY)
    p = load_pipeline(str(tmp_path / "sleepy_stream.py"), 96)
    real = cluster.probe_cluster

    def eager(c, nbytes, **kw):  # the model is told the cluster's cores are 100x these: it predicts the offload
        return real(c, nbytes, **kw).model_copy(update={"task_s": 0.0, "stage_ratio": {"wait": 0.01},
                                                         "shares_host": False, "client_cpu_task_s": 0.0,
                                                         "client_cpu_per_byte_s": 0.0})

    monkeypatch.setattr(cluster, "probe_cluster", eager)
    advised = advise(p, scheduler=client, budget_s=3, target="none", baselines=False)
    plan = advised.stream_plans[0]
    off = plan.offload
    assert off is not None and off.predicted_samples_per_s > 1.5 * off.local_predicted_samples_per_s
    assert off.measured_samples_per_s is not None and off.local_measured_samples_per_s is not None
    # ... but 4 ms sleeps on two workers, each task a round trip, measure slower than this machine's threads
    kept = advised.run.streams[0].samples_per_s
    other = next(a for a in plan.baselines if a.name in ("CPU stages on the cluster", "this machine only"))
    assert kept >= other.measured_samples_per_s
    on_cluster = any(s.worker_kind == "dask" for s in advised.run.stages)
    assert on_cluster == off.chosen == (off.measured_samples_per_s > off.local_measured_samples_per_s)
    assert on_cluster == (plan.settings.kind_of("wait") == "dask")
    assert other.predicted_samples_per_s == pytest.approx(
        off.local_predicted_samples_per_s if on_cluster else off.predicted_samples_per_s)
    assert type(plan).model_validate_json(plan.to_json()) == plan


@pytest.mark.slow
def test_profiling_with_a_cluster_times_each_cpu_stage_on_a_worker(client, tmp_path):
    from placer.loader import load_pipeline
    from placer.stream.profile import profile_stream

    (tmp_path / "sleepy_stream.py").write_text(SLEEPY)
    p = load_pipeline(str(tmp_path / "sleepy_stream.py"), 96)
    prof = profile_stream(p, budget_s=2, cluster=client)
    address = str(client.scheduler.address)
    wait = prof.stage("wait")
    assert set(wait.remote_ratio) == {address} and wait.remote_ratio[address] > 0  # measured for this cluster
    assert not prof.stage("batches").remote_ratio and not prof.stage("total").remote_ratio  # CPU batch stages only
    link = probe_cluster(client, 1000)
    assert remote.ratio(prof, "wait", link) == (wait.remote_ratio[address], "measured")
    plan = plan_offload(prof, link, objective="throughput")[0]
    assert any(n.startswith("'wait' measured") and n.endswith("priced so") for n in plan.notes), plan.notes


def test_the_report_shows_the_cluster_option():
    from placer.data.report import StreamClusterFacts
    from placer.data.stream import Offload, OffloadStage, StreamPlan
    from placer.report.streams import add_plan

    plan = StreamPlan(pipeline="p", source="batches", step="train", predicted_samples_per_s=900.0)
    plan.offload = Offload(cluster="tcp://10.0.0.1:8786", threads=8, predicted_samples_per_s=900.0,
                           measured_samples_per_s=700.0, local_predicted_samples_per_s=400.0,
                           local_measured_samples_per_s=350.0, network_bytes_per_s=2.5e7, network_share=0.2,
                           bandwidth_bytes_per_s=1.25e8, chosen=True,
                           stages=[OffloadStage(name="decode", remote_workers=6, group=4, bytes_per_batch=12345,
                                                predicted_batches_per_s=31.5, bound="compute")])
    from placer.data.report import StreamFacts

    facts = StreamFacts(source="batches", step="train", epochs=1, batches=10, samples=100, seconds=1.0,
                        samples_per_s=700.0, time_to_first_batch_s=0.1, consumer_idle_fraction=0.1, prefetch=2)
    add_plan(facts, plan, {})
    assert isinstance(facts.cluster, StreamClusterFacts)
    assert facts.cluster.stages[0]["group"] == 4 and facts.cluster.measured_samples_per_s == 700.0
    from placer.cli.plan import offload_lines

    text = "\n".join(offload_lines(plan.offload))
    assert "decode: 6 remote tasks in flight of 4 batches" in text and "(20.0% of the link)" in text
    assert "900.0 samples/s predicted, measured 700.0" in text and "400.0 predicted, measured 350.0" in text


@pytest.mark.slow
def test_placer_run_at_a_cluster_runs_the_modelled_offload_grouped_or_keeps_the_stages_here(
        client, monkeypatch, tmp_path):
    import placer.stream.offload as cluster
    from placer.advisor import best_placement
    from placer.executor import execute
    from placer.loader import load_pipeline
    from placer.site import open_site
    from placer.stream import StreamConfig

    (tmp_path / "sleepy_stream.py").write_text(SLEEPY)
    p = load_pipeline(str(tmp_path / "sleepy_stream.py"), 96)
    sequential = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    real = cluster.probe_cluster
    for told, offloaded in ((dict(task_s=0.0, stage_ratio={"wait": 0.01}, shares_host=False, client_cpu_task_s=0.0,
                                  client_cpu_per_byte_s=0.0), True),  # a cluster the model finds fast
                            (dict(task_s=1.0, bandwidth_bytes_per_s=1e3), False)):  # a hopeless one
        monkeypatch.setattr(cluster, "probe_cluster",
                            lambda c, n, told=told, **kw: real(c, n, **kw).model_copy(update=told))
        with open_site(client) as site:
            chosen = best_placement(p, p.size, site)
        assert (chosen.stream.kind_of("wait") == "dask") == offloaded, chosen.why
        run = execute(p, chosen.placement, scheduler=client, stream=chosen.stream)
        kinds = {s.name: s.worker_kind for s in run.stages}
        assert kinds["wait"] == ("dask" if offloaded else "thread")
        assert run.outputs_digest == sequential.outputs_digest
        if offloaded:
            assert chosen.stream.group_of("wait") >= 1 and "dask workers on wait" in chosen.why
