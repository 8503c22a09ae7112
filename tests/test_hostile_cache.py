"""A hostile profile cache never stops the work.

Each case breaks the cache one way (a file of random bytes, non-UTF-8 text, NaN or negative
times, no measured points, absurd nesting, a cache folder that cannot be created or written) and
checks three things: the command exits 0, exactly one warning names the file or folder, and
nothing is lost (the stages are measured again and ``-o`` gets the profile). Every way of breaking
a cache file goes through ``profile()``, which the command calls; two of them, and every folder
case, go through the command itself.

Root ignores file permissions: an unwritable cache is made by putting the cache folder under a
regular file, by making the write itself fail (``os.replace`` raising PermissionError), and, for
read-only and unreadable folders, by running the command as root without the capabilities that
override file modes (``setpriv``, from util-linux; the tests that need it skip, saying so, when it
is missing).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from placer.devices import discover
from placer.profile import Profile, ProfileCache, ProfileCacheWarning, profile
from placer.profile.keys import source_id
from warm_cli import run as run_placer

PIPE = """\
import numpy as np
from placer import Pipeline

def build(size=None):
    n = int(size or 2000)
    p = Pipeline("hostile", size=n)
    p.add(name="make", cpu=lambda n: np.ones((n, 8)), params={"n": n})
    p.add(name="double", cpu=lambda make: make * 2, inputs={"make": "make"})
    return p
"""


@pytest.fixture(scope="module")
def env() -> dict:
    """The environment of the CLI runs: the simulated device on, as in the other CLI tests."""
    return {**os.environ, "PLACER_TEST_DEVICES": "1", "NUMBA_ENABLE_CUDASIM": os.environ.get("NUMBA_ENABLE_CUDASIM", "1")}


@pytest.fixture(scope="module")
def pipe(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("pipe") / "hostile.py"
    f.write_text(PIPE)
    return f


@pytest.fixture(scope="module")
def good(tmp_path_factory, pipe, env) -> dict:
    """A real cached profile of the pipeline (JSON), made once by the CLI."""
    root = tmp_path_factory.mktemp("good") / "cache"
    out = _cli(_profile_args(pipe), env, root)
    assert out.returncode == 0, out.stderr
    return json.loads(_cache_file(root, pipe).read_text())


def _cli(args, env, cache: Path | None):
    env = dict(env)
    if cache is not None:
        env["PLACER_CACHE_DIR"] = str(cache)
    return run_placer(args, via="-c", capture_output=True, text=True, env=env, timeout=180)


def _profile_args(pipe: Path, *extra: str) -> list[str]:
    return ["profile", str(pipe), "--size", "2000", "--budget-s", "2", "--devices", "cpu", "--describe", "none",
            *extra]


def _cache_file(root: Path, pipe: Path) -> Path:
    """Where the CLI (same environment, this machine) keeps the pipeline's cached profile."""
    return ProfileCache(root).path("hostile", discover().fingerprint(), source_id(str(pipe)))


