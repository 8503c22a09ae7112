"""A stream planned for a described machine (``--target``): the profile turned into the target's, the plan
chosen for it, what it would be bound by, the what-ifs, the report, the CLI and the drop-in.

Most tests build the profile by hand (the numbers are then known); a few measure small streams here.
This machine's CPU calibration is replaced by one built from the target's own op rows, every op twice
as slow here, so the CPU scale is exactly one half and no calibration runs.
"""

from __future__ import annotations

import json

import pytest

from placer.costmodel.roofline import load_description
from placer.data.measures import Work
from placer.data.stream import CopyProfile, ScalingRow, StreamStageProfile as StageProfile, StreamProfile
from placer.target import CpuDescription, OpRow, TargetDescription, load_target
from placer.stream import target as tg

H200 = load_target("h200")


def slower_here(factor: float = 2.0, cores: int = 2) -> CpuDescription:
    """This machine as a CPU whose every op takes ``factor`` times the target's (one core each)."""
    rows = [r.model_copy(update={"seconds": r.seconds * factor, "threads": 1, "threads_used": 1.0})
            for r in H200.cpu.ops]
    here = CpuDescription(model="test CPU", cores=cores, threads=1, dispatch_s=5e-6, ops=rows)
    return here


def _h200_one_thread() -> TargetDescription:
    """The H200 target with its op rows read as one core's work (so the ratio is the same for every op)."""
    cpu = H200.cpu.model_copy(update={"ops": [r.model_copy(update={"threads": 1, "threads_used": 1.0})
                                               for r in H200.cpu.ops]})
    return H200.model_copy(update={"cpu": cpu})


TARGET = _h200_one_thread()
HERE = slower_here()


@pytest.fixture
def no_calibration(monkeypatch):
    """This machine's CPU calibration is ``HERE`` (no 15 s measurement in tests)."""
    import placer.target.calibrate as cal

    monkeypatch.setattr(cal, "this_cpu", lambda **_: HERE)


def stream_profile(*, augment_s=0.08, gil_bound=True, step_s=0.05, out_bytes=64 * 3 * 32 * 32 * 4,
                   batches: int = 16) -> StreamProfile:
    """source → augment (pure Python: GIL-bound, one process worker measured) → train, measured on 2 cores."""
    two = 1.05 if gil_bound else 1.9  # two threads' speed-up
    aug_scaling = [ScalingRow(kind="thread", workers=1, batches_per_s=1 / augment_s, speedup=1.0),
                   ScalingRow(kind="thread", workers=2, batches_per_s=two / augment_s, speedup=two),
                   ScalingRow(kind="process", workers=1, batches_per_s=0.98 / augment_s, speedup=1.0)]
    stages = [
        StageProfile(name="batches", role="source", seconds={"cpu": 1e-4}, cpu_seconds={"cpu": 1e-4},
                     out_bytes={"host": 64 * 3 * 32 * 32}),
        StageProfile(name="augment", role="batch", kind="preprocessing", devices=["cpu"], reads=["batches"],
                     seconds={"cpu": augment_s}, cpu_seconds={"cpu": 0.9 * augment_s}, out_bytes={"host": out_bytes},
                     scaling=aug_scaling, gil_bound=gil_bound),
        StageProfile(name="train", role="step", kind="training", devices=["cpu"], reads=["augment"],
                     seconds={"cpu": step_s}, cpu_seconds={"cpu": step_s}, gil=0.2),
    ]
    return StreamProfile(pipeline="images", source="batches", step="train", members=["batches", "augment", "train"],
                         samples_per_batch=64, batches_per_epoch=batches, cores=2, stages=stages, torch_threads=1)


def work(*, augment_bytes=5e6, step_flops=1.5e9) -> dict[str, Work]:
    return {"augment": Work(flops=6e5, bytes=augment_bytes, ops=13, calls=38, outside_s=1e-4),
            "train": Work(flops=step_flops, bytes=1.4e8, ops=54, calls=91, outside_s=5e-4)}


