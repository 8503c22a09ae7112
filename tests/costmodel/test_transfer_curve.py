"""Copies priced by size: one copy-kind rule for the executor, the transfer model and the simulator.

The H200 description's link is checked against the reference rows it was derived
from (``h200-calibration.json``, shipped with the description as its points): at every
size the reference measured, the way the executor copies is priced within 1.5x of
what the reference measured for that way of copying.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.costmodel.roofline import load_description
from placer.data.cost_table import CostTable
from placer.data.measures import PIN_THRESHOLD, Link, TransferModel, copy_mode, curve_seconds
from placer.devices import CopyState
from placer.optimize.simulate import simulate

REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks/reference/h200-calibration.json"


def reference_rows() -> list[dict]:
    if not REFERENCE.exists():
        pytest.skip("the H200 reference measurements are not on this machine")
    return json.loads(REFERENCE.read_text())["transfer"]


def executor_row_key(direction: str, nbytes: int):
    """The reference's ``pinned`` field for the way the executor copies ``nbytes``."""
    mode = copy_mode(direction, nbytes)
    return {"fresh": "numpy", "staged": True, "pinned": True, "pageable": False}[mode]


def test_the_rule_stages_large_host_to_device_copies_only():
    assert copy_mode("h2d", PIN_THRESHOLD - 1) == "fresh"
    assert copy_mode("h2d", PIN_THRESHOLD) == "staged"
    assert copy_mode("h2d", 1 << 30, pin=False) == "fresh"
    assert copy_mode("d2h", 1 << 30) == "fresh"
    assert copy_mode("h2d", 10, threshold=8) == "staged"


def test_a_copy_state_stages_by_the_rule_it_is_given_and_never_without_pin():
    rule = lambda nb: copy_mode("h2d", nb) == "staged"  # noqa: E731
    assert CopyState(None, True, stage=rule).stage(PIN_THRESHOLD)
    assert not CopyState(None, True, stage=rule).stage(PIN_THRESHOLD - 1)
    assert not CopyState(None, False, stage=rule).stage(1 << 30)
    assert not CopyState().stage(1 << 30)


def test_the_executor_passes_the_rule_to_the_device_kind(monkeypatch):
    """``to_location`` hands the kind a copy state whose rule is :func:`copy_mode`."""
    import numpy as np

    from placer.devices import Device
    from placer.devices import kinds as registered
    from placer.executor.transfer import to_location

    seen = []
    kind = registered()["sim"]

    def copy_in(leaf, device, state):
        seen.append((leaf.nbytes, state.stage(leaf.nbytes)))
        return leaf.copy()

    monkeypatch.setattr(kind, "copy_in", copy_in)
    dev = Device(name="gpu-sim", kind="sim", label="simulated")
    to_location([np.zeros(16, np.uint8), np.zeros(PIN_THRESHOLD, np.uint8)], dev)
    to_location(np.zeros(PIN_THRESHOLD, np.uint8), dev, pin=False)
    assert seen == [(16, False), (PIN_THRESHOLD, True), (PIN_THRESHOLD, False)]


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_the_h200_link_prices_every_reference_size_within_1_5x(direction):
    tm = load_description("h200").transfer
    rows = reference_rows()
    checked = 0
    for r in rows:
        if r["pinned"] != executor_row_key(direction, r["bytes"]):
            continue
        predicted = tm.predict(r["bytes"], direction).value
        measured = r[f"{direction}_s"]
        assert 1 / 1.5 <= predicted / measured <= 1.5, (direction, r["bytes"], predicted, measured)
        checked += 1
    assert checked == len({r["bytes"] for r in rows})


def test_a_4mb_copy_back_is_priced_near_the_reference_not_at_the_large_fresh_bandwidth():
    """Reference: 1 MiB fresh d2h 0.135 ms, 16 MiB 1.43 ms; 256 MiB fresh runs at 1.3 GB/s."""
    from placer.costmodel.model import CostModel
    from placer.data.profile import DeviceProfile, Point, Profile, StageProfile, WorkPoint
    from placer.data.measures import Work

    pts = [Point(size=n, median_s=1e-4 * n, iqr_s=0.0, reps=5, raw_times=[1e-4 * n], output_bytes=4e6 * n)
           for n in (1, 2, 4)]
    sp = StageProfile(name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)},
                      work=[WorkPoint(size=n, work=Work(flops=1e6 * n, bytes=4e6 * n)) for n in (1, 2, 4)])
    prof = Profile(pipeline="demo", fingerprint="x", devices={"cpu": {"kind": "cpu", "workers": 2}},
                   stages={"s": sp})
    table = CostModel(prof, describe=["h200"]).table(1)
    d2h = table.link.d2h.seconds(4e6)
    assert 2e-4 < d2h < 6e-4, d2h  # ~0.4 ms, not 4e6 / 1.3e9 = 3 ms
    sched = simulate(table, {"s": "gpu:0"})
    copy_back = [t for t in sched.transfers if t.dst == "host"]
    assert copy_back and copy_back[0].seconds == pytest.approx(d2h)


