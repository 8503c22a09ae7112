"""Precision as a stage's setting: declaring it, running in it (restored after), streams, the CLI.

Every pipeline here is tiny and built in the test. On this CPU, bf16 autocast is real:
a matrix product under it returns bfloat16.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from placer import Pipeline, execute
from placer.errors import PipelineError, PlacementError, StageFailedError
from placer.precision import parse_precision_option, running_in, state
from placer.stream import StreamConfig
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[1]


def matmul_pipeline(**stage_kw) -> Pipeline:
    p = Pipeline("mm")

    @p.stage()
    def data(device):
        g = torch.Generator().manual_seed(0)
        return torch.randn(32, 32, generator=g).to(device)

    @p.stage(**stage_kw)
    def product(data, device):
        return {"dtype": str((data @ data).dtype), "autocast": torch.is_autocast_enabled("cpu"),
                "matmul": torch.get_float32_matmul_precision()}

    return p


# -- declaring ---------------------------------------------------------------------------------

def test_a_stage_declares_lower_precisions_and_the_pipeline_a_default():
    p = Pipeline("d", precision="bf16")

    @p.stage(precision=("TF32", "bf16", "fp32"), tolerance=0.05)
    def a(device):
        return 1

    @p.stage()
    def b(a, device):
        return a

    @p.stage(precision=())
    def c(b, device):
        return b

    assert p.stages["a"].precision == ("tf32", "bf16") and p.stages["a"].tolerance == 0.05
    assert p.allowed_precisions("a") == ("tf32", "bf16")
    assert p.allowed_precisions("b") == ("bf16",)
    assert p.allowed_precisions("c") == ()


def test_an_unknown_precision_names_the_stage_and_the_fix():
    p = Pipeline("d")
    with pytest.raises(PipelineError, match=r"stage 'a': unknown precision 'int4'; use one of fp32, tf32, bf16, fp16"):
        @p.stage(precision="int4")
        def a(device):
            return 1


def test_the_precision_option_reads_auto_and_fixed_stages_and_names_mistakes():
    assert parse_precision_option("auto, train=BF16", ["train"]) == (True, {"train": "bf16"})
    with pytest.raises(PlacementError, match=r"no stage 'trian' in the pipeline; stages: train"):
        parse_precision_option("trian=bf16", ["train"])
    with pytest.raises(PlacementError, match=r"stage 'train': unknown precision 'half'"):
        parse_precision_option("train=half", ["train"])
    with pytest.raises(PlacementError, match=r"give auto or STAGE=PRECISION"):
        parse_precision_option("bf16", ["train"])


# -- running -----------------------------------------------------------------------------------

def test_nothing_changes_numerics_unless_a_precision_is_chosen():
    """Allowing a precision is not choosing it: the stage runs in fp32 until a plan or the user picks one."""
    run = execute(matmul_pipeline(precision=("bf16",)), "all=cpu")
    out = run.final_outputs["product"]
    assert out == {"dtype": "torch.float32", "autocast": False, "matmul": "highest"}
    assert [s.precision for s in run.stages] == ["fp32", "fp32"]


def test_a_stage_runs_in_bf16_and_the_run_records_it():
    run = execute(matmul_pipeline(), "all=cpu", precision="product=bf16")
    assert run.final_outputs["product"]["dtype"] == "torch.bfloat16"
    assert run.stage("product").precision == "bf16" and run.stage("data").precision == "fp32"
    assert run.summary()["stages"][1]["precision"] == "bf16"


def test_tf32_sets_the_matmul_precision_for_the_stage_only():
    before = state()
    run = execute(matmul_pipeline(), "all=cpu", precision={"product": "tf32"})
    assert run.final_outputs["product"]["matmul"] == "high"
    assert run.final_outputs["product"]["dtype"] == "torch.float32"  # a CPU has no TF32: numbers unchanged
    assert state() == before


def test_a_plan_like_object_carries_its_precisions_and_the_option_wins_over_it():
    class Planned:
        placement = {"data": "cpu", "product": "cpu"}
        precision = {"product": "tf32"}

    assert execute(matmul_pipeline(), Planned()).stage("product").precision == "tf32"
    assert execute(matmul_pipeline(), Planned(), precision={"product": "bf16"}).stage("product").precision == "bf16"


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_settings_are_restored_after_a_stage_even_when_it_raises(precision):
    before = state()
    p = Pipeline("boom")

    @p.stage()
    def fails(device):
        assert state() != before
        raise RuntimeError("boom")

    with pytest.raises(StageFailedError, match="boom"):
        execute(p, "all=cpu", precision={"fails": precision})
    assert state() == before
    with pytest.raises(RuntimeError):
        with running_in(precision):
            raise RuntimeError("inside")
    assert state() == before


def test_fp32_on_a_cuda_device_turns_tf32_off_for_the_stage_and_restores_the_users_settings():
    import torch

    # torch's defaults leave cuDNN's TF32 on for convolutions; a user may have turned matmuls to TF32 too
    old = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    try:
        before = state()
        with running_in("fp32", "cuda:0"):  # the flags are plain settings: no GPU is needed to set them
            inside = state()
        assert inside["matmul"] == "highest" and inside["cudnn_tf32"] is False and inside["cuda_matmul_tf32"] is False
        assert state() == before
        with running_in("fp32", "cpu"):  # on a CPU nothing is touched
            assert state() == before
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cudnn.allow_tf32 = old[1]


def test_an_unknown_stage_in_the_precision_mapping_is_refused():
    with pytest.raises(PlacementError, match="no stage 'nope'"):
        execute(matmul_pipeline(), "all=cpu", precision={"nope": "bf16"})


# -- streams -----------------------------------------------------------------------------------

N, B = 64, 8


def stream_pipeline() -> Pipeline:
    """source of seeded batches → a bf16-able step that records each batch's index and a matmul result."""
    p = Pipeline("s", size=N, size_unit="samples")

    @p.source(batch_size=B)
    def batches():
        g = np.random.default_rng(0)
        for i in range(0, N, B):
            yield {"i": i // B, "x": g.standard_normal((B, 16)).astype(np.float32)}

    @p.stage(kind="preprocessing", device="cpu")
    def scale(batches):
        return {"i": batches["i"], "x": batches["x"] * 2}

    def init(device):
        g = torch.Generator().manual_seed(1)
        return {"w": torch.randn(16, 16, generator=g), "seen": [], "dtypes": set(), "out": []}

    @p.step(kind="training", init=init, precision="bf16")
    def step(scale, state, device):
        y = torch.as_tensor(scale["x"]) @ state["w"]
        state["seen"].append(int(scale["i"]))
        state["dtypes"].add(str(y.dtype))
        state["out"].append(y.float().sum().item())
        return state

    return p


@pytest.mark.parametrize("workers", [1, 3])
def test_a_stream_step_in_bf16_keeps_batch_order_and_equal_outputs_across_workers(workers):
    ref = execute(stream_pipeline(), "all=cpu", stream=StreamConfig(workers=0), precision={"step": "bf16"})
    run = execute(stream_pipeline(), "all=cpu", stream=StreamConfig(workers=workers, prefetch=2),
                  precision={"step": "bf16"})
    state_ = run.final_outputs["step"]
    assert state_["seen"] == list(range(N // B))
    assert state_["dtypes"] == {"torch.bfloat16"}
    assert state_["out"] == ref.final_outputs["step"]["out"]
    assert run.outputs_digest == ref.outputs_digest
    assert run.stage("step").precision == "bf16" and run.stage("scale").precision == "fp32"
    fp32 = execute(stream_pipeline(), "all=cpu", stream=StreamConfig(workers=workers))
    assert fp32.final_outputs["step"]["dtypes"] == {"torch.float32"}
    assert fp32.outputs_digest != run.outputs_digest  # bf16 changed the numbers: only when chosen


# -- the command line --------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return run_placer([*args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_run_precision_option_runs_the_stage_in_bf16_and_records_it(tmp_path):
    res = _cli("run", "pipelines/mnist_mlp.py", "--size", "256", "--placement", "all=cpu", "--precision",
               "train=bf16", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {s["name"]: s["precision"] for s in doc["stages"]} == {
        "load": "fp32", "normalise": "fp32", "train": "bf16", "evaluate": "fp32"}
    bad = _cli("run", "pipelines/mnist_mlp.py", "--size", "256", "--placement", "all=cpu", "--precision", "trian=bf16")
    assert bad.returncode == 2 and "no stage 'trian'" in bad.stderr


def test_the_report_shows_a_precision_column_only_when_a_stage_ran_in_a_lower_one():
    from placer.report import collect
    from placer.report.render import render_html, render_markdown

    p = matmul_pipeline()
    plain = render_markdown(collect(run=execute(p, "all=cpu"), pipeline=p))
    assert "| stage | kind | device | predicted" in plain or "| stage | kind | device |" in plain
    assert "precision |" not in plain
    facts = collect(run=execute(p, "all=cpu", precision={"product": "bf16"}), pipeline=p)
    assert [r.precision for r in facts.stages] == ["fp32", "bf16"]
    md = render_markdown(facts)
    assert "## Stages\n\n| stage | kind | device | precision |" in md and "| bf16 |" in md
    assert "<th rowspan=\"2\">precision</th>" in render_html(facts)


@pytest.mark.slow
def test_plan_names_a_wrong_precision_option_before_profiling():
    res = _cli("plan", "pipelines/mnist_mlp.py", "--size", "64", "--precision", "train=half")
    assert res.returncode != 0 and "stage 'train': unknown precision 'half'" in res.stderr
    res = _cli("plan", "--costs", "x.json", "--precision", "auto")
    assert res.returncode == 2 and "--precision checks a lower precision's accuracy" in res.stderr


def test_run_refuses_auto_with_a_fixed_placement():
    res = _cli("run", "pipelines/mnist_mlp.py", "--size", "64", "--placement", "all=cpu", "--precision", "auto")
    assert res.returncode == 2 and "--precision auto lets the plan choose" in res.stderr


def test_a_training_loop_in_bf16_uses_its_updated_weights_each_step():
    """A stage's whole training loop runs inside one autocast region: autocast's cast cache (which keeps the
    first bf16 copy of each weight for the region) must be off, or every step after the first computes
    with the initial weights and the loss stops moving."""
    def train():
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g)
        lin = torch.nn.Linear(32, 1)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(1, 32, generator=g))
            lin.bias.zero_()
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        losses = []
        for _ in range(5):
            loss = torch.nn.functional.mse_loss(lin(x).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    fp32 = train()
    with running_in("bf16", "cpu"):
        low = train()
    assert fp32[-1] < 0.5 * fp32[0]
    assert low[-1] == pytest.approx(fp32[-1], rel=0.05)
