"""Targets: the machine planned for is described whole (host CPU, GPUs, link).

The CPU side of a target's predictions comes from the target's CPU: this machine's
times scaled by ops measured on both. The synthetic profiles here carry their own
CPU calibration (``machine["cpu_calibration"]``), so nothing is measured and the
scaling is exact.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from placer.cli import app
from placer.costmodel.fit import fit_size_model
from placer.costmodel.model import CostModel
from placer.costmodel.roofline import load_description
from placer.data.measures import Work
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint
from placer.site import costs_from_profile
from placer.target import CpuDescription, CpuScale, OpRow, TargetError, load_target
from placer.target.description import parse_target
from warm_cli import run as run_placer

H200 = load_target("h200")


def calibration(ratio: float) -> dict:
    """A CPU calibration of this machine on which every h200 CPU op takes 1/ratio as long here."""
    rows = [OpRow(op=r.op, size=r.size, seconds=r.seconds / ratio) for r in H200.cpu.ops]
    return CpuDescription(model="Test CPU", cores=2, ops=rows,
                          dispatch_s=H200.cpu.dispatch_s / ratio).model_dump(mode="json")


def profile(ratio: float | None = 0.25, *, per_s: float = 1e-4, work_ops: int = 10) -> Profile:
    """Two stages, ``load`` (CPU only) and ``step`` (CPU-measured, GPU by description)."""
    sizes = (100, 200, 400, 800)

    def pts(c):
        return [Point(size=n, median_s=c + per_s * n / 100, iqr_s=0.0, reps=5, raw_times=[c + per_s * n / 100] * 5,
                      output_bytes=4e3 * n) for n in sizes]

    stages = {
        "load": StageProfile(name="load", key="a", device_classes=["cpu"],
                             devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts(1e-3))}),
        "step": StageProfile(name="step", key="b", inputs=["load"],
                             devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts(2e-4))},
                             work=[WorkPoint(size=n, work=Work(flops=1e7 * n, bytes=4e4 * n, ops=work_ops))
                                   for n in sizes]),
    }
    machine = {"cpu_model": "Test CPU", "cores": 2, "machine": "x86_64", "torch": "test"}
    if ratio is not None:
        machine["cpu_calibration"] = calibration(ratio)
    return Profile(pipeline="demo", fingerprint="test", machine=machine,
                   devices={"cpu": {"kind": "cpu", "workers": 2, "label": "Test CPU"}}, stages=stages,
                   measured_sizes=list(sizes), sizes=list(sizes))


# -- the description ----------------------------------------------------------------------------
def test_h200_describes_the_whole_machine():
    assert H200.cpu.cores == 16 and "Xeon" in H200.cpu.model
    assert H200.cpu.seconds("mlp_infer", 8) == pytest.approx(7.965e-05, rel=1e-3)
    gpu = H200.gpus[0]
    assert gpu.name == "NVIDIA H200" and gpu.transfer is not None and gpu.sync_s > 0
    assert load_description("h200").name == "NVIDIA H200"  # the GPU alone, for older callers


def test_a_bad_field_is_named(tmp_path):
    doc = json.loads(H200.model_dump_json(by_alias=True))
    doc["cpu"]["cores"] = 0
    bad = tmp_path / "box.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TargetError, match=r"field cpu\.cores"):
        load_target(bad)
    doc["cpu"]["cores"] = 4
    del doc["gpus"][0]["transfer"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(TargetError, match=r"gpus\.0\.transfer"):
        load_target(bad)


def test_unknown_targets_and_foreign_files_are_refused_with_the_fix(tmp_path):
    with pytest.raises(TargetError, match="shipped targets: h200"):
        load_target("a100")
    with pytest.raises(TargetError, match="not valid JSON"):
        parse_target("{", where="x")
    with pytest.raises(TargetError, match="placer describe"):
        parse_target(json.dumps({"hello": 1}))


def test_an_older_gpu_only_description_reads_as_a_target_without_a_cpu():
    t = parse_target(H200.gpus[0].model_dump_json())
    assert t.cpu is None and t.gpus[0].name == "NVIDIA H200"


# -- scaling ------------------------------------------------------------------------------------
def test_the_scale_follows_ops_of_similar_cost_and_serial_work_gets_the_per_core_ratio():
    here = CpuDescription(model="a", cores=2, ops=[OpRow(op="x", size=1, seconds=1e-5), OpRow(op="y", size=1, seconds=1e-4),
                                                   OpRow(op="z", size=1, seconds=1e-1)])
    there = CpuDescription(model="b", cores=16, ops=[OpRow(op="x", size=1, seconds=1e-5),
                                                     OpRow(op="y", size=1, seconds=1e-4),
                                                     OpRow(op="z", size=1, seconds=1e-2)])
    s = CpuScale.between(here, there)
    assert s.ratio(1e-5) == pytest.approx(1.0, rel=0.05)
    assert s.ratio(1e-1) == pytest.approx(0.1, rel=0.05)
    assert 0.1 < s.ratio(3e-3) < 1.0
    assert s.ratio(1e-1, threads_used=1.0) == pytest.approx(1.0)
    assert CpuScale.between(here, CpuDescription(model="c", cores=1)) is None


def test_a_target_plan_uses_the_targets_cpu_and_this_machine_keeps_its_own():
    prof = profile(ratio=0.25)
    costs = costs_from_profile(prof, size=800, describe="h200")
    here = costs.table(800)
    there = costs.table(800, target=True)
    assert there.devices["cpu"].workers == 16 and "16 cores" in there.devices["cpu"].label
    assert here.devices["cpu"].workers == 2
    for st in ("load", "step"):
        assert there.seconds(st, "cpu") == pytest.approx(0.25 * here.seconds(st, "cpu"), rel=1e-6)
    assert costs.target_model.predict("load", "cpu", 800).label == "scaled"
    assert costs.model.predict("load", "cpu", 800).label == "measured"
    plan = costs.plan(target=True)
    assert plan.baselines["all_cpu"] == pytest.approx(0.25 * costs.plan().baselines["all_cpu"], rel=1e-6)
    assert any("scaled" in w for w in plan.warnings)


def test_the_described_gpu_pays_the_target_cpus_host_time_not_this_machines():
    """Profiled on a machine ten times slower (every op, tiny ones too): the target's host
    time is the same, this machine's own is ten times as long."""
    fast, slow = profile(ratio=1.0), profile(ratio=0.1)
    fast_target = costs_from_profile(fast, size=100, describe="h200").target_model
    slow_target = costs_from_profile(slow, size=100, describe="h200").target_model
    assert slow_target.host_seconds("step")[0] == pytest.approx(fast_target.host_seconds("step")[0], rel=1e-6)
    assert fast_target.host_seconds("step")[0] == pytest.approx(10 * H200.cpu.dispatch_s, rel=1e-6)  # 10 ops
    here_fast = CostModel(fast, describe=[H200]).host_seconds("step")[0]
    here_slow = CostModel(slow, describe=[H200]).host_seconds("step")[0]
    assert here_slow == pytest.approx(10 * here_fast, rel=1e-6)
    assert CostModel(slow, describe=[H200]).predict("step", "gpu:0", 100).value > \
        slow_target.predict("step", "gpu:0", 100).value


