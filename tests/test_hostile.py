"""Hostile inputs: each is refused (or survived) with the right exit status, a message naming
the thing at fault, and nothing lost or corrupted.

Areas: the outputs digest and the cross-placement check, output paths (directories, links,
device nodes, unwritable folders), option values, cost tables and other saved JSON, pipeline
files (pydantic errors, ``sys.exit``, names that shadow the standard library), and the
escaping of every string in reports. Commands run in-process through typer's ``CliRunner``
(exit status and stderr as the ``placer`` command gives them); ``main()`` is called once
directly for its last-resort handler.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from placer import Pipeline, execute
from placer.cli import app
from placer.data.cost_table import CostTable
from placer.digest import assert_outputs_close, compare_outputs, outputs_digest
from placer.errors import CostTableError, OutputPathError
from placer.files import check_output, check_output_folder, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str):
    """``placer ARGS`` in-process: the result has ``exit_code``, ``stdout`` and ``stderr``."""
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(r) -> str:
    """The single ``placer: error:`` line of a failed command (and no traceback)."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("placer: error: "), r.stderr
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


MARKED = """
from pathlib import Path
from placer import Pipeline

MARK = Path(__file__).with_suffix(".ran")

def build(size=None):
    p = Pipeline("marked")

    @p.stage(device="cpu")
    def load():
        MARK.write_text("ran")
        return {"x": 1}

    return p
"""


@pytest.fixture()
def marked(tmp_path) -> Path:
    """A pipeline file whose one stage leaves ``<file>.ran`` behind when it runs."""
    return write(tmp_path / "marked.py", MARKED)


# -- 1. the digest covers every output's content ------------------------------------------------
def two_runs(value_for_run: list) -> list:
    """Digests of two runs of the same one-stage pipeline, returning each value in turn."""
    digests = []
    for value in value_for_run:
        p = Pipeline("one")
        p.stage(name="out", device="cpu")(lambda v=value: v)
        digests.append(execute(p, "all=cpu").outputs_digest)
    return digests


def test_two_runs_returning_different_bytes_get_different_digests():
    a, b = two_runs([b"\x00payload-1", b"\x00payload-2"])
    assert a != b
    assert two_runs([b"same", bytearray(b"same")])[0] == two_runs([b"same"])[0]


def test_numpy_integer_and_bool_scalars_are_digested_by_value():
    assert outputs_digest({"n": np.int64(1)}) != outputs_digest({"n": np.int64(2)})
    assert outputs_digest({"b": np.bool_(True)}) != outputs_digest({"b": np.bool_(False)})
    assert outputs_digest({"n": np.int64(1)}) != outputs_digest({"n": np.int32(1)})  # dtype-aware
    a, b = two_runs([np.int64(1), np.int64(2)])
    assert a != b


def test_complex_numbers_strings_and_none_are_digested_by_value():
    assert outputs_digest({"z": 1 + 2j}) != outputs_digest({"z": 1 + 3j})
    assert outputs_digest({"z": np.array([1 + 2j])}) != outputs_digest({"z": np.array([1 - 2j])})
    assert outputs_digest({"s": "a"}) != outputs_digest({"s": "b"})
    assert outputs_digest({"s": "a"}) != outputs_digest({"s": b"a"})
    assert outputs_digest({"s": None}) != outputs_digest({"s": "None"})


def test_sets_are_order_independent_but_content_sensitive():
    assert outputs_digest({"s": {3, 1, 2}}) == outputs_digest({"s": {1, 2, 3}})
    assert outputs_digest({"s": frozenset({"a", "b"})}) == outputs_digest({"s": frozenset({"b", "a"})})
    assert outputs_digest({"s": {1, 2, 3}}) != outputs_digest({"s": {1, 2, 4}})
    assert compare_outputs({"s": {1, 2}}, {"s": {1, 3}}) is not None


def test_dicts_are_insertion_order_independent():
    assert outputs_digest({"d": {"a": 1, "b": 2}}) == outputs_digest({"d": {"b": 2, "a": 1}})
    assert outputs_digest({"d": {"a": 1}}) != outputs_digest({"d": {"a": 2}})


