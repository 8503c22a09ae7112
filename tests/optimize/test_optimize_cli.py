"""``placer plan`` from the command line, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from placer.optimize import CostTable, Plan, plan
from warm_cli import run as run_placer

TABLE = {
    "devices": {"cpu": {"kind": "cpu", "workers": 2, "price_per_hour": 0.2},
                "gpu": {"kind": "gpu", "memory_bytes": 8.0e10, "price_per_hour": 2.5}},
    "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10},
             "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10}},
    "size": 4096,
    "stages": [
        {"name": "load", "kind": "cleaning", "input_bytes": 6.4e8, "output_bytes": 6.4e8,
         "seconds": {"cpu": 0.1}},
        {"name": "clean", "kind": "cleaning", "inputs": ["load"], "output_bytes": 6.4e8,
         "seconds": {"cpu": 0.4, "gpu": 0.002}, "peak_bytes": {"gpu": 1.3e9}},
        {"name": "stats", "kind": "preprocessing", "inputs": ["clean"], "output_bytes": 1e3,
         "seconds": {"cpu": 0.2, "gpu": 0.01}},
        {"name": "train", "kind": "training", "inputs": ["clean", "stats"], "output_bytes": 1e6,
         "seconds": {"cpu": 3.0, "gpu": 0.1}},
    ],
}


def placer(*args):
    return run_placer([*args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(TABLE))
    return path


def test_plan_costs_json_matches_the_library(table_file, tmp_path):
    out = tmp_path / "plan.json"
    r = placer("plan", "--costs", str(table_file), "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    lib = plan(CostTable.model_validate(TABLE))
    assert doc["placement"] == lib.placement
    assert doc["predicted_makespan_s"] == pytest.approx(lib.predicted_makespan_s)
    assert doc["objective"] == "makespan" and doc["method"] == "exact"
    assert [s["name"] for s in doc["stages"]] == ["load", "clean", "stats", "train"]
    assert all(s["reason"] for s in doc["stages"])
    assert doc["baselines"]["all_gpu"] is None and doc["baselines"]["all_cpu"] > doc["predicted_makespan_s"]
    assert Plan.load(out).placement == lib.placement


def test_plan_prints_a_table_with_reasons_and_baselines(table_file):
    r = placer("plan", "--costs", str(table_file), "--objective", "cost", "--deadline-s", "1")
    assert r.returncode == 0, r.stderr
    for text in ("cost plan", "clean", "rule of thumb", "cost per run"):
        assert text in r.stdout


def test_a_large_plan_prints_one_plain_line_per_stage_with_its_device_and_reason(tmp_path):
    from placer.cli.plan import PLAIN_ROWS

    n = PLAIN_ROWS + 5
    stages = [{"name": f"s{i}", "inputs": [f"s{i - 1}"] if i else [], "output_bytes": 1e3,
               "seconds": {"cpu": 0.01 * (1 + i % 3), "gpu": 0.002 if i % 2 else 0.05}} for i in range(n)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps({**TABLE, "stages": stages}))
    r = placer("plan", "--costs", str(path))
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.startswith("s") and ln[1:2].isdigit()}
    assert len(lines) == n
    doc = json.loads(placer("plan", "--costs", str(path), "--json").stdout)
    assert {s["name"]: s["device"] for s in doc["stages"]} == {k: v[1] for k, v in lines.items()}
    assert not set("┏┃│╭") & set(r.stdout)   # plain columns, no frame


@pytest.mark.parametrize(
    "edit, args, expected",
    [
        (lambda t: t["stages"][1].update(inputs=["lod"]), [], "stage 'clean' has unknown input 'lod'"),
        (lambda t: t["stages"][3].update(pin="gpu:2"), [], "'train' is pinned to 'gpu:2'"),
        (None, ["--objective", "cost", "--deadline-s", "0.001"], "no placement meets the deadline"),
        (None, ["--size", "100"], "holds costs at size 4096, not 100"),
        (None, ["--method", "fast"], "unknown --method 'fast'"),
    ],
)
@pytest.mark.slow
def test_plan_errors_are_one_clear_line(tmp_path, edit, args, expected):
    doc = json.loads(json.dumps(TABLE))
    if edit:
        edit(doc)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    r = placer("plan", "--costs", str(path), *args)
    assert r.returncode == (2 if args[:1] == ["--method"] else 1)  # 2: a usage error
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placer: error: ") and expected in lines[0], r.stderr


def test_plan_needs_something_to_plan():
    r = placer("plan")
    assert r.returncode == 2 and "give a PIPELINE, --profile FILE or --costs FILE" in r.stderr


def test_planning_imports_no_device_library(table_file):
    code = (
        "import sys; from placer.optimize import CostTable, plan; "
        f"plan(CostTable.load({str(table_file)!r}), objective='throughput'); "
        "print([m for m in ('torch', 'dask', 'numba') if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
