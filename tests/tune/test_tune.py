"""``placer tune``: the hook inside unchanged scripts, the refusals, the search and ``--apply``.

Each script under ``tests/tune/tune_scripts/`` is written as a user writes one and runs as a
subprocess, as ``placer tune`` runs it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from placer.data.stream import LoaderSettings
from placer.tune.runs import TuneError, python_command, run_script
from placer.tune.search import holding_loader, refuse_unusable, settings_dict, tune
from placer.tune.words import describe, recommendation, to_json

SCRIPTS = Path(__file__).parent / "tune_scripts"
PY = sys.executable


def trial(script: str, *args: str, settings=None, target=None, **more):
    cmd = [PY, str(SCRIPTS / script), *args]
    spec = {"mode": "trial", "target": target, "settings": settings, "warmup": 2, "min_batches": 4, "min_s": 0.2,
            "stop_s": 30, **more}
    return cmd, run_script(cmd, spec, timeout_s=120)


def applied(script: str, *args: str, site=None, settings=None):
    cmd = [PY, str(SCRIPTS / script), *args]
    return run_script(cmd, {"mode": "apply", "target": site, "settings": settings}, timeout_s=120, trial=False)


def line_of(script: str, text: str) -> int:
    """The line of ``script`` that holds ``text`` (where the script builds a loader)."""
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(k for k, line in enumerate(lines, 1) if text in line)


def last_json(run) -> dict:
    return json.loads(run.output_tail.strip().splitlines()[-1])


# each script's run as written, shared by the tests that need its loader's place or its batches
@pytest.fixture(scope="module")
def trainer_observed():
    return trial("trainer_class.py")[1]


@pytest.fixture(scope="module")
def sleepy_observed():
    return trial("sleepy_train.py")[1]


@pytest.fixture(scope="module")
def sleepy_as_written():
    return applied("sleepy_train.py", "--epochs", "3")


@pytest.mark.slow
def test_the_loader_that_holds_the_loop_is_picked_and_the_validation_loader_reported():
    cmd, run = trial("train_val.py", "3")
    refuse_unusable(run, cmd)
    rec, others = holding_loader(run)
    assert rec["site"].endswith(f"train_val.py:{line_of('train_val.py', 'train_loader = DataLoader')}")
    val = f"train_val.py:{line_of('train_val.py', 'val_loader = DataLoader')}"
    assert [o["site"] for o in others] and all(o["site"].endswith(val) for o in others)
    assert run.report["stopped"] == "batches"
    assert rec["counted"] >= 4 and rec["counted_s"] >= 0.2


@pytest.mark.slow
def test_a_loader_built_inside_a_trainer_class_is_found_where_the_class_builds_it(trainer_observed):
    rec, _ = holding_loader(trainer_observed)
    assert rec["site"].endswith(f"trainer_class.py:{line_of('trainer_class.py', 'return DataLoader(')}")
    assert rec["wait_s"] > 0.5 * rec["iterated_s"]  # every sample sleeps: the loop waits for data


@pytest.mark.slow
def test_a_setting_is_applied_when_the_loader_is_built_and_the_script_does_not_know(trainer_observed):
    site = holding_loader(trainer_observed)[0]["site"]
    s = {"num_workers": 2, "worker_kind": "processes", "prefetch_factor": 4, "persistent_workers": True,
         "pin_memory": False, "torch_threads": 1}
    _, run = trial("trainer_class.py", settings=s, target=site)
    rec = run.loader(site)
    assert rec["applied"] == {"num_workers": 2, "pin_memory": False, "prefetch_factor": 4, "persistent_workers": True}
    assert rec["torch_threads"] == 1
    # the script's own arguments are recorded as it wrote them
    assert rec["arguments"]["batch_size"] == "8"


def test_a_stopped_trial_leaves_no_process_behind(sleepy_observed):
    site = holding_loader(sleepy_observed)[0]["site"]
    s = {"num_workers": 2, "worker_kind": "processes", "prefetch_factor": 2, "persistent_workers": True,
         "pin_memory": False, "torch_threads": None}
    _, run = trial("sleepy_train.py", "--epochs", "50", settings=s, target=site)
    assert run.report["stopped"] == "batches"
    left = [p for p in psutil.process_iter(["cmdline"]) if any("sleepy_train.py" in c for c in p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.slow
def test_the_checkpoint_is_skipped_while_tuned_and_written_when_applied(tmp_path):
    out = tmp_path / "model.pt"
    _, run = trial("checkpoint.py", str(out))
    assert run.report["loaders"] and not out.exists()
    run = applied("checkpoint.py", str(out))
    assert run.returncode == 0 and out.exists()


@pytest.mark.parametrize("kind", [pytest.param("processes", marks=pytest.mark.slow), "threads"])
def test_an_applied_run_reads_the_batches_the_script_reads_as_written(kind, sleepy_as_written):
    site = holding_loader(sleepy_as_written)[0]["site"]
    s = {"num_workers": 2, "worker_kind": kind, "prefetch_factor": 2, "persistent_workers": kind == "processes",
         "pin_memory": False, "torch_threads": 1}
    tuned = applied("sleepy_train.py", "--epochs", "3", site=site, settings=s)
    assert tuned.loader(site)["applied"]["num_workers"] == 2
    assert last_json(tuned)["digest"] == last_json(sleepy_as_written)["digest"]


@pytest.mark.slow
def test_a_script_that_fails_before_its_first_batch_is_refused_with_its_own_error():
    cmd, run = trial("crash.py")
    with pytest.raises(TuneError, match=r"the script failed before its first batch \(FileNotFoundError") as err:
        refuse_unusable(run, cmd)
    assert "no/such/train.csv" in str(err.value)


def test_a_script_that_never_iterates_a_loader_is_refused_naming_the_loaders_it_built():
    cmd, run = trial("no_loader.py")
    with pytest.raises(TuneError, match=r"built 1 DataLoader \(.*no_loader.py:\d+\) but iterated none"):
        refuse_unusable(run, cmd)


@pytest.mark.slow
def test_a_multi_process_launch_is_refused():
    cmd, run = trial("spawn.py")
    with pytest.raises(TuneError, match="torch.multiprocessing.spawn: tune one rank"):
        refuse_unusable(run, cmd)
    with pytest.raises(TuneError, match="launches several processes"):
        python_command(["torchrun", "--nproc-per-node", "2", "train.py"])


def test_commands_that_are_not_python_are_refused_and_a_script_alone_runs_with_this_python(tmp_path):
    with pytest.raises(TuneError, match="is not a Python command"):
        python_command(["bash", "train.sh"])
    with pytest.raises(TuneError, match="no command to tune"):
        python_command([])
    assert python_command(["train.py", "--epochs", "3"]) == [sys.executable, "train.py", "--epochs", "3"]
    script = tmp_path / "run"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert python_command([str(script)]) == [str(script)]


@pytest.mark.slow
def test_tune_recommends_workers_for_a_loop_that_waits_on_slow_samples_and_apply_keeps_its_batches(tmp_path,
                                                                                                     sleepy_as_written):
    """Every sample sleeps 3 ms (storage), the step is light: workers must win by far, on any load."""
    cmd = python_command([str(SCRIPTS / "sleepy_train.py"), "--epochs", "3"])
    # two settings besides the script's own keep the test short; the search over the drop-in's whole space
    # is the same loop (benchmarks/tune_plain.py runs it on the plain scripts)
    space = [LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True),
             LoaderSettings(num_workers=2, prefetch_factor=2, worker_threads=True)]
    # the settings alone: the cache inside the Dataset is searched and weighed in tests/tune/test_tune_cache.py
    result = tune(cmd, budget_s=60, window_s=0.3, space=space, cache=False)
    data = to_json(result)
    assert data["verdict"]["waits_for_data"] is True
    assert data["change"] is True and data["recommended"]["num_workers"] >= 1
    assert data["speedup"] >= 1.5
    assert len(data["trials"][0]["runs"]) >= 2  # the script as written ran in the interleaved rounds too
    assert data["used_s"] <= 60 + 30  # a run under way at the budget's end is finished, not more
    assert {(t["num_workers"], t["worker_kind"]) for t in data["trials"]} == {(0, "main process"), (2, "processes"), (2, "threads")}
    text = "\n".join(describe(result))
    assert "Recommended:" in text and "as written" in text
    saved = tmp_path / "tuned.json"
    saved.write_text(json.dumps(data))
    site, settings = recommendation(json.loads(saved.read_text()))
    assert settings == settings_dict(result.recommended.settings) | {"cache": None}
    tuned = applied("sleepy_train.py", "--epochs", "3", site=site, settings=settings)
    assert last_json(tuned)["digest"] == last_json(sleepy_as_written)["digest"]


def test_the_cli_refuses_a_bad_saved_recommendation_and_a_non_python_command(tmp_path):
    from placer.cli import app

    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(app, ["tune", "--apply", str(bad), "--", PY, str(SCRIPTS / "train_val.py")])
    assert r.exit_code == 1 and "not a placer tune result" in r.output
    r = CliRunner().invoke(app, ["tune", "--", "ls", "-l"])
    assert r.exit_code == 1 and "is not a Python command" in r.output
    r = CliRunner().invoke(app, ["tune", "--budget-s", "-1", "--", PY, "x.py"])
    assert r.exit_code == 2


def test_the_tuning_environment_is_set_only_in_trials():
    code = "import os, json; print(json.dumps(os.environ.get('PLACER_TUNING')))"
    t = run_script([PY, "-c", code], {"mode": "trial"}, timeout_s=60)
    a = run_script([PY, "-c", code], {"mode": "apply"}, timeout_s=60, trial=False)
    assert json.loads(t.output_tail) == "1" and json.loads(a.output_tail) is None
    assert os.environ.get("PLACER_TUNING") is None


@pytest.mark.slow
def test_each_run_measures_the_memory_of_the_script_and_of_its_worker_processes(sleepy_observed):
    first = sleepy_observed
    site = holding_loader(first)[0]["site"]
    s = {"num_workers": 2, "worker_kind": "processes", "prefetch_factor": 2, "persistent_workers": True,
         "pin_memory": False, "torch_threads": None}
    _, run = trial("sleepy_train.py", "--epochs", "20", settings=s, target=site)
    rec = run.loader(site)
    end = rec["memory_end"]
    assert end["processes"] == 2 and end["workers"] > 2**20  # two worker processes, each with its own pages
    assert end["main"] > 2**20 and rec["memory_start"]["processes"] == 2
    none = holding_loader(first)[0]
    assert none["memory_end"]["processes"] == 0 and none["memory_end"]["workers"] == 0


def test_recommending_persistent_workers_beside_a_generator_says_what_it_changes_in_the_batches():
    from placer.tune.search import persistent_note

    chosen = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True)
    user = LoaderSettings(num_workers=0)
    note = persistent_note(chosen, user, {"generator": "<torch._C.Generator object at 0x1>"})
    assert len(note) == 1 and "second epoch" in note[0] and "--apply" in note[0]
    assert persistent_note(chosen, user, {}) == []  # no generator of its own: nothing drawn from one
    assert persistent_note(chosen.model_copy(update={"persistent_workers": False}), user,
                           {"generator": "<g>"}) == []
