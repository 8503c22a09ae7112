"""Measuring where the uncertainty decides: which stages, which size, and the profile they join."""

from __future__ import annotations

from placer.data.plan import Plan, Schedule, StageChoice, Tie
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile
from placer.decide import SIZE_COST_TIMES, deciding_stages, merge, next_size, note


def _plan(ties):
    return Plan(placement={"a": "cpu", "b": "cpu"}, predicted_makespan_s=1.0, objective_value=1.0, ties=ties,
                schedule=Schedule(makespan_s=1.0, stages=[], transfers=[]),
                stages=[StageChoice(name=n, kind="other", device="cpu", predicted_s={}, transfer_s=0.0, copy_s=0.0,
                                    reason="CPU is 2× faster") for n in ("a", "b")])


def test_only_ties_the_spread_makes_name_deciding_stages():
    noise_tie = Tie(placement={"a": "gpu:0", "b": "cpu"}, differs={"a": "gpu:0"}, objective_value=1.0,
                    predicted_makespan_s=1.0)
    spread_tie = noise_tie.model_copy(update={"differs": {"b": "gpu:0"}, "fits_disagree": True})
    assert deciding_stages(_plan([noise_tie])) == set()
    assert deciding_stages(_plan([noise_tie, spread_tie]), None) == {"b"}
    assert deciding_stages({"ties": [spread_tie.model_dump()]}) == {"b"}  # a target's report data


def test_the_next_size_is_the_planned_one_when_it_fits_else_nearer_it():
    assert next_size([100, 200, 400], 4000, predicted_s=1.0, left_s=SIZE_COST_TIMES * 1.0) == 4000
    assert next_size([100, 200, 400], 4000, predicted_s=1.0, left_s=SIZE_COST_TIMES * 0.5) == 1265  # sqrt(400 * 4000)
    assert next_size([100, 200, 400], 4000, predicted_s=1.0, left_s=0.1 * SIZE_COST_TIMES) is None
    assert next_size([100, 200, 400], 300, predicted_s=0.0, left_s=10.0) is None  # within the measured sizes


def _profile(sizes):
    pts = [Point(size=n, median_s=1e-6 * n, iqr_s=0.0, reps=3, raw_times=[1e-6 * n] * 3) for n in sizes]
    sp = StageProfile(name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)})
    return Profile(pipeline="p", fingerprint="x", stages={"s": sp}, measured_sizes=list(sizes),
                   devices={"cpu": {"kind": "cpu", "workers": 2}})


def test_new_points_join_the_profile_once():
    prof = _profile([100, 200, 400])
    assert merge(prof, _profile([400, 1600])) == [1600]
    assert [p.size for p in prof.stages["s"].devices["cpu"].points] == [100, 200, 400, 1600]
    assert prof.measured_sizes == [100, 200, 400, 1600]
    assert merge(prof, _profile([1600])) == []


def test_the_reason_says_what_was_measured():
    p = _plan([])
    note(p, {"b": "measured again at 1,600 rows before deciding"})
    assert p.stages[0].reason == "CPU is 2× faster"
    assert p.stages[1].reason.endswith("; measured again at 1,600 rows before deciding")