# -- the profile on the target ----------------------------------------------------------------------
def test_cpu_times_are_scaled_and_gpu_times_come_from_the_roofline():
    prof, w = stream_profile(), work()
    tp = tg.target_profile(prof, TARGET, w, here_cpu=HERE)
    assert tp.target == TARGET.name and tp.cores == 16 and tp.devices == ["cpu", "gpu:0"]
    assert tp.real_gpus == ["gpu:0"] and tp.device_titles["gpu:0"] == "NVIDIA H200"
    aug, step = tp.stage("augment"), tp.stage("train")
    assert aug.seconds["cpu"] == pytest.approx(0.04, rel=1e-6)  # every op twice as slow here
    assert step.seconds["cpu"] == pytest.approx(0.025, rel=1e-6)
    gpu = load_description("h200")
    host = 91 * TARGET.cpu.dispatch_s + 5e-4  # the target's own tiny op; the Python as measured here
    assert step.seconds["gpu:0"] == pytest.approx(gpu.predict(w["train"].model_copy(update={"host_s": host})))
    assert tp.consumer_samples_per_s["gpu:0"] == pytest.approx(64 / step.seconds["gpu:0"])
    assert "gpu:0" not in tp.stage("batches").seconds, "the source stays on the CPU"
    assert any("prediction for" in n for n in tp.notes)


def test_workers_scale_up_to_the_target_cores_by_the_scaling_measured_here():
    tp = tg.target_profile(stream_profile(), TARGET, work(), here_cpu=HERE)
    aug = tp.stage("augment")
    threads = {r.workers: r.speedup for r in aug.scaling if r.kind == "thread"}
    procs = {r.workers: r for r in aug.scaling if r.kind == "process"}
    assert max(threads) == max(procs) == 16
    g = 2 / 1.05 - 1  # the GIL's share, from two threads' speed-up here (Amdahl)
    assert threads[16] == pytest.approx(1 / (g + (1 - g) / 16))
    assert threads[16] < 1.2, "a GIL-bound stage gains nothing from threads there either"
    assert procs[1].batches_per_s == pytest.approx(0.98 / 0.08 / 0.5)  # the one-process rate here, scaled
    assert procs[14].speedup == 14


def test_copies_go_over_the_targets_link_pinned_faster_than_pageable():
    tp = tg.target_profile(stream_profile(out_bytes=8 << 20), TARGET, work(), here_cpu=HERE)
    to_gpu = tp.copy_of("augment", "host", "gpu:0")
    assert to_gpu is not None and to_gpu.bytes == 8 << 20
    assert to_gpu.seconds["pinned"] < to_gpu.seconds["pageable"]
    assert tp.copy_of("augment", "gpu:0", "host") is not None


def test_a_target_without_a_gpu_is_refused():
    from placer.errors import PlacerError

    with pytest.raises(PlacerError, match="describes no GPU"):
        tg.target_profile(stream_profile(), TARGET.model_copy(update={"gpus": []}), work(), here_cpu=HERE)


# -- the plan for the target ------------------------------------------------------------------------
def test_an_input_bound_target_names_the_stage_the_wait_and_the_gpu_option():
    # augment's work on the GPU is huge (moving 50 GB): on the CPU, with process workers, it is faster
    plan = tg.plan_for_target(stream_profile(), TARGET, work(augment_bytes=5e10), here_cpu=HERE)
    assert plan.target == TARGET.name and plan.placement["train"] == "gpu:0"
    assert plan.placement["augment"] == "cpu"
    assert plan.settings.kind_of("augment") == "process" and 1 < plan.settings.stage_workers["augment"] <= 16
    assert plan.settings.pin_memory
    assert 0 < plan.predicted_wait_fraction < 1
    s = plan.target_sentence
    assert s.startswith("On the NVIDIA H200 machine (predicted) the step on the GPU could take")
    assert "'augment' on" in s and "worker processes delivers about" in s and "the GPU would wait" in s
    gpu_rows = [w for w in plan.what_if if w.name.startswith("'augment' on the GPU")]
    assert gpu_rows and "shares the GPU with the step" in gpu_rows[0].name
    assert gpu_rows[0].predicted_samples_per_s < plan.predicted_samples_per_s
    assert all("NVIDIA H200 machine" in w.change for w in plan.what_if), "every predicted row names the target"
    assert all(d.reason.endswith("(predicted for the NVIDIA H200 machine)") for d in plan.stages)
    assert any("the step alone would take (predicted for the NVIDIA H200 machine)" in r for r in plan.reasons)
    assert any("predicted for the NVIDIA H200 machine" in r or "on the NVIDIA H200 machine" in r for r in plan.reasons)