@dataclasses.dataclass
class Result:
    label: str
    scores: np.ndarray


class Model(BaseModel):
    name: str
    size: int


class Plain:
    def __init__(self, value):
        self.value = value


def test_dataclasses_pydantic_models_and_plain_objects_are_digested_by_content():
    a, b = Result("x", np.arange(3)), Result("x", np.arange(1, 4))
    assert outputs_digest({"r": a}) != outputs_digest({"r": b})
    assert "['scores']" in compare_outputs({"r": a}, {"r": b})
    assert outputs_digest({"m": Model(name="a", size=1)}) != outputs_digest({"m": Model(name="a", size=2)})
    assert outputs_digest({"o": Plain(1)}) != outputs_digest({"o": Plain(2)})
    assert outputs_digest({"o": Plain(1)}) == outputs_digest({"o": Plain(1)})  # not the object's address


def test_pandas_frames_digest_columns_index_and_values():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1.0, 2.0], "b": ["x", "y"]})
    renamed = df.rename(columns={"b": "c"})
    changed = df.copy()
    changed.loc[1, "b"] = "z"
    assert len({outputs_digest({"t": t}) for t in (df, renamed, changed)}) == 3
    assert "'y' vs 'z'" in compare_outputs({"t": df}, {"t": changed})


class ArrayLike:
    """An array-like of another library (as cupy or xarray are): numpy reads it through ``__array__``."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def __array__(self, dtype=None, copy=None):
        return self.values


def test_lazy_dask_and_array_like_outputs_digest_as_the_values_they_hold():
    da = pytest.importorskip("dask.array")
    lazy = da.arange(12, chunks=5)
    assert outputs_digest({"a": lazy}) == outputs_digest({"a": np.arange(12)})  # not its random task names
    assert outputs_digest({"a": lazy}) != outputs_digest({"a": da.arange(1, 13, chunks=5)})
    assert compare_outputs({"a": lazy}, {"a": np.arange(12)}) is None
    assert outputs_digest({"a": ArrayLike([1, 2])}) == outputs_digest({"a": np.array([1, 2])})
    assert "vs" in compare_outputs({"a": ArrayLike([1, 2])}, {"a": ArrayLike([1, 3])})


def test_float_tolerance_is_kept_but_dtype_and_values_count():
    x = np.linspace(0.0, 1.0, 1000)
    assert outputs_digest({"y": x}) == outputs_digest({"y": x * (1 + 1e-13)})  # last bits: same digest
    assert compare_outputs({"y": x}, {"y": x * (1 + 1e-9)}) is None
    assert outputs_digest({"y": x}) != outputs_digest({"y": x.astype(np.float16)})
    widened = x.astype(np.float16).astype(np.float64)  # same dtype, float16's precision
    why = compare_outputs({"y": x}, {"y": widened})
    assert why is not None and why.startswith("output 'y'[") and "beyond rtol" in why


def test_cyclic_and_deeply_nested_outputs_do_not_crash_the_digest():
    loop: list = []
    loop.append(loop)
    deep: list = []
    cur = deep
    for _ in range(5000):
        cur.append([])
        cur = cur[0]
    assert len(outputs_digest({"loop": loop, "deep": deep})) == 16
    assert compare_outputs({"deep": deep}, {"deep": deep}) is None


def test_compare_names_the_first_differing_output_and_its_place():
    a = {"metrics": {"loss": np.float64(0.5), "labels": [1, 2, 3]}, "z": np.zeros(2)}
    b = {"metrics": {"loss": np.float64(0.5), "labels": [1, 2, 4]}, "z": np.zeros(2)}
    assert compare_outputs(a, b) == "output 'metrics'['labels'][2]: values differ (3 vs 4)"
    with pytest.raises(AssertionError, match="output 'metrics'"):
        assert_outputs_close(a, b)
    assert "different outputs" in compare_outputs({"a": 1}, {"b": 1})


def half_on_the_gpu() -> Pipeline:
    """A sink that is float64 on the CPU and float16 on the (simulated) GPU."""
    p = Pipeline("half")

    @p.stage(device="cpu")
    def load():
        return np.linspace(0.0, 1.0, 4096)

    @p.stage(name="sink", device="cpu")
    def sink_cpu(load):
        return np.sqrt(load)

    @p.stage(name="sink", device="gpu")
    def sink_gpu(load, device):
        import torch

        return torch.sqrt(torch.as_tensor(load, device=device)).to(torch.float16)

    return p


def test_a_float16_sink_against_a_float64_one_is_reported_as_differing():
    cpu = execute(half_on_the_gpu(), "all=cpu")
    sim = execute(half_on_the_gpu(), "load=cpu,sink=gpu-sim")
    assert cpu.outputs_digest != sim.outputs_digest
    assert compare_outputs(cpu.final_outputs, sim.final_outputs) == "output 'sink': dtypes differ (float64 vs float16)"


def test_the_advise_report_names_the_option_whose_outputs_differ(tmp_path):
    from placer.advisor import advise
    from placer.report import render_markdown

    advised = advise(half_on_the_gpu(), budget_s=3.0, target="none", cache=False, warmup=False)
    s = advised.facts.summary
    assert s.digests_agree is False
    assert "differs from the plan: output 'sink'" in s.outputs_differ
    md = render_markdown(advised.facts)
    assert "produced the same outputs" not in md and "outputs differ" in md


# -- 2. output paths ----------------------------------------------------------------------------
def test_output_to_a_directory_is_refused_before_any_work(tmp_path, marked):
    r = cli("run", marked, "--placement", "all=cpu", "-o", tmp_path)
    assert r.exit_code == 2
    assert f"{str(tmp_path)!r} is a directory" in one_error_line(r)
    assert not marked.with_suffix(".ran").exists()  # the stage never ran


def test_output_in_a_folder_that_is_a_file_is_refused_before_any_work(tmp_path, marked):
    blocker = tmp_path / "notafolder"
    blocker.write_text("keep me")
    r = cli("run", marked, "--placement", "all=cpu", "-o", blocker / "run.json")
    assert r.exit_code == 2 and "is not a directory" in one_error_line(r)
    assert blocker.read_text() == "keep me" and not marked.with_suffix(".ran").exists()


def test_output_in_an_unwritable_folder_is_refused_before_any_work(tmp_path, marked):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK) and os.geteuid() == 0:
            pytest.skip("running as root: permission bits do not stop writes (the probe file succeeds)")
        r = cli("run", marked, "--placement", "all=cpu", "-o", ro / "run.json")
        assert r.exit_code == 2 and "cannot create files in" in one_error_line(r)
        assert not marked.with_suffix(".ran").exists()
    finally:
        ro.chmod(0o700)


def test_a_symlink_output_is_refused_and_neither_link_nor_target_changes(tmp_path, marked):
    target = tmp_path / "precious.json"
    target.write_text('{"keep": true}')
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = cli("run", marked, "--placement", "all=cpu", "-o", link)
    assert r.exit_code == 2 and "is a symbolic link" in one_error_line(r)
    assert link.is_symlink() and target.read_text() == '{"keep": true}'
    with pytest.raises(OutputPathError, match="symbolic link"):
        write_text_atomic(link, "{}")
    assert target.read_text() == '{"keep": true}'


def private_null(folder: Path) -> Path:
    """A character device like /dev/null (major 1, minor 3), made in ``folder``; skip unless root."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = folder / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return node


