"""Tampered saved JSON given to ``placer report`` is refused, naming the file and the field.

A run JSON edited to name a device that does not exist (``tpu``), or a stage the plan
does not have, is not rendered: ``placer report`` exits 1 with one line naming the file
and the field, and writes no report.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer import Pipeline
from placer.cli import app
from placer.executor import execute


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[dict, dict]:
    """A plan (by hand: only its placement and schedule) and the run of it, as saved JSON."""
    p = Pipeline("tampered", size=10)
    p.add(name="make", cpu=lambda: np.arange(10.0))
    p.add(name="double", cpu=lambda make: make * 2, inputs={"make": "make"})
    run = execute(p, "all=cpu").summary()
    plan = {"pipeline": "tampered", "placement": {"make": "cpu", "double": "cpu"}, "predicted_makespan_s": 1e-3,
            "objective_value": 1e-3, "schedule": {"makespan_s": 1e-3, "stages": [], "transfers": []}}
    return plan, run


def _report(tmp_path: Path, plan: dict, run: dict):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = tmp_path / "report.html"
    r = CliRunner().invoke(app, ["report", "--plan", str(tmp_path / "plan.json"), "--run", str(tmp_path / "run.json"),
                                 "-o", str(out)])
    return r, out


def _edited(doc: dict, edit) -> dict:
    doc = json.loads(json.dumps(doc))
    edit(doc)
    return doc


def test_the_untouched_plan_and_run_are_rendered(tmp_path, saved):
    r, out = _report(tmp_path, *saved)
    assert r.exit_code == 0, r.output
    assert out.exists()


def _record(doc, name):
    return next(s for s in doc["stages"] if s["name"] == name)


EDITS = {
    "placement names tpu": (lambda d: d["placement"].__setitem__("double", "tpu"), "field placement.double is 'tpu'"),
    "a record on tpu": (lambda d: _record(d, "double").__setitem__("device", "tpu"), "field stages[1].device is 'tpu'"),
    "a record of a stage the plan lacks": (lambda d: d["stages"].append(dict(d["stages"][0], name="ghost")),
                                           "field stages[2].name names stage 'ghost', which the plan"),
    "a failed stage the plan lacks": (lambda d: d.update(failed_stage="ghost", error="x"),
                                      "field failed_stage names stage 'ghost'"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_a_tampered_run_is_refused_naming_the_file_and_the_field(tmp_path, saved, case):
    plan, run = saved
    edit, field = EDITS[case]
    r, out = _report(tmp_path, plan, _edited(run, edit))
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"the run {str(tmp_path / 'run.json')!r}" in lines[0] and field in lines[0], lines[0]
    assert not out.exists()


def test_a_plan_placing_a_stage_on_tpu_is_refused_naming_the_field(tmp_path, saved):
    plan, run = saved
    r, out = _report(tmp_path, _edited(plan, lambda d: d["placement"].__setitem__("make", "tpu")), run)
    assert r.exit_code == 1
    assert f"the plan {str(tmp_path / 'plan.json')!r}" in r.stderr and "field placement.make is 'tpu'" in r.stderr
    assert not out.exists()


def test_device_aliases_come_from_the_device_registry(saved):
    """``gpu`` and ``gpu:0`` are one device to the check, as to the registry (no table of its own)."""
    from placer.report import check

    assert not hasattr(check, "ALIASES")
    assert check.placement_difference({"a": "gpu"}, {"a": "gpu:0"}) == ""
    assert "placed stage 'a' on gpu:1" in check.placement_difference({"a": "gpu"}, {"a": "gpu:1"})