def test_small_host_to_device_copies_are_priced_as_the_pageable_copies_the_executor_makes():
    tm = load_description("h200").transfer
    link = CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}}, "link": tm.table_link(),
        "stages": [{"name": "a", "seconds": {"cpu": 1.0}}]}).link
    fresh = {r["bytes"]: r["h2d_s"] for r in reference_rows() if r["pinned"] == "numpy"}
    pinned = {r["bytes"]: r["h2d_s"] for r in reference_rows() if r["pinned"] is True}
    at = 65536
    assert link.h2d.seconds(at) == pytest.approx(fresh[at], rel=0.2)
    assert link.h2d.seconds(at) > 1.8 * pinned[at]
    # at and above the threshold: staged through pinned memory
    assert link.h2d.seconds(16 << 20) == pytest.approx(pinned[16 << 20], rel=0.2)


def test_a_curve_interpolates_in_log_log_and_extends_by_bandwidth():
    pts = [(1e3, 1e-5), (1e6, 1e-4), (1e9, 1e-1)]
    assert curve_seconds(pts, 1e6, 0.0, 1e10) == pytest.approx(1e-4)
    assert curve_seconds(pts, 1e4, 0.0, 1e10) == pytest.approx(10 ** -4.666666, rel=1e-3)
    assert curve_seconds(pts, 2e9, 0.0, 1e10) == pytest.approx(0.2, rel=1e-3)
    assert curve_seconds(pts, 0, 0.0, 1e10) == 0.0
    assert curve_seconds([], 1e9, 1e-5, 1e9) == pytest.approx(1.0 + 1e-5)


def test_a_hand_written_link_without_points_keeps_its_line():
    t = CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}},
        "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 1e9}, "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 1e9}},
        "stages": [{"name": "a", "seconds": {"cpu": 1.0}}]})
    assert t.link.h2d.seconds(1e9) == pytest.approx(1.0 + 1e-5)


def test_a_link_point_that_is_not_positive_is_refused_naming_the_field():
    from placer.errors import CostTableError

    doc = {"devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}},
           "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 1e9, "points": [[4096, 0.0]]},
                    "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 1e9}},
           "stages": [{"name": "a", "seconds": {"cpu": 1.0}}]}
    with pytest.raises(CostTableError, match="link.h2d.points"):
        CostTable.from_json(json.dumps(doc))


def test_a_measured_model_without_a_staged_link_falls_back_to_pinned():
    links = {"h2d": {"fresh": Link(latency_s=2e-5, bandwidth_Bps=1e10, points=[(4096, 2e-5), (1 << 20, 1.2e-4)]),
                     "pinned": Link(latency_s=1e-5, bandwidth_Bps=5e10, points=[(4096, 1e-5), (1 << 24, 3.3e-4)])},
             "d2h": {"fresh": Link(latency_s=2e-5, bandwidth_Bps=1e10)}}
    tm = TransferModel(device="gpu:0", links=links)
    assert tm.link_for("h2d", 1 << 24) is tm.links["h2d"]["pinned"]
    assert tm.link_for("h2d", 1 << 10) is tm.links["h2d"]["fresh"]
    assert tm.link_for("h2d", 1 << 24, pin=False) is tm.links["h2d"]["fresh"]


def test_a_size_measured_twice_in_one_way_prices_finite_and_validates(monkeypatch):
    """On a CUDA GPU the executor's small host→device copies and a plain ``.to(device)`` are
    both ``fresh``: measured at the same sizes, they once made the curve divide by zero
    beyond its largest point (an infinite price, and every cost table failed to build).
    Each way of copying is measured once per size, and a curve given a size twice prices
    it by the median."""
    import math

    import numpy as np

    from placer.devices import Device
    from placer.devices import kinds as registered
    from placer.profile.transfers import measure_transfers

    kind = registered()["sim"]
    monkeypatch.setattr(kind, "extra_copies", lambda device, host, on_dev: [
        ("h2d", "fresh", lambda: host.copy()), ("h2d", "pinned", lambda: host.copy())], raising=False)
    dev = Device(name="gpu-sim", kind="sim", label="simulated")
    tm = measure_transfers(dev, budget_s=2.0, sizes=(4 << 10, 64 << 10, 256 << 10))
    for direction, modes in tm.links.items():
        for mode, link in modes.items():
            sizes = [nb for nb, _ in link.points]
            assert len(sizes) == len(set(sizes)), (direction, mode, link.points)
    assert "pinned" in tm.links["h2d"]
    twice = [(4e3, 1e-5), (6.4e4, 2e-5), (6.4e4, 4e-5)]
    assert math.isfinite(curve_seconds(twice, 1e6, 1e-5, 1e10))
    assert curve_seconds(twice, 6.4e4, 1e-5, 1e10) == pytest.approx(3e-5)
    table = CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu"}, "gpu": {"kind": "gpu"}}, "link": tm.table_link(),
        "stages": [{"name": "a", "seconds": {"cpu": 1.0}}]})
    assert np.isfinite(table.link.h2d.seconds(1 << 30))