def test_run_output_to_a_device_node_leaves_it_a_character_device(tmp_path, marked):
    node = private_null(tmp_path)
    r = cli("run", marked, "--placement", "all=cpu", "-o", node)
    assert r.exit_code == 0, r.stderr
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marked.py", "marked.ran", "null"]  # no temporary left


def test_writing_to_a_device_node_writes_into_it(tmp_path):
    node = private_null(tmp_path)
    write_text_atomic(node, "{}" * 1000)
    check_output(node)
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_a_regular_file_is_replaced_whole(tmp_path, marked):
    out = tmp_path / "run.json"
    out.write_text("old")
    r = cli("run", marked, "--placement", "all=cpu", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert json.loads(out.read_text())["pipeline"] == "marked"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_output_paths_that_name_no_file_are_refused():
    for bad in ("", ".", ".."):
        with pytest.raises(OutputPathError, match="names no file"):
            check_output(bad)


def test_save_folder_that_is_a_file_is_refused(tmp_path, marked):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputPathError, match="give a directory"):
        check_output_folder(f)
    r = cli("advise", marked, "--save", f, "-o", tmp_path / "r.html")
    assert r.exit_code == 2 and "--save" in one_error_line(r)
    assert f.read_text() == "x" and not marked.with_suffix(".ran").exists()


