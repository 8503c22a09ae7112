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


# -- planning (device, precision) from a synthetic profile ---------------------------------------

from placer.data.measures import PrecisionCheck  # noqa: E402
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint  # noqa: E402
from placer.site import costs_from_profile  # noqa: E402

SIZES = (100, 200, 400, 800)


def synthetic(checks: dict[str, list[PrecisionCheck]]) -> Profile:
    """``load`` (CPU) → ``train`` (matmul-bound: 4 GFLOP per item, 98 % tensor-core) → ``sums`` (the same
    work, a lower precision refused by its check)."""
    def pts(c):
        return [Point(size=n, median_s=c * n, iqr_s=0.0, reps=5, raw_times=[c * n] * 5, output_bytes=4e3 * n)
                for n in SIZES]

    def work(n):
        return Work(flops=4e9 * n, tensor_flops=3.92e9 * n, bytes=4e6 * n, tensor_bytes=2e6 * n, ops=50, calls=80)

    stages = {"load": StageProfile(name="load", key="a", device_classes=["cpu"],
                                   devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts(1e-5))})}
    for name in ("train", "sums"):
        stages[name] = StageProfile(name=name, key=name, kind="training", inputs=["load"],
                                    devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts(0.05))},
                                    work=[WorkPoint(size=n, work=work(n)) for n in SIZES],
                                    precision_checks=checks.get(name, []))
    stages["sums"].inputs = ["train"]
    return Profile(pipeline="demo", fingerprint="t", machine={"cpu_model": "Test CPU", "cores": 2},
                   devices={"cpu": {"kind": "cpu", "workers": 2, "label": "Test CPU"}}, stages=stages,
                   measured_sizes=list(SIZES), sizes=list(SIZES))


def check(p, err, slow=50.0):
    return PrecisionCheck(precision=p, metric="loss", rel_error=err, tolerance=0.01, method="test",
                          seconds=slow * 40.0, fp32_seconds=40.0, size=800)


@pytest.mark.slow
def test_the_plan_chooses_device_and_precision_and_says_both_numbers():
    prof = synthetic({"train": [check("tf32", 2e-5), check("bf16", 3e-3)],
                      "sums": [check("tf32", 1e-6), check("bf16", 0.04)]})
    costs = costs_from_profile(prof, size=800, describe="h200")
    plan = costs.plan(target=True, devices=["cpu", "gpu:0"])
    train = next(s for s in plan.stages if s.name == "train")
    sums = next(s for s in plan.stages if s.name == "sums")
    assert train.device == "gpu:0" and train.precision == "bf16" and plan.precision["train"] == "bf16"
    times = train.precision_s["gpu:0"]
    assert set(times) == {"fp32", "tf32", "bf16"}
    assert 3 <= times["fp32"] / times["bf16"] <= 14 and 2 <= times["fp32"] / times["tf32"] <= 7.5
    assert train.predicted_s["gpu:0"] == pytest.approx(times["bf16"])  # the search saw the bf16 time
    assert "bf16 on gpu:0:" in train.reason and "against" in train.reason and "in fp32" in train.reason
    assert "tensor-core FLOPs" in train.reason and "loss differs by 0.30%" in train.reason
    # the stage whose bf16 loss moved 4 % gets tf32, and the reason says why not bf16
    assert sums.precision == "tf32" and plan.precision["sums"] == "tf32"
    assert "bf16 not chosen: loss differs by 4.00% (tolerance 1.00%)" in sums.reason
    # the CPU keeps fp32: its bf16 was measured 50x slower, its tf32 changes nothing
    assert train.precision_s["cpu"]["bf16"] > train.precision_s["cpu"]["fp32"] == train.precision_s["cpu"]["tf32"]


def test_without_an_allowed_precision_the_table_and_plan_are_as_before_and_a_note_points_to_bf16():
    prof = synthetic({})
    costs = costs_from_profile(prof, size=800, describe="h200")
    table = costs.table(target=True)
    assert all(not st.precision and not st.precision_s for st in table.stages)
    plan = costs.plan(target=True, devices=["cpu", "gpu:0"])
    assert plan.precision == {} and all(s.precision == "fp32" for s in plan.stages)
    assert any("allow bf16 on 'train'" in n and "x on gpu:0" in n for n in plan.precision_notes)


@pytest.mark.slow
def test_a_fixed_precision_is_planned_as_it_is():
    prof = synthetic({})
    costs = costs_from_profile(prof, size=800, describe="h200")
    costs.target_model.fixed_precision = {"train": "tf32"}
    plan = costs.plan(target=True, devices=["cpu", "gpu:0"])
    train = next(s for s in plan.stages if s.name == "train")
    assert train.precision == "tf32" and "fixed by --precision" in train.reason


