"""Every file placer writes has a JSON Schema (``placer schema NAME``), kept in docs/schemas/, that it meets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.data.documents import DOCUMENTS, json_schema
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[1]


def placer(*args, env=None):
    return run_placer([*args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def validate(doc, name):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates against schemas")
    jsonschema.Draft202012Validator(json_schema(name)).validate(doc)


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_docs_hold_the_current_schema(name):
    saved = json.loads((ROOT / "docs" / "schemas" / f"{name}.schema.json").read_text())
    assert saved == json_schema(name), f"docs/schemas/{name}.schema.json is stale: placer schema {name} > it"


@pytest.mark.slow
def test_schema_command_prints_it_and_refuses_unknown_names():
    r = placer("schema", "run")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json_schema("run")
    bad = placer("schema", "nope")
    assert bad.returncode == 2 and "use one of profile, costs, plan, run, report" in bad.stderr


@pytest.mark.slow
def test_a_run_meets_its_schema():
    r = placer("run", "pipelines/tabular.py", "--size", "2000", "--placement", "all=cpu", "--json")
    assert r.returncode == 0, r.stderr
    validate(json.loads(r.stdout), "run")


@pytest.mark.slow
def test_a_profile_has_one_shape_printed_or_saved_and_plans_from_it(tmp_path):
    saved = tmp_path / "p.json"
    r = placer("profile", "pipelines/tabular.py", "--size", "4000", "--budget-s", "4", "--devices", "cpu",
               "--json", "-o", str(saved))
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed == json.loads(saved.read_text())
    validate(printed, "profile")
    assert printed["schema"] == "placer.profile-document/1" and printed["profile"]["schema"] == "placer.profile/1"
    costs = tmp_path / "costs.json"
    plan = placer("plan", "--profile", str(saved), "--size", "4000", "--json", "--save-costs", str(costs))
    assert plan.returncode == 0, plan.stderr
    validate(json.loads(plan.stdout), "plan")
    validate(json.loads(costs.read_text()), "costs")


def test_a_report_meets_its_schema():
    import placer as lib
    from placer.report import collect

    p = lib.Pipeline("tiny")
    p.add(name="make", kind="cleaning", fn=lambda device: list(range(4)))
    facts = collect(run=lib.execute(p, "all=cpu", executor="inline"))
    validate(json.loads(facts.to_json()), "report")