def test_augment_on_the_gpu_when_it_is_cheap_there_shares_the_gpu_with_the_step():
    plan = tg.plan_for_target(stream_profile(augment_s=0.5), TARGET, work(), here_cpu=HERE)
    assert plan.placement == {"batches": "cpu", "augment": "gpu:0", "train": "gpu:0"}
    assert plan.bottleneck == "gpu:0"
    assert "shares the GPU with it" in plan.target_sentence
    back = [w for w in plan.what_if if w.name.startswith("'augment' on the CPU")]
    assert back and back[0].predicted_samples_per_s < plan.predicted_samples_per_s


def test_a_fast_loader_leaves_the_step_binding():
    plan = tg.plan_for_target(stream_profile(augment_s=0.001, gil_bound=False), TARGET, work(augment_bytes=5e10),
                              here_cpu=HERE)
    assert plan.predicted_wait_fraction == pytest.approx(0.0, abs=0.02)
    assert "the step binds" in plan.target_sentence


def test_the_plan_round_trips_as_json_with_its_target():
    from placer.data.stream import StreamPlan

    plan = tg.plan_for_target(stream_profile(), TARGET, work(), here_cpu=HERE)
    back = StreamPlan.model_validate_json(plan.to_json())
    assert back.target == plan.target and back.target_sentence == plan.target_sentence
    summary = tg.target_summary(plan)
    assert summary["machine"] == TARGET.name and summary["label"] == "predicted"
    assert all(w["machine"] == TARGET.name for w in summary["what_if"])


# -- measured here: the work of one batch, a whole stream ------------------------------------------
def test_the_work_of_the_gpu_implementation_and_the_step_is_counted_here():
    from pipelines.stream_images import build

    notes: list[str] = []
    w = tg.count_stream_work(build(64, epochs=1, batch=16, augment="numpy"), "batches", notes=notes)
    assert set(w) == {"augment", "train"}, notes
    assert w["train"].flops > 10 * w["augment"].flops > 0
    assert w["train"].calls >= w["train"].ops > 10


def test_a_bundled_stream_planned_for_the_h200_from_here(no_calibration):
    from pipelines.stream_images import build

    # batches of 64: the reference's CNN step takes 2.15 ms there on the GPU, 7.65 ms on its CPU (at 16 the two
    # are within 2x, and the time outside ops read on a busy machine can tip the plan)
    plan = tg.plan_stream_for_target(build(128, epochs=1, batch=64, augment="numpy"), "h200", budget_s=2.0)
    assert plan.target == H200.name and not plan.verified, "nothing is verified: the target is not here"
    assert plan.placement["train"] == "gpu:0"
    assert plan.consumer_samples_per_s and plan.predicted_samples_per_s > 0
    assert any(w.name.startswith("'augment' on the") for w in plan.what_if)
    assert "NVIDIA H200 machine" in plan.target_sentence


# -- the report, the CLI, the drop-in ---------------------------------------------------------------
def test_the_report_carries_the_target_plan_with_its_name():
    from placer.report import render_html, render_markdown
    from placer.report.streams import add_target_plan
    from test_report_stream import facts_of, starved

    facts = facts_of(starved())
    plan = tg.plan_for_target(stream_profile(), TARGET, work(augment_bytes=5e10), here_cpu=HERE)
    plan = plan.model_copy(update={"source": "read"})
    add_target_plan(facts.streams[0], plan)
    t = facts.streams[0].target
    assert t.machine == TARGET.name and t.sentence == plan.target_sentence
    html, md = render_html(facts), render_markdown(facts)
    for text in (html, md):
        assert "predicted, not measured" in text and "NVIDIA H200 machine" in text
        assert "the GPU would wait" in text and "shares the GPU with the step" in text
    assert json.loads(facts.to_json())["streams"][0]["target"]["machine"] == TARGET.name


