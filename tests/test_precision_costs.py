"""Precision in the cost model: tensor-core work counted apart, predicted per precision by the roofline."""

from __future__ import annotations

import pytest
import torch

from placer.costmodel.counts import count_work
from placer.costmodel.roofline import load_description
from placer.data.measures import Work


def test_counted_work_keeps_the_tensor_core_part_apart():
    a, b = torch.ones(64, 32), torch.ones(32, 16)
    _, w = count_work(lambda: torch.relu(a @ b), repeats=1)
    assert w.tensor_flops == 2 * 64 * 32 * 16
    assert w.flops == w.tensor_flops + 2 * 64 * 16  # one per element written by mm and relu
    _, ew = count_work(lambda: torch.relu(a) + 1, repeats=1)
    assert ew.tensor_flops == 0 and ew.flops > 0


def test_an_old_work_record_loads_and_predicts_as_before():
    old = Work.model_validate({"flops": 1e12, "bytes": 1e9, "ops": 10, "precision": "fp32"})
    assert old.tensor_flops == 0
    h200 = load_description("h200")
    assert h200.predict(old) == h200.predict(old, precision="fp32") == h200.predict(old, precision="bf16")


def test_a_matmul_bound_step_gains_the_reference_ratios_and_the_rest_does_not():
    """4096³ products: tf32 and bf16 over fp32 as the H200 reference rows (7× and 14× at peak), and an
    elementwise remainder at its own rate."""
    h200 = load_description("h200")
    n = 4096.0
    mm = Work(flops=2 * n**3, tensor_flops=2 * n**3, bytes=3 * n * n * 4, ops=1)
    t = {p: h200.predict(mm, precision=p) - h200.stage_overhead_s - h200.op_overhead_s for p in ("fp32", "tf32", "bf16")}
    assert t["fp32"] / t["tf32"] == pytest.approx(h200.peak("tf32") / h200.peak("fp32"), rel=1e-6)
    assert t["fp32"] / t["bf16"] == pytest.approx(h200.peak("bf16") / h200.peak("fp32"), rel=1e-6)
    # the reference rows: tf32 7.2× (357 against 49.5 TFLOP/s), bf16 13.6×
    assert 2 <= t["fp32"] / t["tf32"] <= 7.5 and 3 <= t["fp32"] / t["bf16"] <= 14
    assert h200.predict(mm) == h200.predict(mm, precision="fp32")  # unchanged without a lower precision
    half = mm.model_copy(update={"flops": 4 * n**3})  # as much work again outside tensor cores
    gain = (h200.predict(half) - h200.stage_overhead_s - h200.op_overhead_s) / (
        h200.predict(half, precision="bf16") - h200.stage_overhead_s - h200.op_overhead_s)
    assert 1.5 < gain < 2.0  # Amdahl: the elementwise half stays at the fp32 rate
