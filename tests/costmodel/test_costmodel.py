"""Cost model: size fits recover known parameters, transfers, roofline, predictions and tables."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from placer.costmodel import Work, fit_link, fit_size_model, load_description
from placer.costmodel.bus import TransferModel
from placer.costmodel.model import CostModel, CostModelError
from placer.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint

SIZES = np.array([100, 200, 400, 800, 1600, 3200], dtype=float)
REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "reference" / "h200-calibration.json"


# -- fits ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, c",
    [(2e-8, 1.3, 3e-5), (5e-9, 1.5, 0.0), (1e-7, 1.0, 1e-4), (4e-6, 0.5, 2e-3)],
)
def test_fit_recovers_known_parameters(a, b, c):
    y = a * SIZES**b + c
    fit = fit_size_model(SIZES, y)
    assert fit.valid
    assert fit.loo_error < 1e-3
    # whatever form wins, it must describe the same curve, also well outside the data
    for n in (50.0, 1000.0, 32000.0):
        assert fit(n) == pytest.approx(a * n**b + c, rel=0.02)
    if fit.form == "power+c":
        assert fit.b == pytest.approx(b, rel=0.02)
        assert fit.c == pytest.approx(c, rel=0.05, abs=1e-7)


def test_fit_with_noise_stays_close_and_reports_its_error():
    rng = np.random.default_rng(1)
    true = 2e-4 + 1e-7 * SIZES
    fit = fit_size_model(SIZES, true * (1 + 0.03 * rng.standard_normal(len(SIZES))))
    assert 0.005 < fit.loo_error < 0.2
    p = fit.predict(32000)
    assert p.value == pytest.approx(2e-4 + 1e-7 * 32000, rel=0.15)
    assert p.rel_error > fit.loo_error  # extrapolating a decade grows the error
    assert p.extrapolation == pytest.approx(10.0)
    assert not p.far_outside
    assert fit.predict(3.2e6).far_outside


def test_fixed_overhead_is_kept_for_small_inputs():
    y = 5e-3 + 1e-8 * SIZES  # overhead dominates
    fit = fit_size_model(SIZES, y)
    assert fit(1.0) == pytest.approx(5e-3, rel=0.02)


def test_few_points_are_marked_invalid():
    one = fit_size_model([100], [1e-3])
    # one size: exact there, part of it fixed cost, so 10x the size is under 10x the time
    assert not one.valid and one(100) == pytest.approx(1e-3)
    assert 1e-3 < one(1000) < 1e-2 and one.c > 0 and one.loo_error >= 1.0
    two = fit_size_model([100, 200], [1e-3, 2e-3])
    assert not two.valid and two(400) == pytest.approx(4e-3, rel=1e-3)


def test_one_point_fit_does_not_scale_the_fixed_cost_with_size():
    # batch 1 costs 1 ms, almost all of it fixed; batch 16 costs 1.5 ms
    one = fit_size_model([1], [1e-3])
    assert one(16) < 16e-3 / 1.8  # a line through the origin would say 16 ms
    two = fit_size_model([1, 2], [1.0e-3, 1.03e-3])
    assert two.form == "linear" and two(16) == pytest.approx(1.0e-3 + 15 * 0.03e-3, rel=1e-3)


def test_two_points_that_grow_faster_than_the_size_fit_a_power():
    two = fit_size_model([100, 200], [1e-3, 4e-3])
    assert two.form == "power" and two(400) == pytest.approx(16e-3, rel=1e-2)


@pytest.mark.parametrize("sizes, values", [([], []), ([1, 2], [1.0]), ([0, 1, 2], [1.0, 1.0, 1.0]),
                                           ([1, 2, 3], [1.0, float("nan"), 1.0])])
def test_fit_rejects_bad_points(sizes, values):
    with pytest.raises(ValueError):
        fit_size_model(sizes, values)


# -- transfers -------------------------------------------------------------------------------
def test_link_fit_recovers_latency_and_bandwidth():
    nb = np.array([4e3, 6.4e4, 1e6, 1.6e7, 2.6e8])
    link = fit_link(nb, 2e-5 + nb / 5e10)
    assert link.latency_s == pytest.approx(2e-5, rel=0.01)
    assert link.bandwidth_Bps == pytest.approx(5e10, rel=0.01)
    assert link.seconds(1e9) == pytest.approx(2e-5 + 1e9 / 5e10, rel=0.01)


def test_transfer_model_follows_the_executor_pinning_large_copies():
    fast = fit_link([1e5, 1e6, 1e7, 1e8], [1e-5 + b / 5e10 for b in (1e5, 1e6, 1e7, 1e8)])
    slow = fit_link([1e5, 1e6, 1e7, 1e8], [2e-5 + b / 5e9 for b in (1e5, 1e6, 1e7, 1e8)])
    tm = TransferModel(device="gpu:0", links={"h2d": {"staged": fast, "fresh": slow}, "d2h": {"fresh": slow}})
    big, small = 1 << 26, 1 << 16
    assert tm.predict(big, "h2d").value == pytest.approx(fast.seconds(big))
    assert tm.predict(small, "h2d").value == pytest.approx(slow.seconds(small))
    assert tm.predict(big, "d2h").value == pytest.approx(slow.seconds(big))


# -- the H200 description --------------------------------------------------------------------
def _within_2x(pred: float, meas: float) -> bool:
    return abs(math.log(pred / meas)) <= math.log(2)


def test_h200_description_reproduces_its_matmul_figures():
    h200 = load_description("h200")
    mm = [c for c in h200.calibration if c.op.startswith("matmul4096")]
    assert {c.work.precision for c in mm} == {"fp32", "tf32", "bf16"}
    for c in mm:
        assert _within_2x(h200.predict(c.work), c.measured_s), c.op


def test_h200_description_reproduces_its_transfer_figures():
    tm = load_description("h200").transfer
    for direction in ("h2d", "d2h"):
        for mode in ("pinned", "pageable", "fresh"):
            for nb, secs in tm.links[direction][mode].points:
                assert _within_2x(tm.links[direction][mode].seconds(nb), secs), (direction, mode, nb)


def test_h200_description_fits_most_reference_ops():
    h200 = load_description("h200")
    share = np.mean([_within_2x(h200.predict(c.work), c.measured_s) for c in h200.calibration])
    assert share >= 0.75


@pytest.mark.skipif(not REFERENCE.exists(), reason=f"reference measurements not found at {REFERENCE}")
def test_h200_description_against_the_reference_file():
    ref = json.loads(REFERENCE.read_text())
    h200 = load_description("h200")
    for r in ref["ops"]:
        if r["op"].startswith("matmul4096") and r["device"] == "cuda":
            prec = r["op"].rsplit("_", 1)[1]
            elt = 2 if prec == "bf16" else 4
            w = Work(flops=2 * 4096.0**3, bytes=3 * 4096.0**2 * elt, precision=prec)
            assert _within_2x(h200.predict(w), r["seconds"]), r["op"]
    mode = {True: "pinned", False: "pageable", "numpy": "fresh"}
    for r in ref["transfer"]:
        for d in ("h2d", "d2h"):
            assert _within_2x(h200.transfer.links[d][mode[r["pinned"]]].seconds(r["bytes"]), r[f"{d}_s"])


def test_h200_pinned_transfers_beat_fresh_device_to_host_copies():
    tm = load_description("h200").transfer
    gb = 1 << 30
    assert tm.links["h2d"]["pinned"].seconds(gb) * 5 < tm.links["d2h"]["fresh"].seconds(gb)


def test_unknown_description_names_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="h200"):
        load_description("tpu9000")


# -- the cost model --------------------------------------------------------------------------
def _profile(cpu_s, work=None, extra=None) -> Profile:
    pts = [Point(size=int(n), median_s=cpu_s(n), iqr_s=0.01 * cpu_s(n), reps=5, raw_times=[cpu_s(n)],
                 first_call_s=cpu_s(n) + 0.1, output_bytes=64.0 * n, peak_host_bytes=128.0 * n)
           for n in SIZES]
    sp = StageProfile(name="work", kind="preprocessing", key="k",
                      devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)},
                      work=[WorkPoint(size=int(n), work=work(n)) for n in SIZES] if work else [])
    stages = {"work": sp, **(extra or {})}
    return Profile(pipeline="synthetic", fingerprint="f", stages=stages,
                   devices={"cpu": {"kind": "cpu", "workers": 2, "label": "test cpu"}})


def test_measured_sizes_report_the_measurement_and_others_the_fit():
    cm = CostModel(_profile(lambda n: 1e-4 + 1e-7 * n))
    at = cm.predict("work", "cpu", 400)
    assert at.label == "measured" and at.value == pytest.approx(1e-4 + 4e-5)
    far = cm.predict("work", "cpu", 32000)
    assert far.label == "predicted" and far.value == pytest.approx(1e-4 + 3.2e-3, rel=1e-3)
    assert cm.first_call_s("work", "cpu") == pytest.approx(0.1)
    assert cm.output_bytes("work", 10000) == pytest.approx(640000, rel=1e-3)


def test_cpu_wins_small_inputs_and_the_described_gpu_wins_large_ones():
    # an elementwise stage: a few ops over 64 bytes a row, plus the CPU's dispatch cost
    prof = _profile(lambda n: 2e-5 + 5e-8 * n, work=lambda n: Work(flops=16 * n, bytes=128 * n, ops=4))
    cm = CostModel(prof, describe=["h200"])
    assert cm.label("work", "gpu:0") == "roofline"
    small, large = 100, 10_000_000
    assert cm.predict("work", "cpu", small).value < cm.predict("work", "gpu:0", small).value
    assert cm.predict("work", "cpu", large).value > cm.predict("work", "gpu:0", large).value
    assert cm.predict("work", "gpu:0", large).label == "roofline"


def test_table_has_the_optimizer_shape():
    prof = _profile(lambda n: 1e-4 + 1e-7 * n, work=lambda n: Work(flops=n, bytes=64 * n, ops=2))
    prof.stages["later"] = prof.stages["work"].model_copy(update={"name": "later", "inputs": ["work"]})
    cm = CostModel(prof, describe=["h200"])
    table = cm.table(50_000)
    doc = table if isinstance(table, dict) else table.model_dump()
    assert set(doc["devices"]) == {"cpu", "gpu:0"}
    assert doc["devices"]["gpu:0"]["kind"] == "gpu"
    later = next(s for s in doc["stages"] if s["name"] == "later")
    assert later["inputs"] == ["work"]
    assert later["seconds"]["cpu"] == pytest.approx(1e-4 + 5e-3, rel=1e-3)
    assert later["output_bytes"] == pytest.approx(64 * 50_000, rel=1e-3)
    assert doc["link"]["h2d"]["bandwidth_Bps"] > 1e10
    cpu_only = cm.table(50_000, devices=["cpu"])
    doc = cpu_only if isinstance(cpu_only, dict) else cpu_only.model_dump()
    assert set(doc["devices"]) == {"cpu"}


def test_unknown_stage_or_device_is_named():
    cm = CostModel(_profile(lambda n: 1e-4 + 1e-7 * n))
    with pytest.raises(CostModelError, match="'nope'"):
        cm.predict("nope", "cpu", 10)
    with pytest.raises(CostModelError, match="gpu:3"):
        cm.predict("work", "gpu:3", 10)


def test_planning_from_a_saved_profile_does_not_import_torch(tmp_path):
    import subprocess

    path = tmp_path / "p.json"
    _profile(lambda n: 1e-4 + 1e-7 * n, work=lambda n: Work(flops=n, bytes=64 * n)).save(path)
    code = ("import sys; from placer.profile import Profile; from placer.costmodel.model import CostModel; "
            f"cm = CostModel(Profile.load({str(path)!r}), describe=['h200']); cm.table(1000); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_count_work_sees_matrix_products():
    torch = pytest.importorskip("torch")
    from placer.costmodel.counts import count_work

    a, w = torch.randn(64, 128), torch.randn(128, 32)
    _, work = count_work(lambda: torch.relu(a @ w))
    assert work.flops >= 2 * 64 * 128 * 32
    assert work.bytes >= (64 * 128 + 128 * 32 + 64 * 32) * 4
    assert work.ops == 2
