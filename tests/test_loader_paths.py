"""Where pipeline references are looked up: a user's own ``pipelines`` package, helper
modules next to a pipeline file, and ``sys.path`` left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from placer.errors import PlacerError
from placer.executor import execute
from placer.loader import load_builder, load_pipeline

ROOT = Path(__file__).resolve().parents[1]

MINE = '''"""A user's pipeline: make -> double -> total."""

import numpy as np

from placer import Pipeline


def _make(n):
    return np.arange(n, dtype=np.float64)


def _double(mine_make):
    return mine_make * 2


def _total(mine_double):
    return np.array([mine_double.sum()])


def build(size=None):
    n = int(size or 10)
    p = Pipeline("mine", size=n)
    p.add(name="mine_make", kind="other", cpu=_make, params={"n": n})
    p.add(name="mine_double", kind="other", cpu=_double, inputs=["mine_make"])
    p.add(name="mine_total", kind="other", cpu=_total, inputs=["mine_double"])
    return p
'''


@pytest.fixture
def fresh_modules():
    """Names for modules a test creates, dropped from ``sys.modules`` afterwards."""
    names: list[str] = []

    def name(stem: str) -> str:
        names.append(f"{stem}_{uuid.uuid4().hex[:8]}")
        return names[-1]

    yield name
    for mod in list(sys.modules):
        if any(mod == n or mod.startswith(n + ".") for n in names):
            del sys.modules[mod]


def _user_project(tmp_path: Path) -> Path:
    pkg = tmp_path / "pipelines"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""The user\'s own pipelines."""\n')
    (pkg / "mine.py").write_text(MINE)
    return tmp_path


# the placer command does not put the current directory on sys.path; python -P -m does the same
@pytest.mark.parametrize("python", [["-m"], ["-P", "-m"]], ids=["python -m", "like the placer command"])
@pytest.mark.slow
def test_a_users_own_pipelines_package_is_not_shadowed(tmp_path, sim_env, python):
    project = _user_project(tmp_path)
    # the repository (with the bundled pipelines/ folder) is importable too, as in development
    env = {**sim_env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), sim_env.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, *python, "placer", "run", "pipelines.mine:build", "--size", "10",
                        "--placement", "all=cpu", "--json"],
                       capture_output=True, text=True, env=env, cwd=project, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pipeline"] == "mine" and doc["size"] == 10
    assert [s["name"] for s in doc["stages"]] == ["mine_make", "mine_double", "mine_total"]
    assert all(s["device"] == "cpu" for s in doc["stages"])


def test_a_pipeline_file_imports_a_helper_next_to_it_and_sys_path_is_restored(tmp_path, fresh_modules):
    helper = fresh_modules("helpers")
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / f"{helper}.py").write_text("def triple(x):\n    return x * 3\n")
    (folder / "flow.py").write_text(
        f"import numpy as np\n"
        f"import {helper}\n"
        f"from placer import Pipeline\n"
        f"def _make(n):\n"
        f"    return np.ones(n)\n"
        f"def _triple(make):\n"
        f"    import {helper} as again  # at run time: the module loaded with the file\n"
        f"    return again.triple(make) + {helper}.triple(0)\n"
        f"def build(size=None):\n"
        f"    p = Pipeline('flow', size=size or 4)\n"
        f"    p.add(name='make', cpu=_make, params={{'n': size or 4}})\n"
        f"    p.add(name='triple', cpu=_triple, inputs=['make'])\n"
        f"    return p\n"
    )
    before = list(sys.path)
    p = load_pipeline(str(folder / "flow.py"), 5)
    assert sys.path == before
    assert sys.modules[helper].__file__ == str(folder / f"{helper}.py")
    run = execute(p, "all=cpu")
    assert run.final_outputs["triple"].tolist() == [3.0] * 5


def test_a_failing_pipeline_file_leaves_sys_path_as_it_was(tmp_path, fresh_modules):
    bad = tmp_path / "bad.py"
    bad.write_text(f"import {fresh_modules('absent')}\n")
    before = list(sys.path)
    with pytest.raises(PlacerError, match="failed to import: ModuleNotFoundError"):
        load_builder(str(bad))
    assert sys.path == before


def test_a_module_reference_is_found_in_the_current_directory_only_while_it_loads(tmp_path, monkeypatch,
                                                                                    fresh_modules):
    name = fresh_modules("usermod")
    (tmp_path / f"{name}.py").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    build = load_builder(f"{name}:build")
    assert sys.path == before
    assert str(tmp_path) not in sys.path
    assert build.__module__ == name and build(3).size == 3


def test_a_missing_module_names_it_and_suggests_a_file_path(tmp_path, monkeypatch, fresh_modules):
    monkeypatch.chdir(tmp_path)
    name = fresh_modules("nowhere")
    with pytest.raises(PlacerError) as err:
        load_builder(f"{name}.flows:build")
    msg = str(err.value)
    assert f"cannot import pipeline module '{name}.flows'" in msg
    assert str(tmp_path) in msg and "pass its path, e.g. path/to/flows.py" in msg


def test_a_missing_dependency_of_a_module_is_not_blamed_on_the_reference(tmp_path, monkeypatch,
                                                                         fresh_modules):
    name, dep = fresh_modules("needsdep"), fresh_modules("dep")
    (tmp_path / f"{name}.py").write_text(f"import {dep}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlacerError) as err:
        load_builder(f"{name}:build")
    msg = str(err.value)
    assert f"No module named '{dep}'" in msg and "pass its path" not in msg


@pytest.mark.slow
def test_a_bundled_pipeline_file_imports_its_siblings_from_any_directory(tmp_path, sim_env):
    """cifar_augment.py imports ``pipelines.mnist_cnn``: found through the package's root, wherever placer runs."""
    env = {k: v for k, v in sim_env.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-P", "-m", "placer", "run", str(ROOT / "pipelines" / "cifar_augment.py"),
                          "--size", "40", "--placement", "all=cpu", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert {s["name"] for s in json.loads(res.stdout)["stages"]} >= {"augment", "train", "evaluate"}