@pytest.mark.slow
def test_placer_plan_target_prints_the_plan_for_the_target(no_calibration, tmp_path):
    from typer.testing import CliRunner

    from placer.cli import app

    out = tmp_path / "plan.json"
    r = CliRunner().invoke(app, ["plan", "pipelines/stream_images.py", "--size", "128", "--param", "batch=64",
                                 "--param", "augment=numpy", "--param", "epochs=1", "--target", "h200",
                                 "--budget-s", "2", "--json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["target"] == H200.name and doc["target_sentence"].startswith("On the NVIDIA H200 machine")
    assert doc["placement"]["train"] == "gpu:0" and doc["predicted_wait_fraction"] is not None


@pytest.mark.slow
def test_advise_loader_for_a_target_on_a_plain_script(no_calibration):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import placer.stream

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 3, 32, 32), torch.randint(0, 4, (128,)))
    # big enough a step (about 1 GFLOP a batch) that the GPU beats the target's CPU at it
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3072, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    advice = placer.stream.advise_loader(DataLoader(data, batch_size=32), step, batches=4, budget_s=3, target="h200")
    t = json.loads(advice.to_json())["target"]
    assert t["machine"] == H200.name and t["label"] == "predicted"
    assert t["predicted_samples_per_s"] > 0 and t["step_predicted_samples_per_s"] > 0
    assert t["bottleneck"] and 0 <= t["predicted_wait_fraction"] <= 1
    assert 0 <= t["loader"]["num_workers"] <= 16 and t["loader"]["pin_memory"] is True
    assert t["settings"]["placement"] == {"loader": "cpu", "step": "gpu:0"}
    assert any("DataLoader worker processes" in w["name"] for w in t["what_if"])
    assert "NVIDIA H200 machine (predicted)" in str(advice)


@pytest.mark.slow
def test_advise_with_a_target_adds_the_targets_plan_to_the_report_and_json(no_calibration, tmp_path, capsys):
    from placer.advisor import advise
    from placer.cli.advise import summary_document
    from placer.report import render_markdown
    from test_stream_plan import slow_stream

    advised = advise(slow_stream(sleep_s=0.01, batches=12), budget_s=3.0, target="h200", baselines=False,
                     warmup=False)
    assert len(advised.stream_target_plans) == 1 and advised.stream_target_plans[0].target == H200.name
    t = summary_document(advised, None)["streams"][0]["target"]
    assert t["machine"] == H200.name and t["label"] == "predicted" and t["bottleneck_sentence"]
    assert t["predicted_samples_per_s"] > 0 and set(t["settings"]["placement"]) == {"rows", "slow", "total"}
    assert all(w["machine"] == H200.name for w in t["what_if"])
    assert "predicted, not measured" in render_markdown(advised.facts)
    saved = advised.save(tmp_path / "saved")
    assert json.loads(saved["stream-target-plan-rows"].read_text())["target"] == H200.name
    from placer.cli.advise import _print  # the console says it too, not only the files

    _print(advised, tmp_path / "r.html", None)
    printed = " ".join(capsys.readouterr().out.split())
    assert "samples/s predicted on the" in printed and advised.stream_target_plans[0].target_sentence[:30] in printed
    here = advise(slow_stream(sleep_s=0.01, batches=12), budget_s=3.0, target="auto", baselines=False, warmup=False)
    assert not here.stream_target_plans and "target" not in summary_document(here, None)["streams"][0]


def test_one_threads_work_is_scaled_per_core_never_by_the_targets_extra_cores():
    from placer.target import CpuScale

    # here: tiny ops 1.5x the target's time, large ops (split over the target's 16 threads there) 16x
    rows = [r.model_copy(update={"seconds": r.seconds * (16.0 if r.seconds > 1e-3 else 1.5), "threads": 1,
                                 "threads_used": 1.0}) for r in H200.cpu.ops]
    here = CpuDescription(model="test CPU", cores=2, threads=1, dispatch_s=5e-6, ops=rows)
    scale = CpuScale.between(here, H200.cpu)
    assert scale.work_ratio(0.08) < scale.dispatch_ratio / 4, "parallel work of that length gains the cores"
    prof = stream_profile(augment_s=0.08)
    prof.stage("augment").cpu_seconds["cpu"] = 0.08  # one core busy all the time: pure Python, one thread
    tp = tg.target_profile(prof, H200, work(), here_cpu=here)
    assert tp.stage("augment").seconds["cpu"] == pytest.approx(0.08 * scale.dispatch_ratio)


# -- the step in a lower precision ----------------------------------------------------------------
def _step_precision(rel_error: float):
    from placer.data.measures import PrecisionCheck
    from placer.stream.precision import StepPrecision

    w32 = Work(flops=1.5e12, tensor_flops=1.49e12, bytes=1.4e9, tensor_bytes=4e8, ops=54, calls=91, outside_s=5e-4)
    w16 = w32.model_copy(update={"bytes": 0.8e9, "tensor_bytes": 2e8, "ops": 70, "calls": 110})
    check = PrecisionCheck(precision="bf16", metric="loss", rel_error=rel_error, tolerance=0.01, method="test",
                           seconds=5.0, fp32_seconds=0.05, size=64)
    return StepPrecision(step="train", checks={"bf16": check}, work={"fp32": w32, "bf16": w16}), w32


