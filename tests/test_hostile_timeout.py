"""A stage stuck in ONE blocking call is ended by the stage timeout on every lane.

The stages here block in a single call Python cannot interrupt, not in a loop of short
sleeps: ``time.sleep(1e6)`` in the command-line cases (each a subprocess, so the stuck
thread ends with it), and, in this process, ``threading.Event.wait()`` on an event the
test sets once it has its answer, so that no stuck thread outlives the test.

Each case checks the exit (status 1, or ``StageFailedError``), that the error names the
stuck stage, that the outputs of finished stages are kept, and how long the end took
after the stage started. Times are taken from the moment the stuck stage started (it
writes the time to a marker file), so that a loaded machine's slow imports do not count;
the bounds leave several seconds for the same reason.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from placer import Pipeline
from placer.errors import StageFailedError
from placer.executor import execute
from placer.executor.stagecall import STOP_WAIT_S
from placer.stream import StreamConfig
from seeded_cache import seeded_cache
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[1]
#: seconds allowed past the limit and STOP_WAIT_S (a loaded machine, the interpreter's exit)
SLACK_S = 8.0

#: one-shot and stream pipelines whose ``STUCK_AT`` stage writes the time, then sleeps for 11 days
STUCK = '''
import os, time
import numpy as np
from placer import Pipeline

AT = os.environ.get("STUCK_AT", "hang")

def _stuck():
    with open(os.environ["STUCK_MARKER"], "w") as f:
        f.write(repr(time.time()))
    time.sleep(1e6)

def _hang(make):
    _stuck()
    return make

def build(size=None):
    n = int(size or 1000)
    p = Pipeline("stuck", size=n)
    p.add(name="make", cpu=lambda n: np.ones((n, 2)), params={"n": n})
    p.add(name="hang", cpu=_hang, inputs={"make": "make"}, data_parallel=AT == "data_parallel")
    return p
'''

STUCK_STREAM = '''
import os, time
import numpy as np
from placer import Pipeline

AT = os.environ.get("STUCK_AT", "decode")

def _stuck():
    with open(os.environ["STUCK_MARKER"], "w") as f:
        f.write(repr(time.time()))
    time.sleep(1e6)

def build(size=None):
    n = int(size or 20)
    p = Pipeline("stuck_stream", size=n)

    @p.source(epochs=1)
    def batches():
        for i in range(n):
            yield np.full((4, 2), float(i))

    @p.stage(device="cpu")
    def decode(batches):
        if batches[0, 0] == 3:
            _stuck()
        return batches * 2

    @p.step(kind="inference")
    def total(decode):
        return float(decode.sum())
    return p
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("stuck")
    (d / "stuck.py").write_text(STUCK)
    (d / "stuck_stream.py").write_text(STUCK_STREAM)
    return d


def _placer(args: list[str], marker: Path, timeout: float, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``placer ARGS``; return the result and the seconds from the stuck stage's start to the exit."""
    marker.unlink(missing_ok=True)
    full = {**os.environ, "STUCK_MARKER": str(marker), **env}
    out = run_placer(args, via="-c", capture_output=True, text=True, env=full, cwd=ROOT, timeout=timeout)
    ended = time.time()
    assert marker.exists(), f"the stuck stage never started: {out.stderr}"
    return out, ended - float(marker.read_text())