FAILS = """
from placer import Pipeline

def build(size=None):
    p = Pipeline("fails")

    @p.stage(device="cpu")
    def load():
        return [1, 2, 3]

    @p.stage(device="cpu")
    def boom(load):
        return helper(load)

    return p

def helper(x):
    raise ValueError("boom in the user's helper")
"""


def test_a_failed_run_writes_its_record_to_output(tmp_path):
    f = write(tmp_path / "fails.py", FAILS)
    out = tmp_path / "run.json"
    r = cli("run", f, "--placement", "all=cpu", "-o", out)
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "stage 'boom' failed" in line and "boom in the user's helper" in line and str(out) in line
    doc = json.loads(out.read_text())
    assert doc["failed_stage"] == "boom" and "ValueError" in doc["error"]
    assert [s["name"] for s in doc["stages"]][:1] == ["load"]  # the finished stage is kept


LATE = """
from placer import Pipeline

def build(size=1000):
    p = Pipeline("late", size=size)

    @p.stage(device="cpu", params={"n": size})
    def load(n):
        if n > 5000:
            raise MemoryError(f"only fails at full size ({n} rows)")
        return list(range(n))

    return p
"""


def test_advise_save_keeps_profile_and_plan_when_a_stage_fails_only_at_full_size(tmp_path):
    f = write(tmp_path / "late.py", LATE)
    save = tmp_path / "saved"
    r = cli("advise", f, "--size", "20000", "--budget-s", "3", "--target", "none", "--no-baselines",
            "--save", save, "-o", tmp_path / "r.html")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "stage 'load'" in line and "only fails at full size" in line and str(save) in line
    assert {p.name for p in save.iterdir()} >= {"profile.json", "plan.json", "run.json", "costs.json"}
    assert json.loads((save / "run.json").read_text())["failed_stage"] == "load"
    assert not (tmp_path / "r.html").exists()


# -- 3. option values -----------------------------------------------------------------------------
@pytest.mark.parametrize("args, option", [
    (["run", "{f}", "--size", "0"], "--size"),
    (["run", "{f}", "--size", "-5"], "--size"),
    (["profile", "{f}", "--budget-s", "nan"], "--budget-s"),
    (["profile", "{f}", "--budget-s", "inf"], "--budget-s"),
    (["profile", "{f}", "--budget-s", "-1"], "--budget-s"),
    (["profile", "{f}", "--max-size", "0"], "--max-size"),
    (["plan", "{f}", "--deadline-s", "nan"], "--deadline-s"),
    (["plan", "{f}", "--budget-s", "0"], "--budget-s"),
    (["advise", "{f}", "--budget-s", "nan"], "--budget-s"),
    (["plan", "{f}", "--method", "fastest"], "--method"),
])
def test_bad_option_values_are_usage_errors_before_any_work(marked, args, option):
    r = cli(*[a.format(f=marked) for a in args])
    assert r.exit_code == 2
    assert option in one_error_line(r)
    assert not marked.with_suffix(".ran").exists()


