"""Report inputs are placer's models: malformed files and inputs that do not belong together are refused."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import test_report_fixtures as fx
from placer import Pipeline
from placer.data.cost_table import CostTable, DeviceSpec, StageCost
from placer.data.measures import Prediction
from placer.data.plan import Plan, Schedule, StageChoice, StageEvent, TransferEvent
from placer.data.report import TargetPlan
from placer.data.run import Run, StageRecord, TransferRecord
from placer.devices import Device, Inventory, discover
from placer.executor import execute
from placer.report import MismatchedInputsError, ReportInputError, collect, load_facts, report
from warm_cli import run as run_placer

REPORT_CODE = str(Path(collect.__code__.co_filename).parent)
#: every model a report reads, nested ones included
MODELS = (Plan, StageChoice, Schedule, StageEvent, TransferEvent, Run, StageRecord, TransferRecord,
          CostTable, StageCost, DeviceSpec, Inventory, Device, Prediction, TargetPlan)


def other_run() -> Run:
    """A run of another pipeline (other name, other stages)."""
    p = Pipeline("other")

    @p.stage()
    def numbers(device):
        import torch

        return torch.arange(4.0, device=device)

    return execute(p, "all=cpu")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The fixture's plan, runs and cost table, and a run of another pipeline, as JSON files."""
    folder = tmp_path_factory.mktemp("saved")
    _, chosen, run, cpu, gpu, costs = fx.inputs()
    files = {}
    for name, obj in {"plan": chosen, "run": run, "cpu": cpu, "gpu": gpu, "costs": costs,
                      "other": other_run()}.items():
        files[name] = folder / f"{name}.json"
        files[name].write_text(obj.model_dump_json(indent=1))
    return files