@pytest.mark.slow
def test_advise_facts_for_the_target_carry_times_checks_and_reasons():
    from placer.advisor import precision_facts
    from placer.data.report import TargetPlan

    prof = synthetic({"train": [check("tf32", 2e-5), check("bf16", 3e-3)], "sums": [check("bf16", 0.04)]})
    costs = costs_from_profile(prof, size=800, describe="h200")
    facts = precision_facts(costs.plan(target=True, devices=["cpu", "gpu:0"]), prof)
    assert facts["precision"] == {"train": "bf16"}
    assert set(facts["precision_s"]["train"]["gpu:0"]) == {"fp32", "tf32", "bf16"}
    assert [c["precision"] for c in facts["precision_checks"]["train"]] == ["tf32", "bf16"]
    assert "bf16 not chosen" in facts["precision_reasons"]["sums"]
    tp = TargetPlan(device="gpu:0", label="H200", placement={}, predicted_s=1.0, **facts)  # the report keeps them
    assert tp.precision == {"train": "bf16"} and tp.precision_checks["sums"][0]["rel_error"] == 0.04


def test_bf16_on_the_target_is_priced_with_the_bytes_counted_under_autocast():
    """A check that counted the stage under autocast sets the bytes, launches and host dispatches the
    roofline prices bf16 with; without counts the tensor-core bytes alone are halved."""
    from placer.costmodel import precision as pm

    def bytes_bound(ratio):
        c = check("bf16", 3e-3).model_copy(update={"bytes_ratio": ratio, "ops_ratio": 1.2, "calls_ratio": 1.1})
        prof = synthetic({"train": [c]})
        for wp in prof.stages["train"].work:  # memory-bound: a byte per FLOP
            wp.work = wp.work.model_copy(update={"bytes": wp.work.flops, "tensor_bytes": 0.3 * wp.work.flops})
        return costs_from_profile(prof, size=800, describe="h200").target_model

    counted, plain = bytes_bound(0.6), bytes_bound(None)
    work = counted.profile.stages["train"].work[-1].work
    low, host = pm.under(counted, "train", "bf16", work, 1.0)
    assert low.bytes == pytest.approx(0.6 * work.bytes) and low.tensor_bytes == 0
    assert low.ops == round(1.2 * work.ops) and host == pytest.approx(1.1)
    assert pm.under(counted, "train", "tf32", work, 1.0) == (work, 1.0)  # tf32: fp32 bytes
    assert pm.under(plain, "train", "bf16", work, 1.0) == (work, 1.0)  # not counted: as it is
    r_counted = counted.precision_ratio("train", "gpu:0", "bf16", 800)
    r_plain = plain.precision_ratio("train", "gpu:0", "bf16", 800)
    # memory-bound: 0.6 of the bytes against 1 - 0.3 / 2 = 0.85 when only the products' bytes halve
    assert r_counted < r_plain < 1
    assert r_counted == pytest.approx(0.6 / 0.85 * r_plain, rel=0.15)


def test_counted_at_two_sizes_autocast_difference_is_a_line_over_size():
    """Casts of the weights are a fixed cost, halved activations grow with the size: counted at two sizes,
    the bf16 bytes at a third come off the line through the two differences, not one ratio."""
    from placer.costmodel import precision as pm

    def counts(n):  # fp32: 1e8 fixed (weights) + 4e6 per item; bf16: weights 1.5e8 (casts) + half the rest
        return {"size": float(n), "bytes": 1e8 + 4e6 * n, "low_bytes": 1.5e8 + 2e6 * n, "ops": 50.0,
                "low_ops": 60.0, "calls": 80.0, "low_calls": 90.0}

    c = check("bf16", 3e-3).model_copy(update={"bytes_ratio": 1.0, "ops_ratio": 1.2, "calls_ratio": 1.1,
                                               "counted": [counts(100), counts(200)]})
    prof = synthetic({"train": [c]})
    model = costs_from_profile(prof, size=800, describe="h200").target_model
    w = Work(flops=1e9, bytes=1e8 + 4e6 * 800, ops=50, calls=80)
    low, host = pm.under(model, "train", "bf16", w, 1.0, 800)
    assert low.bytes == pytest.approx(1.5e8 + 2e6 * 800)  # the line, not the ratio 1.0 counted at 200
    assert low.ops == 60 and host == pytest.approx(90 / 80)
    one = c.model_copy(update={"counted": [counts(200)]})
    model1 = costs_from_profile(synthetic({"train": [one]}), size=800, describe="h200").target_model
    assert pm.under(model1, "train", "bf16", w, 1.0, 800)[0].bytes == pytest.approx(w.bytes * 1.0)  # one size: ratio