@pytest.mark.parametrize("spec, says, code", [
    ("all=tpu", "unknown device 'tpu'", 1),  # a device error, as for a pin in the pipeline
    ("=,,=", "names no device", 2),
    ("ghost=cpu", "stage 'ghost', which the pipeline does not have", 2),
    ("all", "is not stage=device", 2),
    ("all=cpu,load=", "'load=' names no device", 2),
    ("load=cpu,load=gpu-sim", "names stage 'load' twice (cpu and gpu-sim)", 2),
])
def test_bad_placements_are_refused_naming_the_item(marked, spec, says, code):
    r = cli("run", marked, "--placement", spec)
    assert r.exit_code == code and says in one_error_line(r)
    assert not marked.with_suffix(".ran").exists()


# -- 4. cost tables and saved JSON ----------------------------------------------------------------
def table(**stage) -> dict:
    st = {"name": "load", "output_bytes": 1e6, "seconds": {"cpu": 0.1}}
    st.update(stage)
    return {"devices": {"cpu": {"kind": "cpu", "workers": 2}}, "stages": [st]}


@pytest.mark.parametrize("doc, field, says", [
    (table(seconds={"cpu": True}), "stage 'load'.seconds.cpu", "boolean"),
    (table(seconds={"cpu": "0.1"}), "stage 'load'.seconds.cpu", "string"),
    (table(output_bytes=float("inf")), "stage 'load'.output_bytes", "finite"),
    (table(input_bytes=-1), "stage 'load'.input_bytes", "greater than or equal to 0"),
    (table(peak_bytes={"cpu": float("nan")}), "stage 'load'.peak_bytes.cpu", "Input should be"),
    (table(loop_carried="yes"), "stage 'load'.loop_carried", "boolean"),
    ({**table(), "size": float("nan")}, "size", "finite"),
    ({**table(), "size": -10}, "size", "greater than 0"),
    ({**table(), "devices": {"cpu": {"kind": "cpu", "workers": True}}}, "devices.cpu.workers", "boolean"),
])
def test_cost_table_numbers_are_checked(tmp_path, doc, field, says):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CostTableError) as info:
        CostTable.load(path)
    assert field in str(info.value) and says in str(info.value) and str(path) in str(info.value)
    r = cli("plan", "--costs", path)
    assert r.exit_code == 1 and field in one_error_line(r)


