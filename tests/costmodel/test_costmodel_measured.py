"""Cost model decisions drawn from measurements: busy-machine noise, loop-carried work,
declarations carried into the table, and planning that survives infeasible sizes."""

from __future__ import annotations

import numpy as np
import pytest

from placer.costmodel import Work, fit_link
from placer.costmodel.bus import TransferModel
from placer.costmodel.model import CostModel, fit_value
from placer.optimize import plan
from placer.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint

SIZES = [100, 200, 400, 800, 1600, 3200]


def _points(secs, spike=None):
    out = []
    for n in SIZES:
        t = secs(n)
        raw = [t, t * 1.01, t * 1.02, t * 1.01, t]
        if spike and n in spike:
            raw = [t * 40, t * 30, t * 1.01, t, t * 50]  # another process took the core
        out.append(Point(size=n, median_s=float(np.median(raw)), iqr_s=0.0, reps=len(raw), raw_times=raw,
                         output_bytes=8.0 * n))
    return out


def _profile(stages: dict[str, dict[str, list[Point]]], **extra) -> Profile:
    sps = {}
    prev = []
    for name, devs in stages.items():
        sps[name] = StageProfile(
            name=name, kind="preprocessing", key=name, inputs=prev,
            devices={d: DeviceProfile(device=d, kind="cpu" if d == "cpu" else "sim", points=pts)
                     for d, pts in devs.items()},
            **extra.get(name, {}))
        prev = [name]
    devices = {"cpu": {"kind": "cpu", "workers": 1, "label": "cpu"}}
    transfer = {}
    if any(d != "cpu" for devs in stages.values() for d in devs):
        devices["gpu-sim"] = {"kind": "sim", "label": "simulated test device"}
        nb = [1e4, 1e5, 1e6, 1e7]
        link = fit_link(nb, [1e-5 + b / 1e10 for b in nb])
        transfer["gpu-sim"] = TransferModel(device="gpu-sim", links={"h2d": {"fresh": link}, "d2h": {"fresh": link}})
    return Profile(pipeline="t", fingerprint="f", stages=sps, devices=devices, transfer=transfer)


def test_fit_uses_the_lower_quartile_so_a_busy_machine_does_not_inflate_predictions():
    lin = lambda n: 1e-4 + 1e-7 * n  # noqa: E731
    pts = _points(lin, spike={400, 3200})
    assert pts[2].median_s > 20 * lin(400)  # the median is ruined at two sizes
    assert fit_value(pts[2]) < 1.05 * lin(400)
    cm = CostModel(_profile({"s": {"cpu": pts}}))
    pred = cm.predict("s", "cpu", 32_000).value
    assert pred == pytest.approx(lin(32_000), rel=0.1)


def test_a_busy_machines_reading_at_a_measured_size_is_predicted_from_its_lower_quartile():
    """The profiler's note for a noisy point says it was fitted to the lower quartile; a prediction at
    exactly that size does the same, and a quiet point's stays its median."""
    lin = lambda n: 1e-4 + 1e-7 * n  # noqa: E731
    pts = _points(lin, spike={400})
    pts[2] = pts[2].model_copy(update={"noisy": True})
    cm = CostModel(_profile({"s": {"cpu": pts}}))
    busy = cm.predict("s", "cpu", 400)
    assert busy.label == "measured"
    assert busy.value == pytest.approx(fit_value(pts[2]))
    assert busy.value < 1.05 * lin(400) < pts[2].median_s / 20
    quiet = cm.predict("s", "cpu", 800)
    assert quiet.value == pytest.approx(pts[3].median_s)
    assert quiet.value != pytest.approx(fit_value(pts[3]), rel=1e-6)  # the two differ: the median was taken


def test_loop_carried_is_inferred_when_the_accelerator_never_catches_up():
    cpu = _points(lambda n: 1e-6 * n)
    seq = _points(lambda n: 7e-6 * n)  # 7x slower at every size: sequential
    par = _points(lambda n: 2e-3 + 1e-8 * n)  # slower when small, catching up with size
    cm = CostModel(_profile({"seq": {"cpu": cpu, "gpu-sim": seq}, "par": {"cpu": cpu, "gpu-sim": par}}))
    assert cm.loop_carried("seq") is True
    assert cm.loop_carried("par") is False
    table = cm.table(3200)
    flags = {st.name: st.loop_carried for st in table.stages}
    assert flags == {"seq": True, "par": False}


def _work(n):
    return Work(flops=64.0 * n, bytes=128.0 * n, ops=4)


def test_a_cpu_only_stage_gets_no_described_gpu_time_and_pins_reach_the_table():
    cpu = _points(lambda n: 1e-6 * n)
    wp = [WorkPoint(size=n, work=_work(n)) for n in SIZES]
    prof = _profile({"load": {"cpu": cpu}, "crunch": {"cpu": cpu}, "pinned": {"cpu": cpu}},
                    load={"work": wp, "device_classes": ["cpu"]},
                    crunch={"work": wp},
                    pinned={"work": wp, "pin": "cpu"})
    table = CostModel(prof, describe=["h200"]).table(3200)
    by = {st.name: st for st in table.stages}
    assert set(by["load"].seconds) == {"cpu"}
    assert set(by["crunch"].seconds) == {"cpu", "gpu:0"}
    assert by["pinned"].pin == "cpu" and by["crunch"].pin is None
    p = plan(table)
    assert p.placement["load"] == "cpu" and p.placement["pinned"] == "cpu"


def test_crossover_search_stops_at_sizes_where_no_plan_is_feasible():
    cm = CostModel(_profile({"a": {"cpu": _points(lambda n: 1e-6 * n), "gpu-sim": _points(lambda n: 1e-3 + 1e-8 * n)}}))

    def cost_at(size):
        if size > 10_000:
            raise ValueError("no device can run stage 'a' (needs more memory than any device has)")
        return cm.table(size)

    p = plan(cm.table(3200), cost_at=cost_at, size=3200)
    assert set(p.placement) == {"a"}
    c = p.stages[0].crossover_size
    assert c is None or c <= 10_000


def _picky_build(size=None):
    from placer import Pipeline

    n = int(size or 100)
    if n < 40:
        raise ValueError(f"size must be at least 40, got {n}")
    p = Pipeline("picky", size=n)
    p.add(name="make", cpu=lambda n: np.arange(float(n)), params={"n": n}, inputs=[])
    p.add(name="double", cpu=lambda x: 2 * x, inputs={"x": "make"})
    return p


@pytest.mark.slow
def test_profiler_measures_the_requested_size_when_no_smaller_size_builds():
    from placer.profile import profile

    prof = profile(_picky_build, size=50, max_size=10, budget_s=2.0, cache=False, progress=False)
    assert prof.measured_sizes == [50] or 50 in prof.measured_sizes
    assert any("profiled at 50 itself" in n for n in prof.notes)
    with pytest.raises(ValueError, match="at least 40"):  # the build's own error, unchanged
        profile(_picky_build, size=20, budget_s=2.0, cache=False, progress=False)
