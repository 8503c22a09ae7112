"""The advise flow, best_placement for `placer run`, and the advise/report commands."""

from __future__ import annotations

import json

import pytest

import placer.advisor as advisor
from placer.devices import Device, Inventory, discover
from placer.errors import PlacerError
from placer.loader import load_pipeline
from placer.site import LocalSite
from warm_cli import run as run_placer
from seeded_cache import seeded_cache


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(seeded_cache(tmp_path / "cache")))
    return tmp_path / "cache"


def cpu_only() -> Inventory:
    inv = discover()
    return Inventory(devices=[d for d in inv.devices if d.kind == "cpu"], unavailable=inv.unavailable, host=inv.host)


def test_best_placement_on_a_cpu_only_machine_needs_no_profile(monkeypatch):
    monkeypatch.setattr(LocalSite, "costs", lambda *a, **k: pytest.fail("profiled on a CPU-only machine"))
    placement, why = advisor.best_placement(load_pipeline("pipelines.requests:build", 4), 4,
                                            site=LocalSite(cpu_only()))
    assert placement == "all=cpu" and "no GPU" in why


def test_best_placement_falls_back_to_cpu_and_says_why(monkeypatch):
    def broken(*a, **k):
        raise PlacerError("stage 'infer' failed on gpu-sim")

    monkeypatch.setattr(LocalSite, "costs", broken)
    placement, why = advisor.best_placement(load_pipeline("pipelines.requests:build", 4), 4)
    assert placement == "all=cpu" and "planning failed" in why and "infer" in why


@pytest.mark.slow
def test_best_placement_plans_over_this_machines_devices():
    p = load_pipeline("pipelines.requests:build", 8)
    placement, why = advisor.best_placement(p, 8)
    assert set(placement) == set(p.stages)
    assert set(placement.values()) <= {"cpu", "gpu-sim"}
    assert why.startswith("planned from a")


def test_baseline_placements_respect_missing_implementations():
    from placer import Pipeline

    p = Pipeline("mixed")
    p.add(name="load", kind="cleaning", cpu=lambda: 1)
    p.add(name="train", kind="training", gpu=lambda load: load, inputs=["load"])
    p.add(name="score", kind="inference", fn=lambda train, device: train, inputs=["train"])
    out = advisor.baseline_placements(p, "gpu-sim")
    assert out["all_cpu"] == {"load": "cpu", "train": "cpu", "score": "cpu"}
    assert out["all_gpu"] == {"load": "cpu", "train": "gpu-sim", "score": "gpu-sim"}
    assert out["rule_of_thumb"] == {"load": "cpu", "train": "gpu-sim", "score": "gpu-sim"}
    assert advisor.baseline_placements(p, None).keys() == {"all_cpu"}


def test_unknown_target_is_refused():
    with pytest.raises(PlacerError, match="unknown target 'tpu'.*h200, auto or none"):
        advisor.resolve_target("tpu", discover())


def test_advise_runs_plan_and_baselines_and_plans_for_the_absent_gpu():
    a = advisor.advise("pipelines/requests.py", size=8, budget_s=4, target="auto")
    f = a.facts
    keys = {o.key: o for o in f.summary.options}
    assert set(keys) == {"plan", "all_cpu", "all_gpu", "rule_of_thumb"}
    assert all(o.measured_s is not None and o.measured_s > 0 for o in keys.values())
    assert f.summary.digests_agree is True  # same answer on every placement
    assert f.target is not None and f.target.label == "NVIDIA H200"
    absent = [e for e in f.errors if e.device == f.target.device]
    assert absent and all(e.prediction_only and e.label == "roofline" for e in absent)
    assert {r.name for r in f.stages} == set(a.pipeline.stages)
    assert f.bottleneck is not None and f.bottleneck.source == "measured"


@pytest.mark.slow
def test_advise_and_report_commands(tmp_path, sim_env, cache_dir):
    env = {**sim_env, "PLACER_CACHE_DIR": str(cache_dir)}
    out, saved = tmp_path / "r.html", tmp_path / "saved"
    res = run_placer(["advise", "pipelines/requests.py", "--size", "8",
                          "--budget-s", "4", "-o", str(out), "--save", str(saved), "--json"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["pipeline"] == "requests" and doc["report"] == str(out) and doc["advice"]
    assert "<svg" in out.read_text()
    assert {p.name for p in saved.iterdir()} >= {"plan.json", "run.json", "profile.json", "report.json"}
    md = tmp_path / "again.md"
    res = run_placer(["report", "--from", str(saved / "report.json"),
                          "-o", str(md)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "| preprocess |" in md.read_text()
    res = run_placer(["report", "--plan", str(saved / "plan.json"),
                          "--run", str(saved / "run.json"), "--baseline", "all_cpu=" + str(saved / "run-all_cpu.json"),
                          "-o", str(tmp_path / "from-saved.json")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    again = json.loads((tmp_path / "from-saved.json").read_text())
    assert again["summary"]["options"][0]["measured_s"] == json.loads((saved / "run.json").read_text())["makespan_s"]


@pytest.mark.slow
def test_report_command_errors_name_the_fix(tmp_path, sim_env):
    res = run_placer(["report", "-o", str(tmp_path / "x.html")],
                         capture_output=True, text=True, env=sim_env, timeout=60)
    assert res.returncode != 0 and "give exactly one of" in res.stderr
    res = run_placer(["advise", "pipelines/requests.py",
                          "-o", str(tmp_path / "x.txt")], capture_output=True, text=True, env=sim_env, timeout=60)
    assert res.returncode != 0 and "--format" in res.stderr
