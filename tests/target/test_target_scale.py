"""Scaling this machine's CPU times to a target's CPU: by the kind of work, not only its time.

A stage's time here is first made one core's work (by the threads its measurement
kept busy); serial work gets the per-core ratio, parallel work the ratio of the
calibration ops closest to it in seconds per op and bytes per op. Synthetic
calibrations only: nothing is timed.
"""

from __future__ import annotations

import math

import pytest

from placer.costmodel.model import CostModel
from placer.data.measures import Work
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint
from placer.target import CpuDescription, CpuScale, OpRow


def scale(rows: list[tuple[float, float, int | None, float | None]], cores: int = 2) -> CpuScale:
    """A scale from rows of (seconds here, ratio, ops, bytes), each measured at one thread."""
    here = CpuDescription(model="here", cores=cores, ops=[
        OpRow(op=f"op{i}", size=1, seconds=t, threads=1, threads_used=1.0, ops=n, bytes=b)
        for i, (t, _, n, b) in enumerate(rows)])
    there = CpuDescription(model="there", cores=16, ops=[
        OpRow(op=f"op{i}", size=1, seconds=t * r) for i, (t, r, _, _) in enumerate(rows)])
    return CpuScale.between(here, there)


#: dispatch-bound small ops (ratio 1.5) and large parallel ones (0.1): a 2-core machine and a 16-core one
SMALL_AND_LARGE = [(1e-5, 1.5, 1, 1e3), (2e-5, 1.5, 1, 2e3), (1e-2, 0.1, 1, 1e7), (2e-2, 0.1, 1, 2e7)]


def test_serial_work_gets_the_per_core_ratio_and_parallel_work_the_targets_cores():
    s = scale(SMALL_AND_LARGE)
    assert s.dispatch_ratio == pytest.approx(1.5)
    serial = s.ratio(1e-2, threads_used=1.0, threads=2, ops=1, bytes=1e7)
    parallel = s.ratio(1e-2, threads_used=2.0, threads=2, ops=1, bytes=1e7)
    half = s.ratio(1e-2, threads_used=1.5, threads=2, ops=1, bytes=1e7)
    assert serial == pytest.approx(1.5)
    # both cores busy for 10 ms wall: 20 ms of one core's work, at about 0.1 per core-second
    assert parallel == pytest.approx(2 * 0.1, rel=0.1)
    assert parallel < half < serial
    # measured at one thread, CPU time says nothing of the work's kind: scaled as it stands
    assert s.ratio(1e-2, threads_used=1.0, threads=1, ops=1, bytes=1e7) == pytest.approx(0.1, rel=0.1)


def test_many_small_ops_are_scaled_as_dispatch_bound_not_as_one_large_op():
    s = scale(SMALL_AND_LARGE)
    one_op = s.ratio(1e-2, ops=1, bytes=1e7)
    step = s.ratio(1e-2, ops=1000, bytes=1.5e6)  # 10 us and 1.5 kB per op: a loop of tiny calls
    assert one_op == pytest.approx(0.1, rel=0.1)
    assert step == pytest.approx(1.5, rel=0.1)


def test_bytes_per_op_tell_apart_ops_that_take_as_long():
    # two kinds of op at 1 ms each: a serial one on little data, a parallel one on a lot
    s = scale([(1e-3, 1.5, 1, 1e3), (1.2e-3, 1.5, 1, 1.2e3), (1e-3, 0.1, 1, 1e7), (1.2e-3, 0.1, 1, 1.2e7)])
    assert s.ratio(1.1e-3, ops=1, bytes=1.1e3) == pytest.approx(1.5, rel=0.05)
    assert s.ratio(1.1e-3, ops=1, bytes=1.1e7) == pytest.approx(0.1, rel=0.05)
    assert 0.1 < s.ratio(1.1e-3) < 1.5  # without counts: both kinds weigh in


def test_an_older_calibration_without_counted_work_scales_by_total_time():
    rows = [(t, r, None, None) for t, r, _, _ in SMALL_AND_LARGE]
    s = scale(rows)
    assert s.ratio(1e-2, ops=1000, bytes=1.5e6) == pytest.approx(s.ratio(1e-2))
    assert s.ratio(1e-2) == pytest.approx(0.1, rel=0.1)