def _install(root: Path, pipe: Path, doc: dict) -> Path:
    path = _cache_file(root, pipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _assert_one_warning_and_remeasured(out, name: str, saved: Path | None = None):
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("ProfileCacheWarning") == 1, out.stderr
    assert name in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    if saved is not None:  # nothing lost: the measurements reached -o
        prof = Profile.load(saved)
        assert all(sp.devices["cpu"].points for sp in prof.stages.values())


# -- unreadable, undecodable, malformed files ----------------------------------------------------
def _corrupt_with(data: bytes):
    def write(path: Path, _doc: dict) -> None:
        path.write_bytes(data)
    return write


def _edit(fn):
    def write(path: Path, doc: dict) -> None:
        fn(doc)
        path.write_text(json.dumps(doc))  # json writes NaN as NaN, as a careless tool would
    return write


def _nan_times(doc):
    pt = doc["stages"]["double"]["devices"]["cpu"]["points"][0]
    pt["median_s"] = math.nan
    pt["raw_times"] = [math.nan] * len(pt["raw_times"])


def _negative_times(doc):
    pt = doc["stages"]["double"]["devices"]["cpu"]["points"][0]
    pt["median_s"] = -1.0
    pt["raw_times"] = [-1.0] * len(pt["raw_times"])


def _no_points(doc):
    for sp in doc["stages"].values():
        for dp in sp["devices"].values():
            dp["points"] = []


def _median_outside_repeats(doc):
    pt = doc["stages"]["double"]["devices"]["cpu"]["points"][0]
    pt["median_s"] = 1000.0 * max(pt["raw_times"])


def _string_for_time(doc):
    doc["stages"]["double"]["devices"]["cpu"]["points"][0]["median_s"] = "fast"


def _deep(path: Path, _doc: dict) -> None:
    path.write_text('{"schema": "placer.profile/1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


CORRUPTIONS = {
    "random bytes": _corrupt_with(os.urandom(4096)),
    "non-UTF-8 bytes": _corrupt_with(b'{"schema": "placer.profile/1", "pipeline": "\xff\xfe\xfa"}'),
    "truncated JSON": _corrupt_with(b'{"schema": "placer.profile/1", "pipeline": '),
    "empty file": _corrupt_with(b""),
    "a JSON list": _corrupt_with(b"[1, 2, 3]"),
    "NaN times": _edit(_nan_times),
    "negative times": _edit(_negative_times),
    "no measured points": _edit(_no_points),
    "a median outside its repeats": _edit(_median_outside_repeats),
    "a string for a time": _edit(_string_for_time),
    "100k-deep nesting": _deep,
}


def _assert_replaced(root: Path, pipe: Path) -> None:
    """The cache file was replaced by a good one: the next read takes it without a word."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileCacheWarning)
        back = ProfileCache(root).load("hostile", discover().fingerprint(), source_id(str(pipe)))
    assert back is not None and all(sp.devices["cpu"].points for sp in back.stages.values())


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_broken_cache_file_is_remeasured_with_one_warning_naming_it(case, tmp_path, pipe, good):
    """Each way of breaking the file, through ``profile()`` (what the CLI calls; two cases below run the CLI)."""
    import copy

    root = tmp_path / "cache"
    path = _install(root, pipe, good)
    CORRUPTIONS[case](path, copy.deepcopy(good))
    with pytest.warns(ProfileCacheWarning) as rec:
        prof = profile(str(pipe), size=2000, budget_s=2, devices=["cpu"], cache=ProfileCache(root), progress=False)
    msgs = [str(w.message) for w in rec if issubclass(w.category, ProfileCacheWarning)]
    assert len(msgs) == 1 and str(path) in msgs[0], msgs
    assert all(sp.devices["cpu"].points for sp in prof.stages.values())  # nothing lost
    _assert_replaced(root, pipe)


@pytest.mark.parametrize("case", ["random bytes", "NaN times"])
@pytest.mark.slow
def test_the_cli_remeasures_a_broken_cache_file_with_one_warning_naming_it(case, tmp_path, pipe, env, good):
    import copy

    root = tmp_path / "cache"
    path = _install(root, pipe, good)
    CORRUPTIONS[case](path, copy.deepcopy(good))
    saved = tmp_path / "out.json"
    out = _cli(_profile_args(pipe, "-o", str(saved)), env, root)
    _assert_one_warning_and_remeasured(out, str(path), saved)
    _assert_replaced(root, pipe)


@pytest.mark.slow
def test_a_random_bytes_cache_file_does_not_stop_plan_or_advise(tmp_path, pipe, env, good):
    root = tmp_path / "cache"
    path = _install(root, pipe, good)
    for cmd in (["plan", str(pipe), "--size", "2000", "--budget-s", "1"],
                ["advise", str(pipe), "--size", "2000", "--budget-s", "1", "--target", "none"]):
        path.write_bytes(os.urandom(2048))
        out = _cli(cmd, env, root)
        _assert_one_warning_and_remeasured(out, str(path))


def test_a_profile_file_of_random_bytes_given_to_plan_is_refused_naming_the_file(tmp_path, env):
    bad = tmp_path / "given.json"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(512))
    out = _cli(["plan", "--profile", str(bad)], env, tmp_path / "cache")
    assert out.returncode == 1
    assert str(bad) in out.stderr and "Traceback" not in out.stderr


# -- a cache folder that cannot be created or written ---------------------------------------------
@pytest.mark.slow
def test_a_cache_path_that_is_a_regular_file_means_no_cache_with_one_warning(tmp_path, pipe, env):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("not a folder")
    saved = tmp_path / "out.json"
    out = _cli(_profile_args(pipe, "-o", str(saved)), env, blocker)
    _assert_one_warning_and_remeasured(out, str(blocker), saved)
    assert "continuing without a cache" in out.stderr
    assert blocker.read_text() == "not a folder"  # untouched


@pytest.mark.slow
def test_a_cache_folder_under_a_regular_file_with_fresh_still_reaches_o(tmp_path, pipe, env):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    saved = tmp_path / "out.json"
    out = _cli(_profile_args(pipe, "--fresh", "-o", str(saved)), env, blocker / "placer")
    _assert_one_warning_and_remeasured(out, str(blocker / "placer"), saved)


@pytest.mark.slow
def test_a_home_that_cannot_hold_a_cache_means_no_cache_with_one_warning(tmp_path, pipe, env):
    home = tmp_path / "home-is-a-file"
    home.write_text("x")
    env = {k: v for k, v in env.items() if k != "PLACER_CACHE_DIR"}
    env["HOME"] = str(home)
    for cmd in (_profile_args(pipe), ["plan", str(pipe), "--size", "2000", "--budget-s", "1"]):
        out = _cli(cmd, env, None)
        _assert_one_warning_and_remeasured(out, str(home))


@pytest.mark.slow
def test_a_write_refused_with_permission_error_warns_once_and_keeps_the_profile(tmp_path, monkeypatch, pipe):
    cache = ProfileCache(tmp_path / "cache")

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache"))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.warns(ProfileCacheWarning) as rec:
        prof = profile(str(pipe), size=2000, budget_s=5, devices=["cpu", "gpu-sim"], cache=cache, progress=False)
        again = profile(str(pipe), size=2000, budget_s=5, devices=["cpu", "gpu-sim"], cache=cache, progress=False)
    msgs = [str(w.message) for w in rec if issubclass(w.category, ProfileCacheWarning)]
    assert len(msgs) == 1 and str(tmp_path / "cache") in msgs[0] and "Permission denied" in msgs[0]
    assert all(sp.devices["cpu"].points for sp in prof.stages.values())
    assert all(sp.devices["cpu"].points for sp in again.stages.values())
    assert not cache.writable
    assert not list((tmp_path / "cache").rglob("*.json"))  # no half-written file either


@pytest.mark.slow
def test_a_directory_where_the_cache_file_should_be_is_survived(tmp_path, pipe, env):
    root = tmp_path / "cache"
    path = _cache_file(root, pipe)
    path.mkdir(parents=True)
    saved = tmp_path / "out.json"
    out = _cli(_profile_args(pipe, "-o", str(saved)), env, root)
    _assert_one_warning_and_remeasured(out, str(root), saved)
    assert path.is_dir()


def test_a_broken_cached_transfer_model_is_remeasured_with_one_warning(tmp_path):
    cache = ProfileCache(tmp_path / "cache")
    fp = discover().fingerprint()
    path = cache.transfer_path("gpu-sim", fp)
    for data in (os.urandom(1024), b"\xff\xfe", b'{"schema": "placer.transfer/1", "model": {"x": ' + b"[" * 50_000):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        with pytest.warns(ProfileCacheWarning) as rec:
            assert cache.load_transfer("gpu-sim", fp) is None
        msgs = [str(w.message) for w in rec if issubclass(w.category, ProfileCacheWarning)]
        assert len(msgs) == 1 and str(path) in msgs[0]


# -- a cache the user may not write or read (file modes bite: no root override) -------------------
#: run a command as root without the capabilities that let root ignore file modes
DROP_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                 "--inh-caps=-dac_override,-dac_read_search"]


def _as_plain_user(args, env, cache: Path):
    """``_cli`` for a user whose file modes are enforced: root drops its override through setpriv."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root ignores file modes and setpriv (util-linux), which drops that override, is missing")
        prefix = DROP_OVERRIDE
    env = {**env, "PLACER_CACHE_DIR": str(cache)}
    return subprocess.run([*prefix, sys.executable, "-c", "from placer.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@contextlib.contextmanager
def _mode(mode: int, *folders: Path):
    """``folders`` (deepest first) with ``mode`` for the block, as they were afterwards."""
    for d in folders:
        d.chmod(mode)
    try:
        yield
    finally:
        for d in reversed(folders):
            d.chmod(0o700)


def _assert_no_cache_one_warning(out, root: Path, verb: str):
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("ProfileCacheWarning") == 1, out.stderr
    assert f"{str(root)!r} cannot be {verb}" in out.stderr and "continuing without a cache" in out.stderr
    assert "Traceback" not in out.stderr and "PermissionError" not in out.stderr


@pytest.mark.slow
def test_a_read_only_cache_with_its_files_intact_means_no_cache_for_profile_plan_and_advise(
        tmp_path, pipe, env, good):
    root = tmp_path / "cache"
    path = _install(root, pipe, good)
    (root / "transfer").mkdir()
    saved = tmp_path / "out.json"
    with _mode(0o500, path.parent, root / "transfer", root):
        for args in (_profile_args(pipe, "-o", str(saved)),
                     ["plan", str(pipe), "--size", "2000", "--budget-s", "1"],
                     ["advise", str(pipe), "--size", "2000", "--budget-s", "1", "--target", "none"]):
            out = _as_plain_user(args, env, root)
            _assert_no_cache_one_warning(out, root, "written")
        assert sorted(p.name for p in root.rglob("*")) == sorted(["profiles", "transfer", path.name])
    assert all(sp.devices["cpu"].points for sp in Profile.load(saved).stages.values())


@pytest.mark.slow  # calibrating the CPU takes its 15 s budget; the read-only cache's warning is also checked by
# test_a_read_only_cache_with_its_files_intact_means_no_cache_for_profile_plan_and_advise
def test_a_read_only_empty_cache_with_fresh_still_writes_o_and_calibrates_the_cpu(tmp_path, pipe, env):
    """``--target`` scales this CPU's times, which calibrates the CPU and would keep that in the cache."""
    root = tmp_path / "cache"
    root.mkdir()
    saved = tmp_path / "fresh.json"
    with _mode(0o500, root):
        args = ["profile", str(pipe), "--size", "2000", "--budget-s", "5", "--devices", "cpu", "--target", "h200",
                "--fresh", "-o", str(saved)]
        out = _as_plain_user(args, env, root)
        _assert_no_cache_one_warning(out, root, "written")
        assert not list(root.iterdir())
    doc = json.loads(saved.read_text())
    assert doc["target"]["cpu"] and all(sp.devices["cpu"].points for sp in Profile.load(saved).stages.values())


@pytest.mark.slow
def test_a_cache_folder_that_cannot_be_entered_means_no_cache_with_one_warning(tmp_path, pipe, env, good):
    root = tmp_path / "cache"
    _install(root, pipe, good)
    saved = tmp_path / "plan.json"
    with _mode(0o000, root):
        out = _as_plain_user(["plan", str(pipe), "--size", "2000", "--budget-s", "1", "-o", str(saved)], env, root)
        _assert_no_cache_one_warning(out, root, "read")
    assert json.loads(saved.read_text())["stages"]
