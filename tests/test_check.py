"""``placer check``: a CI gate on the best placement and the stages' speed against a saved baseline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from placer.check import BaselineError, compare, compare_stage, load_baseline
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile
from warm_cli import run as run_placer
from seeded_cache import seeded_cache

ROOT = Path(__file__).resolve().parents[1]

# a pipeline whose stage "wait" sleeps for SLOW_STAGE_S seconds (a build parameter scales it);
# with GPU_STAGE_S set it also has a GPU implementation sleeping that long
PIPELINE = '''
import os, time
from placer import Pipeline

def build(size=None, *, factor: float = 1.0):
    n = int(size or 100)
    wait = float(os.environ.get("SLOW_STAGE_S", "0.02")) * factor
    p = Pipeline("slow", size=n)
    p.add(name="make", kind="cleaning", cpu=lambda n: list(range(n)), params={"n": n})
    gpu = os.environ.get("GPU_STAGE_S")
    p.add(name="wait", kind="preprocessing", cpu=lambda make, wait: time.sleep(wait) or len(make),
          gpu=(lambda make, wait, device: time.sleep(float(gpu)) or len(make)) if gpu else None,
          inputs=["make"], params={"wait": wait})
    return p
'''


def prof(**stages: tuple[float, float]) -> Profile:
    """A profile with one CPU point at size 100 per stage: ``name=(median_s, iqr_s)``."""
    out = {}
    for name, (med, iqr) in stages.items():
        pt = Point(size=100, median_s=med, iqr_s=iqr, reps=5, raw_times=[med] * 5)
        out[name] = StageProfile(name=name, key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu",
                                                                                    points=[pt])})
    return Profile(pipeline="demo", fingerprint="f", stages=out, sizes=[100], measured_sizes=[100])


CPU = {"a": "cpu", "b": "cpu"}


def test_a_stage_three_times_slower_fails_and_noise_widens_the_tolerance():
    res = compare(prof(a=(0.1, 0.005), b=(0.2, 0.01)), CPU, prof(a=(0.1, 0.005), b=(0.6, 0.01)), CPU)
    assert not res.passed
    (slow,) = res.slower
    assert slow.stage == "b" and slow.ratio == pytest.approx(3.0) and slow.allowed_ratio == pytest.approx(1.5)
    assert any("slower: stage 'b' on cpu" in line for line in res.lines())
    # 40% IQR: 3 x 0.4 allows up to 2.2x, so 2x is noise, not a regression
    noisy = compare(prof(a=(0.1, 0.04)), {"a": "cpu"}, prof(a=(0.2, 0.08)), {"a": "cpu"})
    assert noisy.passed and noisy.stages[0].allowed_ratio == pytest.approx(2.2)
    # 1.4x on a quiet measurement stays within the 50% floor
    assert compare(prof(a=(0.1, 0.001)), {"a": "cpu"}, prof(a=(0.14, 0.001)), {"a": "cpu"}).passed


def test_tiny_stages_are_never_called_slower_and_faster_ones_do_not_fail():
    tiny = compare_stage("a", "cpu", prof(a=(1e-5, 1e-7)), prof(a=(5e-5, 1e-7)))
    assert tiny.verdict == "same" and tiny.ratio == pytest.approx(5.0)
    res = compare(prof(a=(0.3, 0.001)), {"a": "cpu"}, prof(a=(0.1, 0.001)), {"a": "cpu"})
    assert res.passed and res.stages[0].verdict == "faster"


def test_a_changed_placement_fails_and_names_the_stage():
    res = compare(prof(a=(0.1, 0.001), b=(0.1, 0.001)), CPU, prof(a=(0.1, 0.001), b=(0.1, 0.001)),
                  {"a": "cpu", "b": "gpu:0"})
    assert not res.passed
    assert [(c.stage, c.baseline, c.current) for c in res.placement_changes] == [("b", "cpu", "gpu:0")]
    assert "placement changed: stage 'b' cpu -> gpu:0" in res.lines()


def test_a_regression_counts_only_when_a_second_profile_confirms_it():
    from placer.check import confirmed

    base = prof(a=(0.1, 0.001), b=(0.1, 0.001))
    burst = compare(base, CPU, prof(a=(0.35, 0.001), b=(0.1, 0.001)), {"a": "cpu", "b": "gpu:0"})
    assert not burst.passed
    calm = compare(base, CPU, prof(a=(0.11, 0.001), b=(0.1, 0.001)), CPU)
    assert confirmed(burst, calm).passed  # one slow profile and one flipped plan: not confirmed
    real = compare(base, CPU, prof(a=(0.3, 0.001), b=(0.1, 0.001)), {"a": "cpu", "b": "gpu:0"})
    both = confirmed(burst, real)
    assert not both.passed and both.slower[0].ratio == pytest.approx(3.0)  # the milder of 3.5x and 3x
    assert [c.stage for c in both.placement_changes] == ["b"]


def test_nothing_comparable_fails_instead_of_passing_blind():
    other = prof(a=(0.1, 0.001))
    other.stages["a"].devices["cpu"].points[0].size = 50  # no size in common
    res = compare(prof(a=(0.1, 0.001)), {"a": "cpu"}, other, {"a": "cpu"})
    assert not res.passed and "no size measured in both" in " ".join(res.uncovered)


def test_a_missing_baseline_names_the_fix(tmp_path):
    with pytest.raises(BaselineError, match="--update"):
        load_baseline(tmp_path / "none")
    (tmp_path / "half").mkdir()
    with pytest.raises(BaselineError, match="no profile.json"):
        load_baseline(tmp_path / "half")


# -- the command -----------------------------------------------------------------------------------
def placer(*args, cwd, **env):
    full = {**os.environ, "PLACER_CACHE_DIR": str(seeded_cache(cwd / "cache")), **env}
    return run_placer([*args], capture_output=True, text=True, cwd=cwd,
                          env=full, timeout=300)


@pytest.fixture
def slow_pipeline(tmp_path):
    (tmp_path / "slow.py").write_text(PIPELINE)
    return tmp_path


@pytest.mark.slow
def test_check_passes_on_its_fresh_baseline_and_fails_when_a_stage_is_3x_slower(slow_pipeline):
    d = slow_pipeline
    env = {"PLACER_TEST_DEVICES": "0"}
    made = placer("check", "slow.py", "--baseline", "base", "--update", "--budget-s", "2", cwd=d, **env)
    assert made.returncode == 0, made.stderr
    assert {p.name for p in (d / "base").iterdir()} == {"profile.json", "plan.json", "run.json", "check.json"}
    same = placer("check", "slow.py", "--baseline", "base", cwd=d, **env)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "check passed" in same.stdout
    slower = placer("check", "slow.py", "--baseline", "base", "--json", cwd=d, SLOW_STAGE_S="0.06", **env)
    assert slower.returncode == 1, slower.stdout + slower.stderr
    doc = json.loads(slower.stdout)
    assert [s["stage"] for s in doc["stages"] if s["verdict"] == "slower"] == ["wait"]
    assert doc["passed"] is False and any("check failed" in line for line in doc["lines"])


@pytest.mark.slow
def test_check_fails_when_the_best_device_changes(slow_pipeline):
    d = slow_pipeline
    env = {"PLACER_TEST_DEVICES": "1", "NUMBA_ENABLE_CUDASIM": "1"}
    made = placer("check", "slow.py", "--baseline", "base", "--update", "--budget-s", "2", cwd=d,
                  SLOW_STAGE_S="0.01", GPU_STAGE_S="0.08", **env)
    assert made.returncode == 0, made.stderr
    assert json.loads((d / "base" / "plan.json").read_text())["placement"]["wait"] == "cpu"
    moved = placer("check", "slow.py", "--baseline", "base", cwd=d, SLOW_STAGE_S="0.2", GPU_STAGE_S="0.01", **env)
    assert moved.returncode == 1, moved.stdout + moved.stderr
    assert "placement changed: stage 'wait' cpu -> gpu-sim" in moved.stdout


def test_an_advise_save_folder_is_a_baseline(slow_pipeline):
    d = slow_pipeline
    env = {"PLACER_TEST_DEVICES": "0"}
    saved = placer("advise", "slow.py", "--budget-s", "2", "--no-baselines", "-o", "r.json", "--save", "base",
                   cwd=d, **env)
    assert saved.returncode == 0, saved.stderr
    r = placer("check", "slow.py", "--baseline", "base", cwd=d, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "within tolerance: make, wait" in r.stdout


def test_check_without_a_baseline_exits_2(tmp_path):
    (tmp_path / "slow.py").write_text(PIPELINE)
    r = placer("check", "slow.py", "--baseline", "missing", cwd=tmp_path)
    assert r.returncode == 2 and "--update" in r.stderr