def test_a_row_measured_at_every_thread_counts_as_the_work_of_the_threads_it_kept_busy():
    here = CpuDescription(model="here", cores=2, ops=[OpRow(op="a", size=1, seconds=1e-2, threads=2, threads_used=2.0)])
    there = CpuDescription(model="there", cores=16, ops=[OpRow(op="a", size=1, seconds=2e-3)])
    s = CpuScale.between(here, there)
    assert s.points[0].seconds == pytest.approx(2e-2)
    assert s.points[0].ratio == pytest.approx(0.1)
    assert s.seconds(1e-2, threads_used=2.0, threads=2) == pytest.approx(2e-3)


def test_the_widths_are_the_ones_that_predict_each_calibration_op_from_the_others():
    # two families interleaved in time, told apart only by bytes per op: a narrow bytes width wins
    rows = []
    for i in range(5):
        t = 1e-4 * 3**i
        rows += [(t, 1.5, 1, 1e3 * 3**i), (t * 1.1, 0.1, 1, 1e6 * 3**i)]
    s = scale(rows)
    wide = s.model_copy(update={"bytes_width": math.log(8.0)})
    assert s.bytes_width < math.log(8.0)
    assert s.loo_error() <= wide.loo_error()
    assert s.ratio(5e-4, ops=1, bytes=5e3) == pytest.approx(1.5, rel=0.1)
    assert s.ratio(5e-4, ops=1, bytes=5e6) == pytest.approx(0.1, rel=0.1)


def profile(cpu_s: float | None, *, stalled: bool = False, load: float | None = None) -> Profile:
    """One stage measured at 2 threads (10 ms per call at every size) with counted work."""
    sizes = (100, 200, 400, 800)
    pts = [Point(size=n, median_s=1e-2, iqr_s=0.0, reps=5, raw_times=[1e-2] * 5, cpu_s=cpu_s, stalled=stalled,
                 load=load) for n in sizes]
    st = StageProfile(name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)},
                      work=[WorkPoint(size=n, work=Work(flops=1e6 * n, bytes=1e5 * n, ops=1)) for n in sizes])
    return Profile(pipeline="demo", fingerprint="x", machine={"threads": 2, "cores": 2}, stages={"s": st},
                   devices={"cpu": {"kind": "cpu", "workers": 2, "label": "here"}})


def test_the_cost_model_scales_a_stage_by_the_threads_it_kept_busy_and_its_counted_work():
    s = scale(SMALL_AND_LARGE)
    kw = CostModel(profile(2e-2), cpu_scale=s).scale_inputs("s", "cpu", 100)
    assert kw == {"threads_used": pytest.approx(2.0), "threads": 2, "ops": 1, "bytes": pytest.approx(1e7)}
    parallel = CostModel(profile(2e-2), cpu_scale=s).predict("s", "cpu", 100)
    serial = CostModel(profile(1e-2), cpu_scale=s).predict("s", "cpu", 100)
    assert parallel.label == serial.label == "scaled"
    assert serial.value == pytest.approx(1.5e-2)
    assert parallel.value == pytest.approx(2e-3, rel=0.15)
    # a stalled point's CPU time says nothing of its threads, nor one measured while other work held a
    # core: then the time is one core's work
    assert "threads_used" not in CostModel(profile(1e-2, stalled=True), cpu_scale=s).scale_inputs("s", "cpu", 100)
    busy = CostModel(profile(1e-2, load=2.5), cpu_scale=s)
    assert "threads_used" not in busy.scale_inputs("s", "cpu", 100)
    assert busy.predict("s", "cpu", 100).value == pytest.approx(1e-2 * s.work_ratio(1e-2, ops=1, bytes=1e7))
    assert CostModel(profile(1e-2, load=1.2), cpu_scale=s).scale_inputs("s", "cpu", 100)["threads_used"] == 1.0


def test_a_described_gpus_host_time_is_one_threads_and_gets_the_per_core_ratio():
    s = scale(SMALL_AND_LARGE)
    cm = CostModel(profile(2e-2), cpu_scale=s)
    unscaled = CostModel(profile(2e-2))
    assert cm.host_seconds("s") == pytest.approx([1.5 * h for h in unscaled.host_seconds("s")])


def test_a_calibration_row_records_its_threads_and_counted_work():
    import torch

    from placer.target.calibrate import calibrate_cpu

    cpu = calibrate_cpu(rows=[("filter_rows", 1000)], budget_s=1.0)
    (row,) = cpu.ops
    assert row.ops is not None and row.ops >= 1 and row.bytes is not None and row.bytes > 0
    assert row.threads in {1, torch.get_num_threads()}
    assert 1.0 <= row.threads_used <= row.threads
