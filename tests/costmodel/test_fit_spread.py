"""Fit forms that match the measurements as well but disagree at the requested size: the
prediction carries the disagreement, and a placement that flips within it is a tie."""

from __future__ import annotations

import numpy as np
import pytest

from placer.costmodel.fit import fit_size_model
from placer.data.cost_table import CostTable
from placer.optimize import plan

N = np.array([100, 200, 400, 800])
#: a stage's times that a line with a fixed cost and n*log2(n) fit about as well
CURVED = [1.0e-3, 1.3e-3, 2.1e-3, 3.9e-3]


def test_forms_that_fit_as_well_but_disagree_far_out_widen_the_error():
    fit = fit_size_model(N, CURVED)
    assert fit.alternatives  # another form fits about as well
    inside, far = fit.predict(400), fit.predict(80_000)
    assert inside.fit_spread == 0.0 and inside.rel_error == pytest.approx(fit.loo_error)
    assert far.fit_spread == pytest.approx(fit.disagreement(80_000)) and far.fit_spread > 0.3
    assert far.rel_error >= far.fit_spread > fit.loo_error * 2
    assert "fit forms disagree" in str(far)


def test_a_clear_winner_has_no_alternatives():
    rng = np.random.default_rng(0)
    y = 2e-6 * N ** 1.3 * (1 + 0.01 * rng.standard_normal(len(N)))
    fit = fit_size_model(N, y)
    assert fit.form == "power" and fit.alternatives == {}
    assert fit.predict(80_000).fit_spread == 0.0


def _table(gpu_s: float, uncertainty: dict | None) -> CostTable:
    """load (CPU) -> work (CPU 1.0 s, GPU ``gpu_s``, the GPU side uncertain by ``uncertainty``)."""
    work = {"name": "work", "inputs": ["load"], "output_bytes": 1e6, "seconds": {"cpu": 1.0, "gpu:0": gpu_s}}
    if uncertainty:
        work["uncertainty"] = uncertainty
    return CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu:0": {"kind": "gpu"}},
        "link": {"h2d": {"latency_s": 1e-3, "bandwidth_Bps": 1e10}, "d2h": {"latency_s": 1e-3, "bandwidth_Bps": 1e10}},
        "noise": 0.05,
        "stages": [{"name": "load", "output_bytes": 1e6, "seconds": {"cpu": 0.1}}, work]})


def test_a_flip_within_the_fits_disagreement_is_reported_as_a_tie():
    sure = plan(_table(0.7, None))
    assert sure.placement["work"] == "gpu:0" and sure.ties == []
    unsure = plan(_table(0.7, {"gpu:0": 0.6}))  # the GPU's 0.7 s could be 1.1 s
    assert unsure.ties and unsure.ties[0].fits_disagree
    assert {unsure.placement["work"], unsure.ties[0].differs.get("work", unsure.placement["work"])} == {"cpu", "gpu:0"}
    work = next(s for s in unsure.stages if s.name == "work")
    assert "fit forms" in work.reason and "a tie with" in work.reason
    clear = plan(_table(0.2, {"gpu:0": 0.6}))  # even at +60 % the GPU wins
    assert clear.placement["work"] == "gpu:0" and clear.ties == []


def test_the_cost_models_table_carries_the_disagreement_beyond_the_noise():
    from placer.costmodel.model import CostModel
    from placer.data.profile import DeviceProfile, Point, Profile, StageProfile

    pts = [Point(size=int(n), median_s=y, iqr_s=0.0, reps=5, raw_times=[y] * 5) for n, y in zip(N, CURVED)]
    prof = Profile(pipeline="p", fingerprint="x", devices={"cpu": {"kind": "cpu", "workers": 1}}, stages={"s": StageProfile(
        name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)})})
    model = CostModel(prof)
    far = model.table(80_000).stages[0]
    assert far.uncertainty["cpu"] == pytest.approx(model.predict("s", "cpu", 80_000).fit_spread)
    assert model.table(400).stages[0].uncertainty == {}
