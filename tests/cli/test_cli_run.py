"""``placer run`` and ``placer devices`` from the command line, as a user runs them."""

from __future__ import annotations

import json
import os

import pytest
from warm_cli import run as run_placer


def placer(*args, env=None, cwd=None):
    return run_placer([*args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def cpu_run():
    r = placer("run", "pipelines/tabular.py", "--size", "3000", "--placement", "all=cpu", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_run_json_has_the_documented_fields(cpu_run):
    doc = cpu_run
    assert doc["pipeline"] == "tabular" and doc["size"] == 3000
    assert [s["name"] for s in doc["stages"]] == ["load", "clean", "features", "train", "predict"]
    for s in doc["stages"]:
        assert s["device"] == "cpu"
        assert 0 <= s["start_s"] <= s["end_s"] <= doc["makespan_s"]
        assert s["seconds"] == pytest.approx(s["end_s"] - s["start_s"])
    assert doc["transfers"] == []
    assert len(doc["outputs_digest"]) == 16


def test_simulated_device_gives_the_same_digest(cpu_run, sim_env):
    for spec in ("all=gpu-sim", "load=cpu,clean=gpu-sim,features=cpu,train=gpu-sim,predict=cpu"):
        r = placer("run", "pipelines/tabular.py", "--size", "3000", "--placement", spec, "--json", env=sim_env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["outputs_digest"] == cpu_run["outputs_digest"], spec
        assert doc["transfers"], "a placement across devices must move data"
        assert {t["src"] for t in doc["transfers"]} | {t["dst"] for t in doc["transfers"]} <= {"host", "gpu-sim"}


def test_all_gpu_without_a_gpu_fails_with_one_line_naming_a_stage(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PLACER_TEST_DEVICES"}
    out = tmp_path / "run.json"
    r = placer("run", "pipelines/tabular.py", "--placement", "all=gpu", "-o", str(out), env=env)
    if "gpu:0" in placer("devices", "--json", env=env).stdout:
        pytest.skip("this machine has a GPU; the no-GPU error cannot happen here")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "stage 'load'" in lines[0] and "no GPU is available" in lines[0]
    assert r.stdout == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_gpu_sim_is_refused_without_the_test_flag():
    env = {k: v for k, v in os.environ.items() if k != "PLACER_TEST_DEVICES"}
    r = placer("run", "pipelines/requests.py", "--placement", "all=gpu-sim", env=env)
    assert r.returncode != 0
    assert "PLACER_TEST_DEVICES=1" in r.stderr and "stage 'request'" in r.stderr


@pytest.mark.slow
def test_bad_placement_and_bad_pipeline_errors():
    r = placer("run", "pipelines/tabular.py", "--placement", "trian=cpu")
    assert r.returncode != 0 and "stage 'trian'" in r.stderr
    r = placer("run", "pipelines/nope.py")
    assert r.returncode != 0 and "does not exist" in r.stderr


def test_module_function_reference_and_output_file(tmp_path, sim_env):
    out = tmp_path / "run.json"
    r = placer("run", "pipelines.requests:build", "--size", "4", "--placement", "all=cpu", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["size"] == 4 and len(doc["stages"]) == 4


@pytest.mark.slow
def test_devices_never_calls_the_simulated_device_a_gpu(sim_env):
    doc = json.loads(placer("devices", "--json", env=sim_env).stdout)
    sim = [d for d in doc["devices"] if d["name"] == "gpu-sim"]
    assert sim and sim[0]["kind"] == "sim" and "not a GPU" in sim[0]["label"]
    env = {k: v for k, v in os.environ.items() if k != "PLACER_TEST_DEVICES"}
    doc = json.loads(placer("devices", "--json", env=env).stdout)
    assert all(d["name"] != "gpu-sim" for d in doc["devices"])
    text = placer("devices", env={**sim_env, "COLUMNS": "200"}).stdout
    assert "simulated (not a GPU)" in text


def test_broken_pipeline_files_fail_with_one_line(tmp_path):
    bad = tmp_path / "syntax.py"
    bad.write_text("def build(size=None):\n    return (\n")
    r = placer("run", str(bad), "--placement", "all=cpu")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "failed to import: SyntaxError" in r.stderr
    boom = tmp_path / "boom.py"
    boom.write_text("def build(size=None):\n    raise RuntimeError('no data at size %s' % size)\n")
    r = placer("run", str(boom), "--size", "5", "--placement", "all=cpu")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "build(size=5) failed: RuntimeError: no data at size 5" in r.stderr