def test_a_faster_bf16_step_moves_the_bottleneck_to_the_loader_and_its_workers_follow(no_calibration):
    sp, w32 = _step_precision(3e-3)
    w = {**work(), "train": w32}
    # a long run: an epoch's fill (the first batch's way through 80 ms of augment) weighs nothing in it
    prof = stream_profile(augment_s=0.08, gil_bound=False, step_s=2.0, batches=1024)
    fp32 = tg.plan_for_target(prof, TARGET, w, here_cpu=HERE)
    low = tg.plan_for_target(prof, TARGET, w, here_cpu=HERE, step_precision=sp)
    assert fp32.placement["train"] == low.placement["train"] == "gpu:0"
    times = low.precision_s["gpu:0"]
    assert 3 <= times["fp32"] / times["bf16"] <= 14  # a matmul-bound step: the reference's range
    assert low.precision == {"train": "bf16"} and not fp32.precision
    # the CPU's bf16 (emulated here, charged at 100x) is never chosen there
    assert low.precision_s["cpu"]["bf16"] > low.precision_s["cpu"]["fp32"]
    # the loader that kept up with the fp32 step needs many workers to keep up with the bf16 one
    assert low.settings.stage_workers.get("augment", 0) >= 4 > fp32.settings.stage_workers.get("augment", 0)
    assert any("bottleneck: gpu:0" in r for r in fp32.reasons + low.reasons)
    assert any("next: augment" in r for r in low.reasons)  # right behind the bf16 step
    assert low.predicted_samples_per_s > 2 * fp32.predicted_samples_per_s
    assert any("step 'train' in bf16 on gpu:0" in r and "loss differs by 0.30%" in r for r in low.reasons)
    assert [c["precision"] for c in low.precision_checks] == ["bf16"]
    assert "precision" in low.model_dump() and "precision" not in fp32.model_dump()  # saved as before in fp32


def test_a_step_whose_bf16_loss_moved_too_much_keeps_fp32_and_says_why(no_calibration):
    sp, w32 = _step_precision(0.04)
    w = {**work(), "train": w32}
    plan = tg.plan_for_target(stream_profile(gil_bound=False, step_s=2.0), TARGET, w, here_cpu=HERE, step_precision=sp)
    assert plan.precision == {} and "bf16" in plan.precision_s["gpu:0"]
    assert plan.settings.stage_workers.get("augment", 0) < 4
    assert any("bf16 not chosen for the step: loss differs by 4.00%" in r for r in plan.reasons)


def _matmul_stream(precision=("tf32", "bf16")):
    """batches of rows → a step that trains a linear layer on them and records its loss per batch."""
    import numpy as np
    import torch

    from placer import Pipeline

    p = Pipeline("mm-stream", size=48, size_unit="samples")

    @p.source(batch_size=16)
    def rows():
        g = np.random.default_rng(0)
        for _ in range(3):
            yield g.standard_normal((16, 64)).astype(np.float32)

    def init(device):
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 64)
        return {"lin": lin, "opt": torch.optim.SGD(lin.parameters(), lr=0.01), "losses": []}

    @p.step(kind="training", init=init, precision=precision)
    def train(rows, state, device):
        x = torch.as_tensor(rows)
        loss = torch.nn.functional.mse_loss(state["lin"](x).float(), x)
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        state["losses"].append(float(loss.detach()))
        return state

    return p


def test_planning_a_stream_checks_the_steps_precisions_and_predicts_them_here_and_on_the_target(no_calibration):
    from placer.stream.planner import plan_stream

    here = plan_stream(_matmul_stream(), budget_s=2.0, verify_runs=False)
    checks = {c["precision"]: c for c in here.precision_checks}
    assert set(checks) == {"tf32", "bf16"} and all(c["rel_error"] < 0.01 for c in checks.values())
    cpu = here.precision_s["cpu"]
    assert cpu["tf32"] == cpu["fp32"] and here.precision == {}  # a CPU has no TF32; fp32 stays
    there = tg.plan_stream_for_target(_matmul_stream(), TARGET, budget_s=2.0, here_cpu=HERE)
    assert set(there.precision_s["gpu:0"]) == {"fp32", "tf32", "bf16"}
    assert plan_stream(_matmul_stream(precision=()), budget_s=2.0, verify_runs=False).precision_s == {}