def placer_report(*args: str | Path) -> subprocess.CompletedProcess:
    return run_placer(["report", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


# -- inputs that do not belong together ------------------------------------------------------
def test_cli_refuses_a_plan_and_a_run_of_different_pipelines(saved, tmp_path):
    out = tmp_path / "x.html"
    res = placer_report("--plan", saved["plan"], "--run", saved["other"], "-o", out)
    assert res.returncode != 0
    err = res.stderr.strip()
    assert "\n" not in err, err
    assert str(saved["plan"]) in err and str(saved["other"]) in err
    assert "do not belong together" in err and "only in the plan: clean" in err and "only in the run: numbers" in err
    assert not out.exists() and res.stdout == ""


def test_a_plan_knows_its_pipeline_and_refuses_a_run_of_another_with_the_same_stages():
    _, chosen, run, _, _, costs = fx.inputs()
    renamed = run.model_copy(update={"pipeline": "impostor"})
    if chosen.pipeline is None:  # the fixture plans from a bare cost table: give it the run's pipeline
        chosen = chosen.model_copy(update={"pipeline": run.pipeline})
    collect(plan=chosen, run=run, costs=costs)  # the same pipeline: fine
    with pytest.raises(MismatchedInputsError, match=rf"different pipelines \('{run.pipeline}' and 'impostor'\)"):
        collect(plan=chosen, run=renamed, costs=costs)


def test_cli_refuses_a_baseline_of_another_pipeline(saved, tmp_path):
    out = tmp_path / "x.json"
    res = placer_report("--run", saved["cpu"], "--baseline", f"all_gpu={saved['other']}", "-o", out)
    err = res.stderr.strip()
    assert res.returncode != 0 and "\n" not in err and not out.exists()
    name = json.loads(saved["cpu"].read_text())["pipeline"]
    assert f"the run {str(saved['cpu'])!r} (pipeline {name!r})" in err
    assert f"the all_gpu run {str(saved['other'])!r} (pipeline 'other')" in err
    assert "different pipelines" in err


def test_a_run_of_another_placement_is_not_the_plans_run(saved):
    _, chosen, run, cpu, _, costs = fx.inputs()
    moved = next(n for n, d in chosen.placement.items() if d != "cpu")
    with pytest.raises(MismatchedInputsError, match=(
            rf"^the plan and the run \(pipeline '[^']+'\) do not belong together: the run placed stage "
            rf"'{moved}' on cpu where the plan places it on gpu-sim.*as baselines$")):
        collect(plan=chosen, run=cpu, costs=costs)
    with pytest.raises(MismatchedInputsError, match=str(saved["cpu"])):
        collect(plan=saved["plan"], run=saved["cpu"])
    # the same run is a fine all-CPU baseline
    facts = collect(plan=chosen, run=run, baselines={"all_cpu": cpu}, costs=costs)
    assert facts.summary.options[1].key == "all_cpu"


def test_a_cost_table_or_pipeline_of_other_stages_is_refused():
    p, chosen, run, _, _, costs = fx.inputs()
    fewer = CostTable.model_validate({**costs.model_dump(), "stages": [s.model_dump() for s in costs.stages[:2]]})
    with pytest.raises(MismatchedInputsError, match=r"^the plan and the cost table do not belong together: "
                                                    r"different stages \(only in the plan: features, predict, train\)"):
        collect(plan=chosen, costs=fewer)
    other = Pipeline("other")
    other.stage(name="numbers")(lambda device: 1)
    with pytest.raises(MismatchedInputsError, match="the run .* and the pipeline 'other' .*different pipelines"):
        collect(run=run, pipeline=other)


def test_gpu_and_gpu0_are_one_device_when_comparing_placements():
    _, chosen, run, *_ = fx.inputs()
    plan = chosen.model_copy(update={"placement": {n: "gpu" if d != "cpu" else d for n, d in chosen.placement.items()}})
    ran = run.model_copy(update={"placement": {n: "gpu:0" if d != "cpu" else d for n, d in run.placement.items()}})
    collect(plan=plan, run=ran)  # no error
    with pytest.raises(MismatchedInputsError, match="on gpu:1 where the plan places it on gpu"):
        collect(plan=plan, run=ran.model_copy(update={"placement": {n: "gpu:1" if d != "cpu" else d
                                                                    for n, d in run.placement.items()}}))


# -- malformed files -------------------------------------------------------------------------
def _tamper(doc: dict, how: str) -> tuple[dict, str]:
    """``doc`` changed one way; the field the error must name."""
    if how == "seconds is text":
        doc["stages"][1]["seconds"] = "fast"
        return doc, f"stages[1].seconds (stage {doc['stages'][1]['name']!r})"
    if how == "renamed key":
        doc["stages"][0]["secs"] = doc["stages"][0].pop("seconds")
        return doc, f"stages[0].seconds (stage {doc['stages'][0]['name']!r}) is missing"
    if how == "renamed optional key":
        doc["transfers"][0]["is_pinned"] = doc["transfers"][0].pop("pinned")
        return doc, "transfers[0].is_pinned is not a field of a placer run"
    if how == "missing makespan":
        del doc["makespan_s"]
        return doc, "makespan_s is missing"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["seconds is text", "renamed key", "renamed optional key", "missing makespan"])
def test_a_tampered_run_file_names_the_file_and_the_field(saved, tmp_path, how):
    doc, field = _tamper(json.loads(saved["run"].read_text()), how)
    bad = tmp_path / "tampered-run.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ReportInputError) as info:
        collect(plan=saved["plan"], run=bad)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"the run file {str(bad)!r} is not a valid run: field {field}"), msg


def test_a_tampered_file_is_one_line_naming_it_through_the_cli(saved, tmp_path):
    doc = json.loads(saved["plan"].read_text())
    doc["stages"][0]["predicted_s"]["cpu"] = "slow"
    bad, out = tmp_path / "plan.json", tmp_path / "r.md"
    bad.write_text(json.dumps(doc))
    res = placer_report("--plan", bad, "-o", out)
    err = res.stderr.strip()
    assert res.returncode != 0 and "\n" not in err and not out.exists()
    assert f"the plan file {str(bad)!r}" in err and f"stages[0].predicted_s.cpu (stage {doc['stages'][0]['name']!r})" in err