def _error_line(out: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in out.stderr and len(lines) == 1 and lines[0].startswith("placer: error: "), out.stderr
    return lines[0]


# -- the command line: time.sleep(1e6) --------------------------------------------------------------
@pytest.mark.slow
def test_run_with_a_stage_stuck_in_one_sleep_exits_1_at_the_timeout_naming_it(files, tmp_path):
    t = time.monotonic()
    out, after = _placer(["run", str(files / "stuck.py"), "--placement", "all=cpu", "--stage-timeout", "3"],
                         tmp_path / "marker", timeout=120)
    total = time.monotonic() - t
    assert out.returncode == 1
    line = _error_line(out)
    assert "stage 'hang' did not finish within 3 s" in line and "could not be stopped" in line
    assert 3.0 <= after <= 3.0 + STOP_WAIT_S + SLACK_S, (after, total)


@pytest.mark.slow  # the bound is 10 s (dask's threads must start first); the command's stage timeout on a stuck
# stage is checked at 3 s by test_run_with_a_stage_stuck_in_one_sleep_exits_1_at_the_timeout_naming_it
def test_a_stuck_data_parallel_stage_whose_dask_threads_would_hold_the_exit_up_still_exits(files, tmp_path):
    """dask's local threads are joined when Python exits; the command ends the process itself.

    The limit leaves dask time to start its threads on a busy machine (at 3 s the stage was
    once stopped before any partition had started)."""
    out, after = _placer(["run", str(files / "stuck.py"), "--placement", "all=cpu", "--stage-timeout", "10",
                          "--size", "20000"], tmp_path / "marker", timeout=120, STUCK_AT="data_parallel")
    assert out.returncode == 1
    line = _error_line(out)
    assert "stage 'hang' did not finish within 10 s" in line and "could not be stopped" in line
    assert after <= 10.0 + STOP_WAIT_S + SLACK_S


@pytest.mark.parametrize("how", [["--workers", "2"], ["--workers", "0"], ["--workers", "1", "--processes", "decode"]],
                         ids=["thread workers", "sequential", "process workers"])
@pytest.mark.slow
def test_a_stream_stage_stuck_in_one_sleep_ends_the_run_at_the_timeout_naming_it(files, tmp_path, how):
    out, after = _placer(["run", str(files / "stuck_stream.py"), "--placement", "all=cpu", "--stage-timeout", "3",
                          *how], tmp_path / "marker", timeout=120)
    assert out.returncode == 1
    line = _error_line(out)
    assert "stage 'decode' failed" in line and "on batch 3 of epoch 0" in line and "within 3 s" in line
    # a killed worker process stops the stage itself; a thread only stops being waited for
    assert ("was stopped" if "--processes" in how else "could not be stopped") in line
    assert after <= 3.0 + STOP_WAIT_S + SLACK_S


@pytest.mark.slow  # the bound is 30 s: the run cannot end sooner
def test_profile_ends_a_stuck_stage_at_its_documented_bound_naming_it(files, tmp_path):
    """Without --stage-timeout, profiling bounds a stage call by twice the budget, at least 30 s
    (docs/timeouts.md): `placer profile stuck.py --budget-s 5` ends 30 s after the stage started, plus
    the second it gets to leave."""
    from placer.profile.profiler import MIN_BOUND_S

    out, after = _placer(["profile", str(files / "stuck.py"), "--budget-s", "5", "--fresh", "--describe", "none"],
                         tmp_path / "marker", timeout=240, PLACER_CACHE_DIR=str(seeded_cache(tmp_path / "cache")))
    assert out.returncode == 1
    line = _error_line(out)
    assert f"stage 'hang' did not finish within {MIN_BOUND_S:g} s" in line
    assert MIN_BOUND_S <= after <= MIN_BOUND_S + STOP_WAIT_S + SLACK_S


# -- the library, every lane: Event.wait(), released once the test has its answer -----------------
@pytest.fixture
def gate():
    """An event stuck stages wait on (one call Python cannot interrupt); set when the test ends."""
    ev = threading.Event()
    yield ev
    ev.set()


def _one_shot(gate: threading.Event, started: list) -> Pipeline:
    def hang(make):
        started.append(time.monotonic())
        gate.wait()
        return make

    p = Pipeline("stuck", size=10)
    p.add(name="make", cpu=lambda: np.arange(10.0))
    p.add(name="hang", cpu=hang, inputs={"make": "make"})
    p.add(name="other", cpu=lambda make: make + 1, inputs={"make": "make"})
    return p


@pytest.mark.parametrize("executor", ["inline", "threads"])
@pytest.mark.slow
def test_every_one_shot_lane_stops_waiting_for_a_stage_stuck_in_one_call(gate, executor):
    started: list[float] = []
    with pytest.raises(StageFailedError) as err:
        execute(_one_shot(gate, started), "all=cpu", executor=executor, stage_timeout=1.0)
    ended = time.monotonic()
    assert err.value.stage == "hang" and "could not be stopped" in str(err.value)
    assert sorted(err.value.outputs) == ["make", "other"]  # finished stages are kept
    assert err.value.run.failed_stage == "hang"
    assert 1.0 <= ended - started[0] <= 1.0 + STOP_WAIT_S + SLACK_S


def test_a_stage_stuck_in_python_code_is_stopped_not_just_left(gate):
    def spin(make):
        while not gate.is_set():
            pass
        return make

    p = Pipeline("spin", size=10)
    p.add(name="make", cpu=lambda: np.arange(10.0))
    p.add(name="spin", cpu=spin, inputs={"make": "make"})
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(StageFailedError, match="did not finish within 1 s .* and was stopped"):
        execute(p, "all=cpu", executor="inline", stage_timeout=1.0)
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, left


def _stream(gate: threading.Event, started: list, at: str) -> Pipeline:
    p = Pipeline("stuck_stream", size=20)

    @p.source(epochs=1)
    def batches():
        for i in range(20):
            if at == "batches" and i == 3:
                started.append(time.monotonic())
                gate.wait()
            yield np.full((4, 2), float(i))

    @p.stage(device="cpu")
    def decode(batches):
        if at == "decode" and batches[0, 0] == 3:
            started.append(time.monotonic())
            gate.wait()
        return batches * 2

    @p.step(kind="inference")
    def total(decode):
        if at == "total" and decode[0, 0] == 6:
            started.append(time.monotonic())
            gate.wait()
        return float(decode.sum())

    return p


@pytest.mark.parametrize("workers", [2, 0], ids=["thread workers", "sequential"])
@pytest.mark.parametrize("at", [pytest.param("batches", marks=pytest.mark.slow),
                                pytest.param("decode", marks=pytest.mark.slow), "total"])
def test_a_stream_stage_stuck_in_one_call_fails_the_stream_at_the_timeout_naming_it(gate, at, workers):
    started: list[float] = []
    with pytest.raises(StageFailedError) as err:
        execute(_stream(gate, started, at), "all=cpu", stream=StreamConfig(workers=workers), stage_timeout=1.0)
    ended = time.monotonic()
    assert err.value.stage == at
    assert f"stage {at!r} did not finish within 1 s" in str(err.value)
    assert 1.0 <= ended - started[0] <= 1.0 + STOP_WAIT_S + SLACK_S


@pytest.mark.slow
def test_profiling_stops_waiting_for_a_stage_stuck_in_one_call(gate, monkeypatch):
    from placer.profile import profile, profiler

    monkeypatch.setattr(profiler, "MIN_BOUND_S", 1.0)
    started: list[float] = []
    with pytest.raises(StageFailedError, match="stage 'hang' did not finish within 1 s") as err:
        profile(_one_shot(gate, started), budget_s=0.2, devices=["cpu"], cache=False, progress=False)
    assert err.value.stage == "hang"
    assert time.monotonic() - started[0] <= 1.0 + STOP_WAIT_S + SLACK_S
