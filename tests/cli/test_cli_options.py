"""Options every command shares: --version, -v/-q, -p/--param; the library's logging and progress."""

from __future__ import annotations

import ast
import io
import json
import logging
import sys
from pathlib import Path

import pytest

from placer.cli.options import convert, parse_params
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[2]


def placer(*args, env=None, cwd=ROOT):
    return run_placer([*args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_version_prints_the_installed_version():
    from importlib.metadata import version

    r = placer("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"placer {version('placer')}"


@pytest.mark.slow
def test_verbose_logs_the_steps_and_quiet_hides_them(tmp_path):
    args = ["plan", "pipelines/tabular.py", "--size", "2000", "--budget-s", "3", "--json"]
    loud = placer("-v", *args)
    assert loud.returncode == 0, loud.stderr
    assert "placer: profiling tabular at sizes" in loud.stderr
    json.loads(loud.stdout)  # the log goes to stderr: stdout stays one JSON document
    quiet = placer("-q", *args)
    assert quiet.returncode == 0, quiet.stderr
    assert "profiling tabular" not in quiet.stderr


def test_the_library_never_prints():
    found = []
    for path in sorted((ROOT / "placer").rglob("*.py")):
        if "cli" in path.relative_to(ROOT / "placer").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "print() in the library (log instead): " + ", ".join(found)


def test_the_library_logs_to_the_placer_logger(caplog):
    import placer

    p = placer.Pipeline("logged", size=8)
    p.add(name="make", kind="cleaning", fn=lambda device, n=8: list(range(n)))
    with caplog.at_level(logging.DEBUG, logger="placer"):
        placer.profile(p, cache=False, budget_s=3, devices=["cpu"], progress=False)
    names = {r.name for r in caplog.records}
    assert "placer.profile.profiler" in names
    assert any("stage 'make' on cpu" in r.getMessage() for r in caplog.records)


def test_placer_warnings_share_one_base_category():
    import warnings

    import placer
    from placer.profile import ProfileCacheWarning
    from placer.timing import NoisyMeasurementWarning

    assert issubclass(NoisyMeasurementWarning, placer.PlacerWarning)
    assert issubclass(ProfileCacheWarning, placer.PlacerWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", placer.PlacerWarning)
        with pytest.raises(ProfileCacheWarning):
            warnings.warn("cache", ProfileCacheWarning)


# -- -p/--param ------------------------------------------------------------------------------------
def build(size=None, *, epochs: int = 3, lr: float = 0.1, fast: bool = False, name="x", seed: int | None = None):
    return None


def test_params_are_typed_from_build_annotations_and_defaults():
    got = parse_params(build, ["epochs=5", "lr=1e-3", "fast=yes", "name=abc", "seed=7"])
    assert got == {"epochs": 5, "lr": 0.001, "fast": True, "name": "abc", "seed": 7}
    assert type(got["epochs"]) is int and type(got["lr"]) is float


def test_an_unknown_param_names_it_and_what_build_accepts():
    with pytest.raises(ValueError, match=r"no parameter 'epoch'; it accepts: epochs, lr, fast, name, seed"):
        parse_params(build, ["epoch=5"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_params(build, ["epochs"])
    with pytest.raises(ValueError, match="epochs takes int"):
        parse_params(build, ["epochs=many"])


def test_build_with_var_keywords_takes_any_name():
    def open_build(size=None, **params):
        return None

    assert parse_params(open_build, ["k=[1, 2]", "s=text"]) == {"k": [1, 2], "s": "text"}
    assert convert("off", bool) is False


@pytest.mark.slow
def test_run_passes_params_to_build_and_the_digest_follows_the_seed():
    args = ["run", "pipelines/tabular.py", "--size", "2000", "--placement", "all=cpu", "--json"]
    digests = {}
    for seed in ("0", "1"):
        r = placer(*args, "-p", f"seed={seed}")
        assert r.returncode == 0, r.stderr
        digests[seed] = json.loads(r.stdout)["outputs_digest"]
    plain = placer(*args)
    assert json.loads(plain.stdout)["outputs_digest"] == digests["0"]  # seed=0 is build()'s default
    assert digests["1"] != digests["0"]


def test_run_refuses_an_unknown_param_with_exit_2():
    r = placer("run", "pipelines/tabular.py", "--placement", "all=cpu", "-p", "sed=1")
    assert r.returncode == 2
    assert "no parameter 'sed'" in r.stderr and "epochs, batch, lr, seed" in r.stderr


@pytest.mark.slow
def test_profile_builds_every_size_with_the_params(tmp_path):
    pipe = tmp_path / "scaled.py"
    pipe.write_text(
        "from placer import Pipeline\n"
        "def build(size=None, *, factor: int = 1):\n"
        "    p = Pipeline('scaled', size=size or 64)\n"
        "    p.add(name='make', kind='cleaning', fn=lambda device, n=(size or 64) * factor: list(range(n)))\n"
        "    return p\n")
    r = placer("profile", str(pipe), "--size", "640", "--budget-s", "3", "--devices", "cpu", "--json",
               "-p", "factor=3")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pipeline"] == "scaled" and doc["measured_sizes"]


# -- progress --------------------------------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _slow_pipeline(size=None):
    import time

    import placer

    n = size or 64
    p = placer.Pipeline("slow", size=n)
    p.add(name="wait", kind="cleaning", fn=lambda device, n=n: time.sleep(0.02 + n * 1e-4) or n)
    return p


@pytest.mark.slow
def test_profiling_progress_shows_percent_and_eta_in_a_terminal(monkeypatch):
    import placer

    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    placer.profile(_slow_pipeline, size=640, cache=False, budget_s=4, devices=["cpu"], progress=None)
    shown = term.getvalue()
    assert "%" in shown and "ETA" in shown and "profiling slow" in shown


@pytest.mark.slow
def test_advise_shows_the_profiling_task_with_percent_and_eta(monkeypatch):
    import placer
    from placer.cli.advise import progress_steps

    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    step, display = progress_steps(True)
    with display:
        placer.advise(_slow_pipeline(640), budget_s=4, baselines=False, target="none", step=step, progress=display,
                      cache=False)
    lines = [ln for ln in term.getvalue().replace("\r", "\n").splitlines() if "profiling slow" in ln]
    assert any("%" in ln and "ETA" in ln for ln in lines), lines[-3:]


def test_the_time_left_never_passes_the_budget():
    import time

    from placer.progress import time_left

    class Task:
        time_remaining = 600.0
        fields = {"deadline": time.monotonic() + 5}

    assert 4 < time_left(Task()) <= 5
    Task.fields = {}
    assert time_left(Task()) == 600.0


def test_profiling_progress_is_silent_under_quiet(monkeypatch):
    import placer
    from placer.log import configure

    import warnings

    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    log = logging.getLogger("placer")
    monkeypatch.setattr(log, "handlers", list(log.handlers))  # restored afterwards
    monkeypatch.setattr(log, "level", log.level)
    with warnings.catch_warnings():
        configure(-1, io.StringIO())
        placer.profile(_slow_pipeline, size=640, cache=False, budget_s=1, devices=["cpu"], progress=None)
    assert term.getvalue() == ""


def test_profiling_progress_is_silent_when_not_a_terminal(capsys):
    import placer

    placer.profile(_slow_pipeline, size=640, cache=False, budget_s=1, devices=["cpu"], progress=None)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


# -- global options after the command ------------------------------------------------------------
FAILS = '''
import numpy as np
from placer import Pipeline

def _deep_in_my_code(x):
    raise ValueError("the stage's own error")

def build(size=None):
    p = Pipeline("fails", size=10)
    p.add(name="make", cpu=lambda: np.ones(3))
    p.add(name="broken", cpu=lambda make: _deep_in_my_code(make), inputs={"make": "make"})
    return p
'''


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_before_or_after_the_command_shows_the_stages_own_traceback(tmp_path, where):
    f = tmp_path / "fails.py"
    f.write_text(FAILS)
    run = ["run", str(f), "--placement", "all=cpu"]
    r = placer(*(["--traceback", *run] if where == "before" else [*run, "--traceback", "-v"]))
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "in _deep_in_my_code" in r.stderr and str(f) in r.stderr
    assert "ValueError: the stage's own error" in r.stderr
    assert r.stderr.strip().splitlines()[-1] == "placer: error: stage 'broken' failed on cpu: ValueError: the stage's own error"


def test_without_traceback_one_line_says_how_to_see_it(tmp_path):
    f = tmp_path / "fails.py"
    f.write_text(FAILS)
    r = placer("run", str(f), "--placement", "all=cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "placer: error: stage 'broken' failed on cpu: ValueError: the stage's own error "
        "(rerun with --traceback to see your code's traceback)"]


@pytest.mark.slow
def test_verbose_and_quiet_after_the_command_act_as_before_it():
    from typer.testing import CliRunner

    from placer.cli import app

    args = ["plan", "pipelines/tabular.py", "--size", "2000", "--budget-s", "3", "--json"]
    loud = placer(*args, "-v")
    assert loud.returncode == 0, loud.stderr
    assert "placer: profiling tabular at sizes" in loud.stderr
    json.loads(loud.stdout)
    quiet = placer(*args, "-q")
    assert quiet.returncode == 0 and "placer:" not in quiet.stderr, quiet.stderr
    # -v before and -v after add up: debug detail
    from placer.cli.app import options

    CliRunner().invoke(app, ["-v", "schema", "plan", "-v"])
    assert options.verbose == 2 and not options.quiet
    CliRunner().invoke(app, ["schema", "plan"])  # a new command starts from nothing
    assert options.verbose == 0
    logging.getLogger("placer").setLevel(logging.NOTSET)


def test_every_command_takes_the_global_options_after_it():
    from typer.testing import CliRunner

    from placer.cli import app

    for info in app.registered_commands:
        r = CliRunner().invoke(app, [info.name, "--help"])
        assert r.exit_code == 0, (info.name, r.output)
        for opt in ("--traceback", "--verbose", "--quiet"):
            assert opt in r.output, (info.name, opt)