def test_a_tampered_report_json_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "r.json"
    report(path, run=fx.inputs()[2])
    doc = json.loads(path.read_text())
    doc["meta"]["devices"][0]["present"] = "perhaps"
    path.write_text(json.dumps(doc))
    with pytest.raises(ReportInputError, match=r"^the report file .*r\.json' is not a valid report: "
                                               r"field meta\.devices\[0\]\.present \(device 'cpu'\): Input should be"):
        load_facts(path)


# -- a renamed field cannot go unnoticed -----------------------------------------------------
def _keys(doc: dict) -> list[tuple[str, ...]]:
    """Paths of the keys of a saved model: its own, and those of its first stage and transfer records."""
    out = [(k,) for k in doc]
    for group in ("stages", "transfers"):
        if isinstance(doc.get(group), list) and doc[group]:
            out += [(group, k) for k in doc[group][0]]
    if isinstance(doc.get("schedule"), dict):
        out += [("schedule", k) for k in doc["schedule"]]
    return out


@pytest.mark.parametrize("name", ["plan", "run", "costs"])
def test_every_key_of_a_saved_input_is_read_or_refused_when_renamed(saved, tmp_path, name):
    """No key of a saved plan, run or cost table can be renamed without the report saying which."""
    what = {"plan": "plan", "run": "run", "costs": "cost table"}[name]
    original = json.loads(saved[name].read_text())
    for path in _keys(original):
        doc = json.loads(saved[name].read_text())
        node = doc
        for k in path[:-1]:
            node = node[k][0] if isinstance(node[k], list) else node[k]
        node[path[-1] + "_renamed"] = node.pop(path[-1])
        bad = tmp_path / f"{name}.json"
        bad.write_text(json.dumps(doc))
        given = {"plan": saved["plan"], "costs": bad} if name == "costs" else {name: bad}
        with pytest.raises(ReportInputError) as info:
            collect(**given)
        msg = str(info.value)
        assert msg.startswith(f"the {what} file {str(bad)!r} is not a valid {what}: field "), (path, msg)
        assert path[-1] in msg, (path, msg)


@pytest.fixture
def reads(monkeypatch):
    """``(class name, attribute)`` of every attribute the report's own code reads on an input model."""
    seen: set[tuple[type, str]] = set()

    def recording(cls):
        base = cls.__getattribute__

        def get(self, name):
            if not name.startswith("__") and sys._getframe(1).f_code.co_filename.startswith(REPORT_CODE):
                seen.add((cls, name))
            return base(self, name)

        return get

    for cls in MODELS:
        monkeypatch.setattr(cls, "__getattribute__", recording(cls))
    return seen


def test_the_report_reads_only_declared_fields_of_its_input_models(reads):
    """A field renamed in a model fails here by name, even where a default would have hidden it."""
    p, chosen, run, cpu, gpu, costs = fx.inputs()
    target = TargetPlan(device="h200", label="NVIDIA H200", placement=dict(chosen.placement), predicted_s=0.1)
    preds = {"train": {"gpu:0": Prediction(value=0.001, rel_error=0.3, label="roofline")}}
    collect(plan=chosen, run=run, baselines={"all_cpu": cpu, "all_gpu": gpu}, pipeline=p, costs=costs,
            inventory=discover(), predictions=preds, target=target)
    collect(plan=chosen)
    collect(run=run)
    undeclared = []
    for cls, name in reads:
        declared = (cls.model_fields if hasattr(cls, "model_fields") else
                    {f.name for f in dataclasses.fields(cls)})
        if name not in declared and not callable(getattr(cls, name, None)) \
                and not isinstance(getattr(cls, name, None), property):
            undeclared.append(f"{cls.__name__}.{name}")
    assert not undeclared, f"the report reads attributes its models do not declare: {undeclared}"
    # inputs are read field by field, never turned back into dicts
    assert not {n for _, n in reads if n.startswith("model_dump")}
    names = {(c.__name__, n) for c, n in reads}
    assert {("StageChoice", "reason"), ("StageChoice", "crossover_size"), ("StageCost", "loop_carried"),
            ("Plan", "baselines"), ("Run", "makespan_s"), ("TransferRecord", "pinned"), ("StageRecord", "status"),
            ("Prediction", "label"), ("DeviceSpec", "kind")} <= names
