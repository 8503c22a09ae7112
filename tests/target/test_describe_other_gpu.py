"""``placer describe`` on a GPU that is not the reference H200 states its own error.

No GPU is needed: a fake GPU (a device whose torch device is the CPU) is described with
small matrix products and copies, and the fit is checked on timings made up from a
known description. The shipped H200 description's ``rel_error`` (the spread of its
predictions over the H200's reference ops) must never turn up as another GPU's.
"""

from __future__ import annotations

import math
import types

import pytest

from placer.costmodel.roofline import load_description
from placer.data.measures import Work
from placer.target import calibrate
from placer.target.calibrate import MIN_FIT_POINTS, fit_gpu_factors, gpu_description, spread_error

H200 = load_description("h200")

# an L4-like GPU, with efficiency factors unlike the H200's
L4 = dict(name="NVIDIA L4", memory_bytes=24e9, peak_flops={"fp32": 30e12, "tf32": 60e12, "bf16": 120e12,
                                                            "fp16": 120e12},
          mem_bandwidth_Bps=300e9, op_overhead_s=4e-6, stage_overhead_s=1e-5, sync_s=1e-5)
TRUTH = dict(host_factor=2.0, compute_eff=0.4, memory_eff=0.7, irregular_eff=0.2)


def _works():
    """Counted work of a dozen ops, from dispatch-bound to throughput-bound."""
    out = []
    for i, scale in enumerate([1e3, 1e4, 1e5, 1e6, 1e7, 1e8]):
        out.append(Work(flops=scale * 5000, bytes=scale * 4, ops=3 + i, host_s=2e-5 * (1 + i)))  # compute-heavy
        out.append(Work(flops=scale, bytes=scale * 40, irregular_bytes=scale * 10 * (i % 2), ops=5,
                        host_s=3e-5))  # memory-heavy
    return out


def _timed(noise=(1.08, 0.93, 1.0, 1.12, 0.9)):
    from placer.costmodel.roofline import DeviceDescription

    truth = DeviceDescription(kind="gpu", **{k: v for k, v in L4.items() if k != "memory_bytes"}, **TRUTH)
    return [(f"op{i}", float(i + 1), w, truth.predict(w) * noise[i % len(noise)]) for i, w in enumerate(_works())]


def test_a_described_l4_fits_its_own_factors_and_reports_its_own_error():
    desc = gpu_description(transfer=H200.transfer, timed_ops=_timed(), **L4)
    assert desc.name == "NVIDIA L4"
    assert desc.rel_error != pytest.approx(H200.rel_error)
    assert desc.rel_error == pytest.approx(spread_error(desc.calibration))
    assert desc.rel_error < 0.15  # the made-up timings are within 12 % of a roofline
    assert len(desc.calibration) == len(_works())
    assert "fitted to 12 reference ops timed on this GPU" in desc.source and "ASSUMED" not in desc.source
    # the fit finds the GPU's own factors, not the H200's
    assert desc.host_factor == TRUTH["host_factor"] != H200.host_factor
    assert desc.compute_eff == pytest.approx(TRUTH["compute_eff"], rel=0.25)
    assert desc.memory_eff == pytest.approx(TRUTH["memory_eff"], rel=0.25)


def test_with_too_few_timed_ops_it_says_it_assumed_the_h200_factors_and_keeps_its_own_error():
    few = _timed()[:MIN_FIT_POINTS - 1]
    desc = gpu_description(transfer=H200.transfer, timed_ops=few, **L4)
    assert "ASSUMED from the shipped H200 calibration" in desc.source
    assert (desc.compute_eff, desc.memory_eff, desc.host_factor) == (H200.compute_eff, H200.memory_eff,
                                                                      H200.host_factor)
    assert desc.rel_error == pytest.approx(spread_error(desc.calibration)) != pytest.approx(H200.rel_error)
    none = gpu_description(transfer=H200.transfer, timed_ops=[], **L4)
    assert none.rel_error == 1.0 and none.calibration == []  # unknown, stated as such


def test_the_fit_recovers_factors_from_exact_timings():
    timed = _timed(noise=(1.0,))
    got = fit_gpu_factors([(w, m) for *_, w, m in timed], peak_flops=L4["peak_flops"],
                          mem_bandwidth_Bps=L4["mem_bandwidth_Bps"], stage_overhead_s=L4["stage_overhead_s"],
                          op_overhead_s=L4["op_overhead_s"], sync_s=L4["sync_s"])
    assert got["host_factor"] == 2.0
    assert math.isclose(got["compute_eff"], 0.4, rel_tol=0.15)
    assert math.isclose(got["memory_eff"], 0.7, rel_tol=0.15)


class FakeGpu:
    """A GPU as ``describe`` sees one, whose work runs on the CPU."""

    name, kind, label, memory_bytes, is_gpu = "gpu:0", "gpu", "NVIDIA L4 (fake)", 24 * 2**30, True

    def torch_device(self):
        import torch

        return torch.device("cpu")

    def synchronize(self):
        pass


def test_describe_gpu_on_a_fake_l4_does_not_report_the_h200s_error(monkeypatch):
    pytest.importorskip("torch")
    import placer.profile.transfers as transfers

    monkeypatch.setattr(calibrate, "PEAK_N", 128)
    monkeypatch.setattr(calibrate, "COPY_ELEMENTS", 1 << 16)
    monkeypatch.setattr(transfers, "measure_transfers", lambda *a, **k: H200.transfer)
    desc = calibrate.describe_gpu(FakeGpu(), budget_s=4.0)
    assert desc.name == "NVIDIA L4 (fake)"
    assert desc.calibration, "no reference op was timed on the fake GPU"
    assert desc.rel_error != pytest.approx(H200.rel_error)
    assert desc.rel_error == pytest.approx(spread_error(desc.calibration))
    if len(desc.calibration) >= MIN_FIT_POINTS:
        assert "fitted to" in desc.source
    else:
        assert "ASSUMED" in desc.source


def test_the_describe_command_writes_the_fake_gpus_own_error(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    import json

    from typer.testing import CliRunner

    from placer.cli import app
    from placer.target.description import CpuDescription

    fake = types.SimpleNamespace(devices=[types.SimpleNamespace(is_accelerator=True, simulated=False,
                                                                label="NVIDIA L4 (fake)")],
                                 fingerprint=lambda: "fake")
    monkeypatch.setattr("placer.devices.discover", lambda *a, **k: fake)
    monkeypatch.setattr(calibrate, "calibrate_cpu", lambda **k: CpuDescription(model="fake CPU", cores=2))
    monkeypatch.setattr(calibrate, "describe_gpu",
                        lambda d, **k: gpu_description(transfer=H200.transfer, timed_ops=_timed(), **L4))
    out = tmp_path / "box.json"
    res = CliRunner().invoke(app, ["describe", "-o", str(out)])
    assert res.exit_code == 0, res.output
    gpu = json.loads(out.read_text())["gpus"][0]
    assert gpu["name"] == "NVIDIA L4" and gpu["rel_error"] != pytest.approx(H200.rel_error)