def test_a_profile_from_another_machine_without_calibration_plans_unscaled_and_says_so():
    prof = profile(ratio=None)
    prof.machine["cpu_model"] = "Some Other CPU"
    costs = costs_from_profile(prof, size=800, describe="h200", inventory=None)
    assert costs.table(800, target=True).seconds("load", "cpu") == pytest.approx(costs.table(800).seconds("load", "cpu"))
    assert any("another machine" in n for n in costs.target_notes)


def test_host_time_on_the_gpu_grows_with_the_operations_issued():
    """A loop of small steps issues ops in proportion to its steps; each pays its host time."""
    prof = profile(ratio=1.0)
    prof.stages["step"].work = [WorkPoint(size=n, work=Work(flops=1e3 * n, bytes=1e3 * n, ops=26 * n // 100))
                                for n in (100, 200, 400, 800)]
    cm = CostModel(prof, describe=[H200])
    host = cm.host_seconds("step")
    assert host[-1] == pytest.approx(8 * host[0])


def test_work_counted_at_one_size_keeps_its_host_time_fixed_and_its_flops_growing():
    """One counted size: the prediction far above it grows by the work (FLOPs, bytes), while the
    calls, launches and host time a batched stage issues stay as counted, in every precision.

    Host and device overlap, so the time bends where the work overtakes the host time; the fit
    over size follows the bend within 10 % (a host-only prediction would be 5x too small)."""
    prof = profile(ratio=1.0)
    work = Work(flops=2e11, bytes=4e8, tensor_flops=2e11, tensor_bytes=2e8, ops=400, calls=900, outside_s=0.02)
    prof.stages["step"].work = [WorkPoint(size=32, work=work)]
    cm = CostModel(prof, describe=[H200])
    gpu = next(iter(cm.described))
    desc = cm.described[gpu]
    host = cm.host_seconds("step")[0]
    for precision in (None, "bf16"):
        big = work.model_copy(update={"host_s": host, "flops": 32 * work.flops, "bytes": 32 * work.bytes,
                                      "tensor_flops": 32 * work.tensor_flops, "tensor_bytes": 32 * work.tensor_bytes})
        want = desc.predict(big, precision=precision)
        pts = cm.described_points("step", desc, precision=precision)
        assert fit_size_model(*zip(*pts))(1024) == pytest.approx(want, rel=0.1)
    assert cm.predict("step", gpu, 1024).value == pytest.approx(
        desc.predict(work.model_copy(update={"host_s": host, "flops": 32 * work.flops, "bytes": 32 * work.bytes,
                                             "tensor_flops": 32 * work.tensor_flops,
                                             "tensor_bytes": 32 * work.tensor_bytes})), rel=0.1)


def test_a_training_loop_of_small_steps_is_never_faster_than_its_launches():
    """Counted: an MLP train step (the reference's 784-512-512-10) on CPU tensors, 1-8 steps a call.

    The H200 reference measures 1.3-1.8 ms per small step; the prediction per step must
    cover the step's launches and stay within 2x of the reference. The host time is counted
    here, so the profile's calibration says what a tiny op costs here (measured), as a real
    profile's does: the prediction must not depend on the machine that counted."""
    pytest.importorskip("torch")
    from placer.costmodel.counts import count_work, dispatch_s
    from placer.target.ops import OPS

    steps = (1, 2, 4, 8)
    works = []
    for k in steps:
        one = OPS["mlp_train_step"](1)
        one()  # warm, as the profiler counts a stage it has run
        works.append(count_work(lambda: [one() for _ in range(k)])[1])
    ref_cpu_step = H200.cpu.seconds("mlp_train_step", 1)
    pts = [Point(size=k, median_s=ref_cpu_step * k, iqr_s=0.0, reps=5, raw_times=[ref_cpu_step * k] * 5)
           for k in steps]
    prof = profile(ratio=H200.cpu.dispatch_s / dispatch_s())
    prof.stages["step"] = StageProfile(name="step", key="t", devices={"cpu": DeviceProfile(device="cpu", kind="cpu",
                                                                                           points=pts)},
                                       work=[WorkPoint(size=k, work=w) for k, w in zip(steps, works)])
    costs = costs_from_profile(prof, size=64, describe="h200")
    gpu = H200.gpus[0]
    per_step = costs.target_model.predict("step", "gpu:0", 64).value / 64
    launches = works[0].ops
    assert launches >= 20
    assert per_step >= launches * gpu.op_overhead_s
    assert 1.3e-3 / 2 <= per_step <= 1.8e-3 * 2, per_step


def test_count_work_counts_synchronisations_and_multi_kernel_ops():
    torch = pytest.importorskip("torch")
    from placer.costmodel.counts import count_work

    x = torch.randn(100)
    assert count_work(lambda: [x.sum().item() for _ in range(3)])[1].syncs == 3
    assert count_work(lambda: x[x > 0])[1].syncs == 1
    assert count_work(lambda: x + 1)[1].syncs == 0
    assert count_work(lambda: torch.sort(x))[1].ops > count_work(lambda: x + 1)[1].ops


def test_count_work_keeps_the_bytes_of_indexed_masked_and_sorting_ops_apart():
    torch = pytest.importorskip("torch")
    from placer.costmodel.counts import count_work

    x = torch.randn(10_000, 16)
    keys = torch.randint(0, 100, (10_000,))
    streaming = count_work(lambda: (x * 2).sum(0))[1]
    assert streaming.irregular_bytes == 0 and streaming.bytes > 0
    for name, fn in [("mask", lambda: x[x[:, 0] > 0]), ("sort", lambda: torch.sort(x[:, 0])),
                     ("group sums", lambda: torch.zeros(100, 16).index_add_(0, keys, x))]:
        w = count_work(fn)[1]
        assert 0 < w.irregular_bytes <= w.bytes, name
    mixed = count_work(lambda: torch.sort((x * 2)[:, 0]))[1]
    assert 0 < mixed.irregular_bytes < mixed.bytes  # the multiply streams, the sort does not


def test_the_roofline_prices_irregular_bytes_at_their_own_bandwidth():
    h200 = load_description("h200")
    assert h200.irregular_eff is not None and h200.irregular_eff < h200.memory_eff
    plain = Work(bytes=1e9, ops=1)
    gathered = Work(bytes=1e9, irregular_bytes=1e9, ops=1)
    half = Work(bytes=1e9, irregular_bytes=5e8, ops=1)
    fixed = h200.predict(Work(bytes=0, ops=1))
    ratio = (h200.predict(gathered) - fixed) / (h200.predict(plain) - fixed)
    assert ratio == pytest.approx(h200.memory_eff / h200.irregular_eff, rel=1e-6)
    assert h200.predict(plain) < h200.predict(half) < h200.predict(gathered)
    # a description without the factor prices every byte as streaming work
    old = h200.model_copy(update={"irregular_eff": None})
    assert old.predict(gathered) == pytest.approx(old.predict(plain))


def test_a_one_op_compaction_is_predicted_near_the_reference_h200():
    """The reference H200 ran ``x[x[:, 0] > 0]`` on 1M rows x 16 float32 columns in 0.43 ms; the
    roofline priced it at 0.14 ms (0.33x) when its gather counted as streaming work."""
    torch = pytest.importorskip("torch")
    from placer.costmodel.counts import count_work

    x = torch.randn(100_000, 16)
    w = count_work(lambda: x[x[:, 0] > 0])[1]
    w10 = w.model_copy(update={k: 10 * getattr(w, k) for k in ("flops", "bytes", "irregular_bytes")})
    h200 = load_description("h200")
    predicted = h200.predict(w10.model_copy(update={"host_s": 2e-5}))
    assert 0.5 < predicted / 0.000426 < 2.0

# -- the commands -------------------------------------------------------------------------------
def fresh_cache(tmp_path):
    """An empty profile cache, holding only this machine's CPU calibration (measuring it again would
    only cost time)."""
    from seeded_cache import seeded_cache

    return seeded_cache(tmp_path / "cache")


def test_plan_from_a_profile_for_the_h200_machine(tmp_path):
    path = tmp_path / "p.json"
    profile(ratio=0.25).save(path)
    out = CliRunner().invoke(app, ["plan", "--profile", str(path), "--target", "h200", "--size", "800", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert set(doc["devices"]) == {"cpu", "gpu:0"}
    plain = json.loads(CliRunner().invoke(app, ["plan", "--profile", str(path), "--size", "800", "--json"]).output)
    assert set(plain["devices"]) == {"cpu"}
    assert doc["baselines"]["all_cpu"] == pytest.approx(0.25 * plain["baselines"]["all_cpu"], rel=1e-6)


def test_plan_refuses_a_target_with_a_cost_table(tmp_path):
    out = CliRunner().invoke(app, ["plan", "--costs", str(tmp_path / "c.json"), "--target", "h200"])
    assert out.exit_code != 0 and "--target" in out.output


def test_describe_writes_a_target_that_plans_anywhere(tmp_path):
    pytest.importorskip("torch")
    box = tmp_path / "box.json"
    out = CliRunner().invoke(app, ["describe", "-o", str(box), "--budget-s", "2", "--name", "test box"])
    assert out.exit_code == 0, out.output
    t = load_target(box)
    assert t.name == "test box" and t.cpu.cores >= 1 and len(t.cpu.ops) >= 3
    assert all(r.seconds > 0 for r in t.cpu.ops)
    # planned for from a profile measured on the same CPU: its times are used as measured
    prof = profile(ratio=None)
    prof.machine["cpu_calibration"] = t.cpu.model_copy(update={"ops": t.cpu.ops[:2]}).model_dump(mode="json")
    costs = costs_from_profile(prof, size=800, describe=str(box))
    assert costs.table(800, target=True).seconds("load", "cpu") == pytest.approx(costs.table(800).seconds("load", "cpu"))
    assert any("used as measured" in n for n in costs.target_notes)


def test_cpu_work_inside_a_gpu_stage_is_host_time_on_the_target():
    """numpy inside a torch stage: the counted call's time outside torch ops is host time at
    every size, one for one; on a target, each op costs the target's own tiny op and the
    Python between ops is scaled by the two CPUs' Python passes (as measured here where
    either lacks one), whatever this machine's per-op ratio."""
    base = profile(ratio=1.0)
    cm0 = CostModel(base, describe=[H200])
    with_numpy = profile(ratio=1.0)
    for wp in with_numpy.stages["step"].work:
        wp.work.outside_s = 1e-6 * wp.size  # numpy time growing with the size
    cm = CostModel(with_numpy, describe=[H200])
    extra = [a - b for a, b in zip(cm.host_seconds("step"), cm0.host_seconds("step"))]
    assert extra == pytest.approx([1e-6 * wp.size for wp in with_numpy.stages["step"].work], rel=1e-6)
    assert cm.predict("step", "gpu:0", 800).value > cm0.predict("step", "gpu:0", 800).value
    fast = profile(ratio=0.25)
    for wp in fast.stages["step"].work:
        wp.work.outside_s = 1e-6 * wp.size
    costs = costs_from_profile(fast, size=800, describe="h200")
    assert costs.target_model.host_scale.dispatch_ratio == pytest.approx(0.25, rel=1e-6)
    d = H200.cpu.dispatch_s
    assert costs.target_model.host_seconds("step")[-1] == pytest.approx(10 * d + 8e-4, rel=1e-6)
    slow = profile(ratio=4.0)  # a CPU four times as fast at tiny ops: the same host time there
    for wp in slow.stages["step"].work:
        wp.work.outside_s = 1e-6 * wp.size
    again = costs_from_profile(slow, size=800, describe="h200").target_model.host_seconds("step")
    assert again == pytest.approx(costs.target_model.host_seconds("step"), rel=1e-9)
    fast.machine["cpu_calibration"]["python_s"] = 2e-6  # both CPUs timed a pass of Python: the target twice as fast
    twice = H200.model_copy(update={"cpu": H200.cpu.model_copy(update={"python_s": 1e-6})})
    host = costs_from_profile(fast, size=800, describe=twice).target_model.host_seconds("step")
    assert host[-1] == pytest.approx(10 * d + 4e-4, rel=1e-6)


def test_count_work_keeps_the_time_spent_outside_torch():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    from placer.costmodel.counts import count_work

    x = torch.randn(10)
    a = np.random.default_rng(0).random(200_000)

    def mixed():
        for _ in range(5):
            np.sort(a)
        return x + 1

    import time

    def sorts():  # this thread's CPU time, as the counter measures it
        t0 = time.thread_time()
        for _ in range(5):
            np.sort(a)
        return time.thread_time() - t0

    direct = min(sorts() for _ in range(3))
    outside = max(count_work(mixed)[1].outside_s for _ in range(2))  # noise only adds time
    pure = min(count_work(lambda: x + 1)[1].outside_s for _ in range(3))
    assert outside >= 0.5 * direct, (outside, direct)
    assert pure < 0.2 * direct, (pure, direct)


@pytest.mark.slow
def test_advise_for_the_h200_machine_names_its_cpu_in_the_json(tmp_path):
    """``placer advise ... --target h200 --json``: the target's CPU is the H200 host's (16 cores)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PLACER_CACHE_DIR": str(fresh_cache(tmp_path))}
    res = run_placer(["advise", "pipelines/requests.py", "--size", "16",
                          "--budget-s", "4", "--target", "h200", "--no-baselines", "-o", str(tmp_path / "r.html"),
                          "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    t = doc["target"]
    assert t["cpu_cores"] == 16 and "Xeon" in t["cpu"] and t["cpu_source"] == "described"
    assert t["all_cpu_predicted_s"] > 0 and any("scaled" in n for n in t["notes"])
    assert doc["ties"]["rule"].startswith("fewer copies")


@pytest.mark.slow
def test_profile_with_a_target_reports_the_targets_cpu(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PLACER_CACHE_DIR": str(fresh_cache(tmp_path))}
    res = run_placer(["profile", "pipelines/requests.py", "--size", "16",
                          "--budget-s", "3", "--target", "h200", "--json", "-o", str(tmp_path / "p.json")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["target"]["cpu"]["workers"] == 16
    assert {e["label"] for st in doc["stages"].values() for d, e in st.items() if d == "cpu"} == {"scaled"}
    saved = Profile.load(tmp_path / "p.json")
    assert saved.machine["cpu_calibration"]["ops"]  # the calibration travels with the profile
