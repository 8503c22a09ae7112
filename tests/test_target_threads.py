"""A target's predictions do not depend on how many threads profiled the stage here.

Built from synthetic profiles (no timings): the same stage profiled with one intra-op
thread, and with two on a busy machine (wall time halved by the second core, one size's
repeats stalled for a core, the time outside torch ops read off by tens of microseconds
at one size), is predicted the same for the H200 within the 25 % of the issue's bar,
and planned the same.
"""

from __future__ import annotations

import pytest

from placer.costmodel.model import CostModel, fit_value, smoothed_outside
from placer.data.measures import Work
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint
from placer.site import costs_from_profile
from placer.target import CpuDescription, OpRow, load_target

H200 = load_target("h200")
SIZES = (1, 2, 4, 8, 16, 32)
#: one core's seconds of the CPU stage at size n: a fixed cost and a per-item cost
ONE_CORE = (2e-4, 5e-5)
AGREE = 0.25


def _calibration() -> dict:
    rows = [OpRow(op=r.op, size=r.size, seconds=2 * r.seconds, ops=r.ops, bytes=r.bytes) for r in H200.cpu.ops]
    return CpuDescription(model="Test CPU", cores=2, ops=rows, dispatch_s=2 * H200.cpu.dispatch_s).model_dump(mode="json")


def _point(n: int, wall: float, cpu: float, *, stalled: bool = False) -> Point:
    raw = [wall] * 5
    if stalled:  # four of five repeats waited ~40 ms for a core
        raw = [wall] + [wall + 0.04] * 4
    med = sorted(raw)[2]
    return Point(size=n, median_s=med, iqr_s=0.0, reps=5, raw_times=raw, cpu_s=cpu, stalled=stalled)


def _profile(threads: int) -> Profile:
    """The stage ``infer`` (CPU or GPU) after ``load`` (CPU only), profiled at ``threads`` threads."""
    pts, load_pts, work = [], [], []
    for n in SIZES:
        one = ONE_CORE[0] + ONE_CORE[1] * n
        if threads == 1:
            pts.append(_point(n, one, one))
        else:  # the second core halves the wall time of the per-item part; size 8 stalled
            wall = ONE_CORE[0] + ONE_CORE[1] * n / 2
            pts.append(_point(n, wall, one, stalled=n == 8))
        load_pts.append(_point(n, 1e-4 * n, 1e-4 * n))
        outside = 20e-6
        if threads == 2:  # a busy machine's reading: nothing at one size, too much at another
            outside = {4: 0.0, 16: 60e-6}.get(n, outside)
        work.append(WorkPoint(size=n, work=Work(flops=1e5 * n, bytes=4e3 * n, ops=8, outside_s=outside)))
    stages = {
        "load": StageProfile(name="load", key="l", device_classes=["cpu"],
                             devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=load_pts)}),
        "infer": StageProfile(name="infer", key="i", inputs=["load"], device_classes=["cpu", "gpu"],
                              devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)}, work=work),
    }
    machine = {"cpu_model": "Test CPU", "cores": 2, "threads": threads, "machine": "x86_64", "torch": "test",
               "cpu_calibration": _calibration()}
    return Profile(pipeline="p", fingerprint="test", machine=machine,
                   devices={"cpu": {"kind": "cpu", "workers": 2, "label": "Test CPU"}}, stages=stages,
                   measured_sizes=list(SIZES), sizes=list(SIZES))


def _h200(threads: int):
    costs = costs_from_profile(_profile(threads), size=32, describe="h200")
    return costs, costs.target_model


def test_one_and_two_thread_profiles_give_the_same_h200_predictions_and_plan():
    (c1, m1), (c2, m2) = _h200(1), _h200(2)
    for stage, device in (("infer", "gpu:0"), ("infer", "cpu"), ("load", "cpu")):
        for n in (8, 32):
            one, two = m1.predict(stage, device, n).value, m2.predict(stage, device, n).value
            assert two == pytest.approx(one, rel=AGREE), (stage, device, n, one, two)
    assert c1.plan(target=True).placement == c2.plan(target=True).placement


def test_the_host_time_does_not_follow_one_noisy_reading():
    two = _profile(2)
    host = CostModel(two, dispatch_s=1e-6).host_seconds("infer")
    assert host == pytest.approx([8e-6 + 20e-6] * len(SIZES), rel=1e-9)
    # without the check, the readings themselves would have moved the host time by 3x
    assert [w.work.outside_s for w in two.stages["infer"].work].count(20e-6) == len(SIZES) - 2


def test_a_time_outside_ops_that_grows_with_the_size_is_kept():
    work = [WorkPoint(size=n, work=Work(ops=3, outside_s=1e-6 * n)) for n in SIZES]
    assert smoothed_outside(work) == pytest.approx([1e-6 * n for n in SIZES], rel=1e-9)


def test_a_stalled_point_is_its_least_repeat():
    p = _point(8, 1e-3, 1e-3, stalled=True)
    assert p.median_s > 0.04 and fit_value(p) == pytest.approx(1e-3)


def test_noisy_host_readings_widen_the_targets_noise_so_a_flip_within_it_is_a_tie():
    quiet, noisy = _profile(1), _profile(2)
    for sp in (quiet.stages["infer"], noisy.stages["infer"]):  # the same CPU times: only the readings differ
        sp.devices = _profile(1).stages["infer"].devices
    q = costs_from_profile(quiet, size=32, describe="h200").target_model
    n = costs_from_profile(noisy, size=32, describe="h200").target_model
    assert q.host_noise(["gpu:0"]) == 0.0 and n.host_noise(["gpu:0"]) > 0.0
    assert n.noise(["cpu", "gpu:0"]) >= min(n.host_noise(["gpu:0"]), 0.25)
    assert n.noise(["cpu"]) == q.noise(["cpu"])  # a CPU-only table is not widened
