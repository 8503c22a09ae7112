"""Process workers of per-batch CPU stages, and faults: dying workers, Ctrl-C, no orphan processes.

Process workers are child processes, one per worker thread of a stage; each test
pipeline is tiny, so a test's time is mostly the children's start-up (about a
second each on a loaded two-core machine).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from placer import Pipeline, execute
from placer.errors import PlacerError, StageFailedError
from placer.loader import load_pipeline
from placer.stream import StreamConfig
from placer.executor.stream.workers import RemoteTraceback

ROOT = Path(__file__).resolve().parents[2]
N, B = 64, 8
PROCESS = {"augment": "process"}


def pipeline(epochs: int = 2, *, die_at: int | None = None, how: str = "exit", raise_at: int | None = None,
             sleep: float = 0.0, step_sleep: float = 0.0, hold: threading.Lock | None = None) -> Pipeline:
    """table (once) → source → augment (pure Python, seeded per batch) → a fold counting batches → total."""
    p = Pipeline("toy-workers", size=N, size_unit="samples")

    @p.stage(kind="cleaning")
    def table():
        return np.arange(N * 4, dtype=np.float32).reshape(N, 4) / N

    @p.source(epochs=epochs, batch_size=B)
    def batches(table):
        for i in range(0, N, B):
            yield table[i:i + B]

    @p.stage(kind="preprocessing", device="cpu", random=True)
    def augment(batches, table, batch_info):
        if die_at is not None and batch_info.seq == die_at:
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        if raise_at is not None and batch_info.seq == raise_at:
            raise ValueError(f"bad batch {batch_info.index}")
        if sleep:
            time.sleep(sleep)
        if hold is not None:
            with hold:  # a lock: this function cannot travel to another process
                pass
        rng = np.random.default_rng(batch_info.seed)
        rows = [[v * 2.0 + rng.random() for v in row] for row in batches.tolist()]
        out = np.asarray(rows, dtype=np.float32) + table[:1]
        out[0, 0] = os.getpid()  # which process ran it (overwritten below, for the digest)
        return out

    def init():
        return {"sum": np.zeros(4), "batches": 0, "pids": set()}

    @p.step(init=init, api="numpy")
    def fold(augment, state):
        if step_sleep:
            time.sleep(step_sleep)
        a = np.array(augment, dtype=np.float64)
        state["pids"].add(int(a[0, 0]))
        a[0, 0] = 0.0
        state["sum"] = state["sum"] + a.sum(0)
        state["batches"] += 1

    @p.stage(kind="inference")
    def total(fold, table):
        return fold["sum"] + table.sum()

    return p


def children() -> set[int]:
    """The live descendants of this process."""
    return {c.pid for c in psutil.Process().children(recursive=True)
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE}


# -- same answers, accounting ---------------------------------------------------------------------
def test_process_workers_give_the_sequential_runs_outputs_and_run_in_other_processes():
    ref = execute(pipeline(), "all=cpu", stream=StreamConfig(workers=0))
    run = execute(pipeline(), "all=cpu", stream=StreamConfig(workers=2, worker_kind=PROCESS))
    assert run.outputs_digest == ref.outputs_digest
    pids = run.outputs["fold"]["pids"]
    assert len(pids) == 2 and os.getpid() not in pids  # two children did the work
    assert ref.outputs["fold"]["pids"] == {os.getpid()}
    aug = next(s for s in run.streams[0].stages if s.name == "augment")
    assert (aug.worker_kind, aug.workers, aug.batches) == ("process", 2, 2 * N // B)
    assert next(r for r in run.stages if r.name == "augment").worker_kind == "process"


@pytest.mark.slow
def test_process_workers_give_the_same_digest_on_the_image_stream_with_python_augmentation():
    p = load_pipeline(str(ROOT / "pipelines" / "stream_images.py"), 192, augment="python", epochs=1)
    ref = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    run = execute(p, "all=cpu", stream=StreamConfig(workers=2, worker_kind=PROCESS))
    assert run.outputs_digest == ref.outputs_digest
    assert run.streams[0].batches == 3


@pytest.mark.slow
def test_busy_starved_and_blocked_account_for_process_workers_time_and_start_up_is_noted():
    run = execute(pipeline(epochs=3, sleep=0.01, step_sleep=0.02),
                  "all=cpu", stream=StreamConfig(workers=2, prefetch=2, worker_kind=PROCESS))
    s = run.streams[0]
    for n in s.stages:
        total = n.busy_s + n.starved_s + n.blocked_s
        assert total == pytest.approx(n.wall_s * n.workers, rel=0.05, abs=0.01), n
    aug = next(n for n in s.stages if n.name == "augment")
    assert aug.busy_s > 0.01 * aug.batches * 0.9  # each batch slept 10 ms in a child
    note = next(x for x in s.notes if x.startswith("'augment': 2 worker processes started in"))
    computing = float(re.search(r"([0-9.]+) s computing in the workers", note).group(1))
    assert 0.01 * aug.batches * 0.9 < computing <= aug.busy_s + 0.01


def test_process_workers_are_refused_for_the_step_and_the_source():
    with pytest.raises(PlacerError, match="process workers run per-batch CPU stages only"):
        execute(pipeline(), "all=cpu", stream=StreamConfig(worker_kind={"fold": "process"}))
    with pytest.raises(PlacerError, match="'batches' is the source"):
        execute(pipeline(), "all=cpu", stream=StreamConfig(worker_kind={"batches": "process"}))


def test_a_sequential_run_keeps_every_stage_in_the_calling_thread():
    run = execute(pipeline(), "all=cpu", stream=StreamConfig(workers=0, worker_kind=PROCESS))
    assert run.outputs["fold"]["pids"] == {os.getpid()}
    assert all(s.worker_kind == "thread" for s in run.streams[0].stages)


def test_stream_settings_import_first_in_a_fresh_interpreter():
    code = "from placer.stream import StreamConfig; print(StreamConfig(worker_kind={'a': 'process'}).kind_of('a'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (out.returncode, out.stdout.strip()) == (0, "process"), out.stderr


# -- faults ---------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["exit", "sigkill"])
@pytest.mark.slow
def test_a_worker_process_that_dies_fails_the_stage_naming_the_batch_and_leaves_no_process(how):
    before = children()
    t = time.perf_counter()
    with pytest.raises(StageFailedError) as err:
        execute(pipeline(die_at=5, how=how), "all=cpu", stream=StreamConfig(workers=2, worker_kind=PROCESS))
    assert time.perf_counter() - t < 60
    msg = str(err.value)
    assert err.value.stage == "augment"
    assert "stage 'augment' failed on cpu on batch 5 of epoch 0" in msg
    assert "WorkerDied" in msg and ("exit code 3" if how == "exit" else "killed by SIGKILL") in msg
    assert err.value.outputs["fold"]["batches"] == 5  # the batches before it went through the step
    assert children() <= before


@pytest.mark.slow
def test_an_exception_in_a_worker_process_is_raised_as_itself_with_the_remote_traceback():
    before = children()
    with pytest.raises(StageFailedError, match=r"on batch 2 of epoch 1 .*ValueError: bad batch 2") as err:
        execute(pipeline(raise_at=N // B + 2), "all=cpu", stream=StreamConfig(workers=2, worker_kind=PROCESS))
    cause = err.value.__cause__.__cause__  # StageFailedError <- the stream's failure <- the stage's
    assert isinstance(cause, ValueError)
    assert isinstance(cause.__cause__, RemoteTraceback) and "bad batch" in str(cause.__cause__)
    assert err.value.outputs["fold"]["batches"] == N // B + 2
    assert children() <= before


def test_a_stage_that_cannot_be_pickled_fails_naming_it_before_any_batch():
    with pytest.raises(StageFailedError, match="stage 'augment' could not start its worker processes: "
                                               "TypeError: cannot pickle '_thread.lock'") as err:
        execute(pipeline(hold=threading.Lock()), "all=cpu", stream=StreamConfig(workers=2, worker_kind=PROCESS))
    assert err.value.stage == "augment"


@pytest.mark.slow
def test_a_successful_run_leaves_no_worker_process():
    before = children()
    execute(pipeline(epochs=1), "all=cpu", stream=StreamConfig(workers=2, worker_kind=PROCESS))
    assert children() <= before


# -- Ctrl-C on the command line -------------------------------------------------------------------
SLOW = '''
import os, pathlib, threading, time
import numpy as np
from placer import Pipeline

def build(size=None):
    p = Pipeline("slow")

    @p.stage(kind="cleaning")
    def table():
        return np.zeros(4)

    @p.source(epochs=1000, batch_size=4)
    def batches(table):
        for i in range(100):
            yield np.full(4, float(i)) + table

    @p.stage(kind="preprocessing", device="cpu")
    def augment(batches):
        mine = pathlib.Path(f"{os.environ['MARKER']}.{os.getpid()}.{threading.get_ident()}")  # whole, then renamed:
        mine.write_text(str(os.getpid()))                                # the test never reads it half-written
        os.replace(mine, os.environ["MARKER"])
        time.sleep(0.05)
        return batches * 2

    @p.step()
    def collect(augment):
        return float(augment.sum())

    @p.stage(kind="inference")
    def summary(collect, table):
        return len(collect)

    return p
'''

@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_ctrl_c_stops_placer_run_promptly_with_one_line_and_no_orphans(tmp_path, kind):
    file = tmp_path / "slow.py"
    file.write_text(SLOW)
    marker = tmp_path / "marker"
    env = {**os.environ, "MARKER": str(marker), "PYTHONPATH": str(ROOT)}
    extra = [] if kind == "thread" else ["--processes", "augment"]
    proc = subprocess.Popen([sys.executable, "-m", "placer", "run", str(file), "--placement", "all=cpu",
                             "--workers", "2", *extra],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the stream never started"
            time.sleep(0.05)
        time.sleep(0.3)
        family = psutil.Process(proc.pid).children(recursive=True)
        workers = [c for c in family if c.pid == int(marker.read_text())]
        assert (len(workers) == 1) == (kind == "process")
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - t < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["placer: interrupted"]
    gone, alive = psutil.wait_procs(family, timeout=5)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
