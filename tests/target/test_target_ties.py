"""Placements predicted within the noise of each other are ties, decided by fewer copies, then the CPU."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from placer.cli import app
from placer.data.cost_table import CostTable
from placer.optimize import plan


def table(gpu_s: float, *, noise: float | None = 0.1, out_bytes: float = 1e6) -> CostTable:
    """load (CPU only) -> work (CPU 1.0 s or GPU ``gpu_s``): the GPU needs two copies."""
    return CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu:0": {"kind": "gpu"}},
        "link": {"h2d": {"latency_s": 1e-3, "bandwidth_Bps": 1e10}, "d2h": {"latency_s": 1e-3, "bandwidth_Bps": 1e10}},
        "noise": noise,
        "stages": [{"name": "load", "output_bytes": out_bytes, "seconds": {"cpu": 0.1}},
                   {"name": "work", "inputs": ["load"], "output_bytes": out_bytes,
                    "seconds": {"cpu": 1.0, "gpu:0": gpu_s}}]})


def test_a_gpu_within_the_noise_ties_and_the_cpu_wins_on_copies():
    p = plan(table(0.95))
    assert p.placement["work"] == "cpu"
    assert [t.differs for t in p.ties] == [{"work": "gpu:0"}]
    tie = p.ties[0]
    assert tie.predicted_makespan_s < p.predicted_makespan_s  # the GPU is faster, but only within the noise
    assert tie.copies > 0 and p.noise == 0.1
    work = next(s for s in p.stages if s.name == "work")
    assert "a tie with gpu:0" in work.reason and "fewer copies" in work.reason


def test_a_clear_win_is_not_a_tie():
    p = plan(table(0.5))
    assert p.placement["work"] == "gpu:0" and p.ties == []


def test_a_table_without_noise_has_no_ties():
    p = plan(table(0.95, noise=None))
    assert p.placement["work"] == "gpu:0" and p.ties == []


def test_with_equal_copies_the_cpu_wins():
    """a (CPU only) -> b (either) -> c (GPU only): b makes one copy wherever it runs."""
    doc = {"devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu:0": {"kind": "gpu"}},
           "link": {"h2d": {"latency_s": 1e-3, "bandwidth_Bps": 1e10}, "d2h": {"latency_s": 1e-3, "bandwidth_Bps": 1e10}},
           "noise": 0.1,
           "stages": [{"name": "a", "output_bytes": 1e3, "seconds": {"cpu": 0.1}},
                      {"name": "b", "inputs": ["a"], "output_bytes": 1e3, "seconds": {"cpu": 1.0, "gpu:0": 0.97}},
                      {"name": "c", "inputs": ["b"], "output_bytes": 1e3, "seconds": {"gpu:0": 0.1}}]}
    p = plan(CostTable.model_validate(doc))
    assert p.placement["b"] == "cpu"
    assert p.ties and p.ties[0].differs == {"b": "gpu:0"} and p.ties[0].copies == 2


def test_the_cost_models_table_carries_the_measurement_noise():
    from placer.costmodel.model import NOISE_FLOOR, CostModel
    from placer.data.profile import DeviceProfile, Point, Profile, StageProfile

    def pts(spread):
        return [Point(size=n, median_s=1e-3 * n, iqr_s=spread * 1e-3 * n, reps=5, raw_times=[1e-3 * n] * 5)
                for n in (1, 2, 4)]

    def model(spread):
        sp = StageProfile(name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts(spread))})
        return CostModel(Profile(pipeline="d", fingerprint="x", stages={"s": sp},
                                 devices={"cpu": {"kind": "cpu", "workers": 2}}))

    assert model(0.1).table(8).noise == pytest.approx(0.1)
    assert model(0.0).table(8).noise == NOISE_FLOOR
    assert model(3.0).table(8).noise == 0.25


def test_plan_prints_the_tie_and_its_rule(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(table(0.95).model_dump_json())
    out = CliRunner().invoke(app, ["plan", "--costs", str(path)])
    assert out.exit_code == 0, out.output
    assert "tie: work on gpu:0" in out.output and "fewer copies, then more stages on the CPU" in out.output
    assert "5% slower at the point estimate, wins by" in " ".join(out.output.split())  # which way, and its cost
    doc = json.loads(CliRunner().invoke(app, ["plan", "--costs", str(path), "--json"]).output)
    assert doc["ties"][0]["differs"] == {"work": "gpu:0"} and doc["tie_rule"].startswith("fewer copies")


def test_a_margin_among_sub_millisecond_stages_is_worded_as_within_the_error():
    """infer: 0.22 ms on the CPU, 0.15 ms on the GPU, each prediction off by up to 34 %."""
    doc = {"devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu:0": {"kind": "gpu"}},
           "link": {"h2d": {"latency_s": 1e-6, "bandwidth_Bps": 5e10}, "d2h": {"latency_s": 1e-6, "bandwidth_Bps": 5e10}},
           "noise": 0.05,
           "stages": [{"name": "request", "output_bytes": 1e3, "seconds": {"cpu": 1e-5}, "pin": "cpu"},
                      {"name": "infer", "inputs": ["request"], "output_bytes": 1e2, "kind": "inference",
                       "seconds": {"cpu": 2.2e-4, "gpu:0": 1.5e-4},
                       "uncertainty": {"cpu": 0.34, "gpu:0": 0.34}}]}
    p = plan(CostTable.model_validate(doc))
    infer = next(s for s in p.stages if s.name == "infer")
    assert "within the error of predictions this small" in infer.reason and "a close call" in infer.reason
    doc["stages"][1]["seconds"] = {"cpu": 2.2e-2, "gpu:0": 1.5e-2}  # the same margin at 20 ms: a plain speed-up
    p = plan(CostTable.model_validate(doc))
    infer = next(s for s in p.stages if s.name == "infer")
    assert "within the error" not in infer.reason and infer.reason.startswith("GPU is 1.5× faster")