@pytest.mark.parametrize("content, says", [
    ("[" * 100_000, "nested too deeply"),
    ('{"a":' * 100_000, "nested too deeply"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    ("[1, 2, 3]", "must be a JSON object"),
    ("{", "not valid JSON"),
])
def test_malformed_cost_table_files_are_one_line_naming_the_file(tmp_path, content, says):
    path = tmp_path / "t.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = cli("plan", "--costs", path)
    assert r.exit_code == 1
    line = one_error_line(r)
    assert says in line and "t.json" in line


def test_a_directory_or_missing_file_as_costs_is_named(tmp_path):
    for path, says in ((tmp_path, "a directory"), (tmp_path / "none.json", "cannot read")):
        r = cli("plan", "--costs", path)
        assert r.exit_code == 1 and says in one_error_line(r) and str(path) in one_error_line(r)


def test_deeply_nested_saved_plan_and_profile_are_refused_naming_the_file(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    r = cli("plan", "--profile", deep)
    assert r.exit_code == 1 and "deep.json" in one_error_line(r) and "nested too deeply" in one_error_line(r)
    r = cli("report", "--plan", deep, "-o", tmp_path / "r.html")
    assert r.exit_code == 1 and "deep.json" in one_error_line(r)
    assert not (tmp_path / "r.html").exists()


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A real run saved as JSON (``placer run -o``)."""
    folder = tmp_path_factory.mktemp("saved")
    f = write(folder / "marked.py", MARKED)
    out = folder / "run.json"
    assert cli("run", f, "--placement", "all=cpu", "-o", out).exit_code == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("field, value, says", [
    ("makespan_s", -5.0, "makespan_s is -5.0"),
    ("makespan_s", "NaN", "makespan_s is nan"),
    ("seconds", float("inf"), "stages[0] ('load').seconds is inf"),
    ("start_s", float("nan"), "stages[0] ('load').start_s is nan"),
])
def test_a_tampered_saved_run_is_refused_naming_the_file_and_field(tmp_path, saved_run, field, value, says):
    doc = json.loads(json.dumps(saved_run))
    (doc if field == "makespan_s" else doc["stages"][0])[field] = value
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    r = cli("report", "--run", path, "-o", tmp_path / "r.md")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "tampered.json" in line and says in line
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("content, says", [
    ('{"name": 5}', "name: Input should be a valid string"),
    ("[[[[", "not valid JSON"),
    (None, "is a directory"),
])
def test_a_bad_device_description_file_is_named(tmp_path, content, says):
    from placer.costmodel.roofline import load_description
    from placer.errors import InputFileError

    path = tmp_path / "desc.json"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(InputFileError) as info:
        load_description(path)
    assert str(path) in str(info.value) and says in str(info.value)


@pytest.mark.parametrize("args", [
    ["plan", "--profile", "{f}"],
    ["report", "--from", "{f}", "-o", "{out}"],
    ["report", "--run", "{f}", "-o", "{out}"],
])
def test_non_utf8_saved_files_are_refused_naming_them(tmp_path, args):
    f = tmp_path / "binary.json"
    f.write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "r.html"
    r = cli(*[a.format(f=f, out=out) for a in args])
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "binary.json" in line and "UTF-8" in line
    assert not out.exists()


def dag_table(n: int) -> dict:
    """``n`` stages, each reading the two before it (not a chain), with a CPU and a GPU."""
    stages = [{"name": f"s{i}", "inputs": [f"s{j}" for j in (i - 1, i - 2) if j >= 0], "output_bytes": 1e6,
               "seconds": {"cpu": 0.01 * (1 + i % 3), "gpu": 0.005 * (1 + i % 5)}} for i in range(n)]
    link = {"latency_s": 1e-5, "bandwidth_Bps": 1e10}
    return {"devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu": {"kind": "gpu"}},
            "link": {"h2d": link, "d2h": link}, "stages": stages}


def test_exact_search_on_too_many_stages_falls_back_to_the_heuristic_with_a_warning():
    from placer.optimize import plan
    from placer.optimize.plan import EXACT_MAX_STAGES

    p = plan(CostTable.model_validate(dag_table(EXACT_MAX_STAGES + 1)), method="exact")
    assert p.method == "heuristic" and any("--method exact" in w and "heuristic" in w for w in p.warnings)


def test_exact_search_that_runs_out_of_nodes_says_the_result_is_not_proven(monkeypatch):
    import importlib

    from placer.optimize import plan

    monkeypatch.setattr(importlib.import_module("placer.optimize.plan"), "EXACT_NODE_LIMIT", 5)
    p = plan(CostTable.model_validate(dag_table(30)), method="exact")
    assert p.method == "exact" and "not proven optimal" in p.algorithm
    assert any("not proven optimal" in w for w in p.warnings)
    assert plan(CostTable.model_validate(dag_table(8)), method="exact").warnings == []


@pytest.mark.slow
def test_profiling_a_huge_size_starts_at_the_default_size(tmp_path):
    from placer.profile.profiler import FIRST_SIZE_MAX, profile, start_small

    asked: list[int] = []

    def build(size=None):
        p = Pipeline("huge", size=size or 2000)

        @p.stage(device="cpu", params={"n": size or 2000})
        def load(n):
            asked.append(n)
            return np.zeros(n, dtype=np.uint8)  # 10**11 would be 100 GB

        return p

    prof = profile(build, size=10**12, budget_s=2.0, devices=["cpu"], cache=False)
    assert prof.measured_sizes and asked[0] <= 2000 and min(prof.sizes) <= 2000  # the first point is small
    assert max(asked) < 10**10  # it grew while the budget lasted, never to the 10**11 asked for
    assert start_small([10**9], FIRST_SIZE_MAX)[0] <= FIRST_SIZE_MAX


def test_a_size_that_would_not_fit_in_memory_is_not_profiled(monkeypatch):
    from placer.data.profile import DeviceProfile, Point, Profile, StageProfile
    from placer.profile import profiler

    pt = Point(size=1000, median_s=0.1, iqr_s=0.0, reps=3, raw_times=[0.1] * 3, output_bytes=1e9)
    prof = Profile(pipeline="p", fingerprint="f", stages={"load": StageProfile(
        name="load", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=[pt])})})
    monkeypatch.setattr(profiler, "available_memory", lambda: 16e9)
    assert profiler.memory_note(prof, 1000, 2000) is None
    note = profiler.memory_note(prof, 1000, 16000)
    assert note.startswith("stopped before size 16000") and "GB of memory" in note


# -- 5. errors and exit statuses ------------------------------------------------------------------
def test_a_pydantic_error_in_build_names_the_field_not_just_the_model(tmp_path):
    f = write(tmp_path / "bad.py", """
        from placer import Pipeline
        def build(size=None):
            p = Pipeline("bad")
            @p.stage(kind="sorcery")
            def a(device):
                return 1
            return p
    """)
    r = cli("run", f, "--placement", "all=cpu")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "kind" in line and "sorcery" in line and "cleaning" in line  # the field, the value, the fix


def test_traceback_flag_shows_the_users_own_frames(tmp_path):
    f = write(tmp_path / "fails.py", FAILS)
    plain = cli("run", f, "--placement", "all=cpu")
    assert "--traceback" in one_error_line(plain)
    r = cli("--traceback", "run", f, "--placement", "all=cpu")
    assert r.exit_code == 1
    assert "Traceback" in r.stderr and "in helper" in r.stderr and str(f) in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("placer: error: stage 'boom' failed")


@pytest.mark.parametrize("where", ["import", "build"])
def test_sys_exit_in_a_pipeline_file_is_an_error(tmp_path, where):
    body = ("import sys\nsys.exit(0)\ndef build(size=None):\n    pass\n" if where == "import"
            else "import sys\ndef build(size=None):\n    sys.exit(0)\n")
    f = tmp_path / f"exits_{where}.py"
    f.write_text(body)
    r = cli("run", f, "--placement", "all=cpu")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "sys.exit(0)" in line and f.name in line


def test_a_stage_calling_sys_exit_fails_the_run_naming_it(tmp_path):
    f = write(tmp_path / "stage_exits.py", """
        import sys
        from placer import Pipeline
        def build(size=None):
            p = Pipeline("exits")
            @p.stage(device="cpu")
            def quitter():
                sys.exit(3)
            return p
    """)
    r = cli("run", f, "--placement", "all=cpu")
    assert r.exit_code == 1 and "stage 'quitter'" in one_error_line(r) and "SystemExit" in one_error_line(r)


SHADOW = """
from placer import Pipeline

def build(size=None):
    p = Pipeline("users_own_json")

    @p.stage(device="cpu")
    def load():
        return 42

    return p
"""


def test_a_folder_named_like_a_stdlib_module_loads_the_users_code(tmp_path, monkeypatch):
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text(SHADOW)
    monkeypatch.chdir(tmp_path)
    r = cli("run", "json", "--placement", "all=cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["pipeline"] == "users_own_json"
    import json as stdlib_json

    assert hasattr(stdlib_json, "dumps")  # the standard library's module is untouched


def test_a_module_reference_shadowing_a_loaded_stdlib_module_loads_the_local_file(tmp_path, monkeypatch):
    (tmp_path / "queue.py").write_text(SHADOW)
    monkeypatch.chdir(tmp_path)
    r = cli("run", "queue:build", "--placement", "all=cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["stages"][0]["name"] == "load"


def test_a_missing_pipeline_file_is_named(tmp_path):
    r = cli("run", tmp_path / "nope.py", "--placement", "all=cpu")
    assert r.exit_code == 1 and "nope.py" in one_error_line(r) and "does not exist" in one_error_line(r)


def test_an_unexpected_exception_is_one_line_and_exit_1(monkeypatch, capsys):
    import placer.cli as cli_module

    def broken():
        raise RuntimeError("something placer did not expect")

    monkeypatch.setattr(cli_module, "app", broken)
    monkeypatch.setattr(sys, "argv", ["placer", "devices"])
    with pytest.raises(SystemExit) as info:
        cli_module.main()
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected RuntimeError: something placer did not expect" in err
    assert "--traceback" in err


# -- 6. escaping in reports -----------------------------------------------------------------------
EVIL = "<b>EVIL</b>|*x*`[l](javascript:alert(1))"


def poison(obj):
    """Prefix every string in ``obj`` (model fields, list items, dict keys and values) with EVIL."""
    if isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            v = getattr(obj, name)
            if isinstance(v, str) and name != "key":
                object.__setattr__(obj, name, EVIL + v)
            else:
                poison(v)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            obj[i] = EVIL + v if isinstance(v, str) else (poison(v) or v)
    elif isinstance(obj, dict):
        for k in list(obj):
            v = obj.pop(k)
            obj[EVIL + k if isinstance(k, str) else k] = EVIL + v if isinstance(v, str) else v
            poison(v)
    return obj


def assert_escaped(facts):
    from placer.report import render_html, render_markdown

    md = render_markdown(facts, {"dag": "x.svg"})
    html = render_html(facts)
    assert "<b>EVIL" not in md and md.count("&lt;b&gt;EVIL&lt;/b&gt;\\|\\*x\\*") > 5
    leak = html.find("<b>EVIL")
    assert leak < 0 and 'href="javascript' not in html, html[max(leak - 300, 0):leak + 50]
    assert html.count("&lt;b&gt;EVIL&lt;/b&gt;") > 5


def test_every_string_of_a_report_is_escaped_in_html_and_markdown():
    import test_report_fixtures as fx

    assert_escaped(poison(fx.facts()))


def test_hostile_stage_and_pipeline_names_from_a_real_run_are_escaped():
    from placer.report import collect

    p = Pipeline(EVIL + "pipeline", size_unit=EVIL + "rows")

    def load():
        return np.ones(4)

    load.__doc__ = EVIL + "doc"
    p.stage(name=EVIL + "load", device="cpu", params={})(load)
    p.stage(name=EVIL + "sink", device="cpu", inputs={"x": EVIL + "load"})(lambda x: x * 2)
    run = execute(p, "all=cpu")
    facts = collect(run=run, pipeline=p)
    assert_escaped(poison(facts))


def test_hostile_stream_fields_are_escaped():
    from placer.data.run import StreamStageStats, StreamStats
    from placer.report import collect

    def node(name, kind):
        return StreamStageStats(name=name, kind=kind, device="cpu", workers=1, worker_kind="thread",
                                batches=10, busy_s=0.5, starved_s=0.2, blocked_s=0.3, wall_s=1.0)

    s = StreamStats(source="read", step="train", epochs=1, batches=10, samples=640, seconds=1.0,
                    samples_per_s=640.0, time_to_first_batch_s=0.05, consumer_idle_fraction=0.3, prefetch=2,
                    stages=[node("read", "source"), node("augment", "batch"), node("train", "step")],
                    queue_trace=[(0.1 * i, [1, 2]) for i in range(1, 11)], cache="augment")
    facts = collect(run={"pipeline": "p", "placement": {"train": "cpu"}, "executor": "threads", "workers": 1,
                         "makespan_s": 1.0, "streams": [s.model_dump()],
                         "stages": [{"name": "train", "device": "cpu", "lane": "stream", "start_s": 0.0,
                                     "end_s": 1.0, "seconds": 1.0, "workers": 1, "busy_s": 1.0,
                                     "starved_s": 0.0, "blocked_s": 0.0, "worker_kind": "thread"}]})
    assert_escaped(poison(facts))


def test_markdown_picture_links_are_url_encoded(tmp_path):
    import test_report_fixtures as fx
    from placer.report import write_report

    out = write_report(fx.facts(), tmp_path / "my report (v2).md", pictures_dir=True)
    text = out.read_text()
    assert "](my%20report%20%28v2%29_files/dag.svg)" in text
    assert (tmp_path / "my report (v2)_files" / "dag.svg").is_file()
