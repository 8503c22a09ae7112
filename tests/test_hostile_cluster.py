"""Hostile cases for clusters, interrupts and timeouts: each checks the exit code, the message, that nothing was lost.

One 127.0.0.1 ``LocalCluster`` of two worker processes (one thread each) serves the
module: every bundled one-shot pipeline runs on it (loaded from its file, as
``placer run`` loads it) and must give the local run's digest. The workers start
with this process's ``sys.path`` (multiprocessing's spawn), so ``pipelines`` can be
imported there; ``placer_user_*`` modules and a helper module in a temporary folder
cannot, and are the ones the shipping of source has to carry.

Interrupts send SIGINT to a ``placer run`` subprocess once its stage has started
(the stage writes a marker file), as a terminal's Ctrl-C would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from placer.errors import StageFailedError
from placer.executor import execute
from placer.loader import load_pipeline
from warm_cli import run as run_placer
from seeded_cache import seeded_cache

distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[1]

#: every bundled one-shot pipeline at a small size (size, params)
ONE_SHOT = {
    "tabular": (2000, {}),
    "requests": (16, {}),
    "batched_inference": (300, {"batch": 128}),
    "branches": (60, {}),
    "timeseries": (400, {}),
    "mnist_mlp": (64, {"batch": 16}),
    "mnist_cnn": (40, {"batch": 16}),
    "cifar_augment": (40, {"batch": 16}),
    "etl_dask": (1500, {"epochs": 20}),
}

#: a pipeline whose ``nap`` stage writes a marker and then waits (in short sleeps) for ``seconds``
SLEEPY = '''
import os, time
import numpy as np
from placer import Pipeline

def _first(device=None):
    return np.arange(10.0)

def _nap(first, marker: str, seconds: float):
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    return first * 2

def _other(first):
    return first + 1

def build(size=None):
    # set by the tests through the environment, since ``placer run`` passes no parameters
    shape = os.environ.get("SLEEPY_SHAPE", "chain")
    marker = os.environ.get("SLEEPY_MARKER", os.devnull)
    seconds = float(os.environ.get("SLEEPY_SECONDS", "60"))
    p = Pipeline("sleepy", size=size or 10)
    p.add(name="first", fn=_first)
    p.add(name="nap", fn=_nap, inputs=["first"], params={"marker": marker, "seconds": seconds},
          pin=os.environ.get("SLEEPY_DEVICE") or None)
    if shape == "diamond":
        p.add(name="other", fn=_other, inputs=["first"])
    return p
'''

#: a pipeline file whose stages use a lock, an lru_cache and a helper module beside it
HELPED = '''
import functools, threading
import numpy as np
import helper_mod
from placer import Pipeline

_LOCK = threading.Lock()
_SEEN = {}

@functools.lru_cache(maxsize=None)
def _table(n):
    return np.arange(n, dtype=np.float64)

def _load(n: int):
    with _LOCK:
        _SEEN[n] = True
    return _table(n)

def _scale(load):
    return helper_mod.scale(load)

def build(size=None):
    p = Pipeline("helped", size=size or 100)
    p.add(name="load", fn=_load, params={"n": size or 100})
    p.add(name="scale", fn=_scale, inputs=["load"])
    return p
'''

HELPER = '''
import threading
_GUARD = threading.RLock()

def scale(a):
    with _GUARD:
        return a * 3.0 + 1.0
'''


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, memory_limit="2GiB") as c:
        yield c


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    (d / "sleepy.py").write_text(SLEEPY)
    (d / "helped.py").write_text(HELPED)
    (d / "helper_mod.py").write_text(HELPER)
    return d


def placer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from placer.cli import main; main()", *args]


def run_cli(*args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_placer(args, via="-c", capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def invoke(*args: str):
    """The command run in this process (for usage errors, which stop before any work)."""
    from typer.testing import CliRunner

    from placer.cli.app import app

    import placer.cli  # noqa: F401 - registers the commands

    return CliRunner().invoke(app, list(args))


def one_error_line(err: str) -> str:
    """stderr holds exactly one line, placer's error, and no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "__del__" not in err, err
    return lines[0]


def _busy(dask_worker) -> list:
    return [str(ts.key) for ts in dask_worker.state.tasks.values() if ts.state in ("executing", "cancelled")]


def assert_no_stage_runs_on_the_workers(client, within: float = 30.0) -> None:
    """No worker thread still runs a stage (the sleepy stage would for 60 s if it were not stopped)."""
    deadline = time.monotonic() + within
    while any(client.run(_busy).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(client.run(_busy).values()), client.run(_busy)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- every bundled pipeline on the cluster ----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ONE_SHOT))
@pytest.mark.slow
def test_every_bundled_pipeline_gives_the_local_digest_on_the_cluster(client, name):
    size, params = ONE_SHOT[name]
    p = load_pipeline(str(ROOT / "pipelines" / f"{name}.py"), size, **params)
    local = execute(p, "all=cpu").outputs_digest
    remote = execute(p, "all=cpu", scheduler=client)
    assert remote.outputs_digest == local
    assert all(s.worker in client.scheduler_info(n_workers=-1)["workers"] for s in remote.stages)


#: every bundled stream pipeline at a small size (size, params)
STREAMS = {
    "stream_images": (96, {"batch": 16, "epochs": 2}),
    "stream_tabular": (96, {"batch": 24, "epochs": 2}),
    "stream_inference": (96, {"batch": 24, "epochs": 1}),
    "stream_cache": (48, {"batch": 16, "epochs": 2, "passes": 1}),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.slow
def test_every_stream_pipeline_offloads_its_cpu_stages_with_the_sequential_digest(client, name):
    from placer.stream import StreamConfig

    size, params = STREAMS[name]
    p = load_pipeline(str(ROOT / "pipelines" / f"{name}.py"), size, **params)
    sequential = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    remote = execute(p, "all=cpu", scheduler=client)
    assert remote.outputs_digest == sequential.outputs_digest
    kinds = {s.name: s.worker_kind for s in remote.stages}
    per_batch = [m for ms in p.validate().streams().values() for m in ms[1:-1]]
    assert per_batch and all(kinds[m] == "dask" for m in per_batch), kinds
    threads = sum(w["nthreads"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    assert all(s.workers == threads for s in remote.stages if s.name in per_batch)


@pytest.mark.slow
def test_advise_on_a_cluster_measures_the_streams_cpu_stages_there_and_keeps_the_faster(client):
    from placer.advisor import advise
    from placer.stream import StreamConfig

    size, params = STREAMS["stream_inference"]
    p = load_pipeline(str(ROOT / "pipelines" / "stream_inference.py"), size, **params)
    # the CPU per-batch stage this test offloads: pinned, so that the plan never gives it to the
    # simulated test device (which it did when that measured faster, leaving nothing to offload)
    p.stages["preprocess"].pin = "cpu"
    sequential = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    advised = advise(p, scheduler=client, budget_s=6, target="none")
    plan = advised.stream_plans[0]
    other = next(a for a in plan.baselines if a.name in ("CPU stages on the cluster", "this machine only"))
    kept = advised.run.streams[0].samples_per_s
    assert other.measured_samples_per_s is not None and kept >= other.measured_samples_per_s
    assert any(r.startswith("measured on the cluster: preprocess as tasks on the cluster at tcp://127.0.0.1")
               for r in plan.reasons), plan.reasons
    kinds = {s.name: s.worker_kind for s in advised.run.stages}
    on_cluster = other.name == "this machine only"
    assert (kinds["preprocess"] == "dask") == on_cluster, kinds
    assert (plan.settings.worker_kind.get("preprocess") == "dask") == on_cluster
    assert type(plan).model_validate_json(plan.to_json()) == plan  # a plan kept on the cluster reloads
    assert advised.run.outputs_digest == sequential.outputs_digest
    assert all(r.outputs_digest == sequential.outputs_digest for r in advised.baselines.values())


def test_a_dask_worker_kind_without_a_cluster_is_refused_naming_the_stage():
    from placer.stream import StreamConfig

    size, params = STREAMS["stream_inference"]
    p = load_pipeline(str(ROOT / "pipelines" / "stream_inference.py"), size, **params)
    with pytest.raises(StageFailedError, match="stage 'preprocess' has dask workers, but no cluster.*--scheduler"):
        execute(p, "all=cpu", stream=StreamConfig(worker_kind={"preprocess": "dask"}))


@pytest.mark.slow
def test_a_stream_stage_failing_on_the_cluster_names_the_batch_and_keeps_the_state(client, tmp_path):
    from placer import Pipeline
    from placer.stream import StreamConfig

    import numpy as np

    p = Pipeline("failing-stream")

    @p.source()
    def numbers():
        return [np.full(4, float(i)) for i in range(6)]

    @p.stage()
    def double(numbers, batch_info):
        if batch_info.index == 3:
            raise ValueError("bad batch")
        return numbers * 2

    @p.step(kind="inference", init=lambda: {"sum": 0.0})
    def total(double, state):
        state["sum"] += float(double.sum())

    with pytest.raises(StageFailedError, match="stage 'double' failed.*batch 3.*bad batch") as err:
        execute(p, "all=cpu", scheduler=client, stream=StreamConfig(workers=2))
    assert err.value.stage == "double"
    assert err.value.outputs["total"] == {"sum": 2 * 4 * (0 + 1 + 2)}  # the step's state after the batches done


@pytest.mark.slow
def test_requests_cli_on_the_cluster_prints_the_local_digest(cluster, client):
    """The issue's bar: ``placer run pipelines/requests.py --placement all=cpu --scheduler ... --json``."""
    out = run_cli("run", "pipelines/requests.py", "--placement", "all=cpu", "--scheduler",
                  cluster.scheduler_address, "--json")
    assert out.returncode == 0, out.stderr
    local = execute(load_pipeline(str(ROOT / "pipelines" / "requests.py")), "all=cpu")
    assert json.loads(out.stdout)["outputs_digest"] == local.outputs_digest


def test_a_helper_module_a_lock_and_an_lru_cache_travel_as_source(client, files):
    """The helper's folder is on no worker's path: it reaches the workers only as shipped source."""
    p = load_pipeline(str(files / "helped.py"), 50)
    assert "helper_mod" in sys.modules and str(files) not in sys.path
    remote = execute(p, "all=cpu", scheduler=client)
    assert remote.outputs_digest == execute(p, "all=cpu").outputs_digest
    where = client.run(lambda: sorted(m for m in sys.modules if m in ("helper_mod",) or m.startswith("placer_user_helped")))
    assert all(len(mods) == 2 for mods in where.values()), where


def test_a_stage_that_cannot_be_pickled_is_refused_naming_it_and_the_object(client, tmp_path):
    from placer import Pipeline
    from placer.executor.shipping import ShippingError

    guard = threading.Lock()
    marker = tmp_path / "ran"

    def first():
        marker.write_text("x")
        return 1

    def locked(first):
        with guard:
            return first + 1

    p = Pipeline("locked")
    p.add(name="first", fn=first)
    p.add(name="locked", fn=locked, inputs=["first"])
    with pytest.raises(ShippingError) as err:
        execute(p, "all=cpu", scheduler=client)
    msg = str(err.value)
    assert err.value.stage == "locked"
    assert "stage 'locked'" in msg and "guard" in msg and "_thread.lock" in msg and "create it inside" in msg
    assert not marker.exists()  # refused before anything ran


@pytest.mark.slow
def test_an_unpicklable_param_is_named_by_the_cli(cluster, tmp_path):
    f = tmp_path / "param.py"
    f.write_text(textwrap.dedent('''
        import threading
        from placer import Pipeline

        def _one(guard):
            return 1

        def build(size=None):
            p = Pipeline("param")
            p.add(name="one", fn=_one, params={"guard": threading.Lock()})
            return p
    '''))
    out = run_cli("run", str(f), "--placement", "all=cpu", "--scheduler", cluster.scheduler_address)
    assert out.returncode == 1
    line = one_error_line(out.stderr)
    assert "stage 'one'" in line and "param 'guard'" in line and "cannot be pickled" in line


# -- bad scheduler addresses ---------------------------------------------------------------------------
@pytest.mark.parametrize("address, says", [
    ("not an address", "contains spaces"),
    ("http://127.0.0.1:8787", "web (dashboard) address"),
    ("tcp://127.0.0.1", "missing port"),
    ("foo://127.0.0.1:8786", "unknown scheme 'foo'"),
    ("tcp://127.0.0.1:99999", "port outside"),
])
def test_a_malformed_scheduler_address_is_a_usage_error_at_once(files, address, says):
    out = invoke("run", str(files / "sleepy.py"), "--placement", "all=cpu", "--scheduler", address)
    assert out.exit_code == 2
    line = one_error_line(out.stderr)
    assert says in line and "tcp://HOST:PORT" in line and repr(address) in line
    assert out.stdout == ""


@pytest.mark.parametrize("command", ["plan", "advise"])
def test_plan_and_advise_check_the_address_too(files, command):
    out = invoke(command, str(files / "sleepy.py"), "--scheduler", "http://127.0.0.1:8787")
    assert out.exit_code == 2
    assert "web (dashboard) address" in one_error_line(out.stderr)


@pytest.mark.slow
def test_a_malformed_address_in_a_fresh_process_exits_promptly_without_a_client_traceback(files):
    """The case that used to hang 20 s in ``Client.__del__``: a real process, to see what it prints at exit."""
    out = run_cli("run", str(files / "sleepy.py"), "--placement", "all=cpu", "--scheduler", "not an address",
                  timeout=60)
    assert out.returncode == 2
    assert "contains spaces" in one_error_line(out.stderr)


def test_the_library_refuses_a_malformed_address_without_a_client():
    from placer.executor.distributed import SchedulerAddressError, check_address

    from placer import Pipeline

    p = Pipeline("x")
    p.add(name="a", fn=lambda: 1)
    with pytest.raises(SchedulerAddressError, match="'tcp://h:x' is not HOST:PORT"):
        execute(p, "all=cpu", scheduler="tcp://h:x")
    assert check_address("127.0.0.1:8786") == "tcp://127.0.0.1:8786"


# -- a scheduler that dies mid-run -----------------------------------------------------------------
@pytest.fixture
def own_scheduler(tmp_path):
    """A scheduler and one worker as processes of their own (this test kills the scheduler)."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    sched = subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                              "--dashboard-address", "127.0.0.1:0"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([str(bin_dir / "dask"), "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                               "--no-nanny"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from distributed import Client

        with Client(address, timeout=60, set_as_default=False) as c:
            c.wait_for_workers(1, timeout=60)
        yield address, sched
    finally:
        for proc in (worker, sched):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def sleepy_env(tmp_path: Path, **settings: str) -> tuple[dict, Path]:
    marker = tmp_path / "nap-started"
    env = {**os.environ, "SLEEPY_MARKER": str(marker), **{f"SLEEPY_{k.upper()}": v for k, v in settings.items()}}
    return env, marker


def start_sleepy(files: Path, tmp_path: Path, *args: str, **settings: str):
    """``placer run sleepy.py ARGS`` started, and returned once its nap stage runs: (process, pid of the stage)."""
    env, marker = sleepy_env(tmp_path, **settings)
    proc = subprocess.Popen(placer_cmd("run", str(files / "sleepy.py"), *args), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (marker.exists() and marker.read_text().strip()):
        if proc.poll() is not None:
            raise AssertionError(f"placer ended before the stage started: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the stage did not start within 120 s")
        time.sleep(0.05)
    return proc, int(marker.read_text())


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
def test_a_scheduler_killed_mid_run_is_one_error_naming_the_running_stage(own_scheduler, files, tmp_path):
    address, sched = own_scheduler
    proc, _ = start_sleepy(files, tmp_path, "--placement", "all=cpu", "--scheduler", address, "--json")
    sched.kill()
    out, err = finish(proc, 90)
    assert proc.returncode == 1, err
    line = one_error_line(err)
    assert "lost the connection to the dask scheduler" in line and address in line and "stage 'nap'" in line
    assert out == ""


# -- Ctrl-C -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lane, args, settings", [
    ("inline chain", ["--placement", "all=cpu"], {}),
    ("threads", ["--placement", "all=cpu"], {"shape": "diamond"}),
    ("GPU lane", ["--placement", "all=cpu"], {"shape": "diamond", "device": "gpu-sim"}),
])
@pytest.mark.slow
def test_the_first_ctrl_c_stops_the_run_names_the_stage_and_exits_130(files, tmp_path, sim_env, lane, args,
                                                                       settings, monkeypatch):
    for k, v in sim_env.items():
        monkeypatch.setenv(k, v)
    proc, pid = start_sleepy(files, tmp_path, *args, **settings)
    assert pid == proc.pid  # the stage runs in the placer process itself
    family = psutil.Process(proc.pid).children(recursive=True)
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc, 30)
    assert time.monotonic() - t < 30  # the stage had 60 s left: it was stopped, not waited for
    assert proc.returncode == 130, err
    line = one_error_line(err)
    assert line.startswith("placer: interrupted while stage 'nap' was running"), line
    assert "outputs are kept" in line
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_ctrl_c_on_a_cluster_run_cancels_the_task_and_leaves_the_cluster_usable(cluster, client, files, tmp_path):
    proc, pid = start_sleepy(files, tmp_path, "--placement", "all=cpu", "--scheduler", cluster.scheduler_address)
    assert pid != proc.pid  # the stage runs on a worker
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc, 60)
    assert proc.returncode == 130, err
    assert one_error_line(err).startswith("placer: interrupted while stage 'nap' was running")
    assert_no_stage_runs_on_the_workers(client)
    assert client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3


@pytest.fixture
def python_handles_sigint():
    """SIGINT handled by Python (``KeyboardInterrupt``) for the test, whatever the process had before.

    ``_thread.interrupt_main`` does nothing when SIGINT is set to ``SIG_DFL`` or ``SIG_IGN``: these
    tests check what placer does with a KeyboardInterrupt, so they make sure one is raised, and
    restore the process's handler after."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield previous
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("executor", ["inline", "threads"])
@pytest.mark.slow
def test_an_interrupt_in_the_library_keeps_finished_outputs_and_leaves_no_thread(files, executor, monkeypatch,
                                                                                  python_handles_sigint):
    import _thread

    monkeypatch.setenv("SLEEPY_SECONDS", "60")
    p = load_pipeline(str(files / "sleepy.py"))
    before = {t.ident for t in threading.enumerate()}
    from placer.devices import discover

    discover()  # torch imported before the clock starts
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt) as err:
        execute(p, "all=cpu", executor=executor)
    assert err.value.running == ["nap"]
    assert list(err.value.outputs) == ["first"]
    recs = {r.name: r for r in err.value.run.stages}
    assert recs["first"].status == "ok" and recs["nap"].status == "failed" and "interrupted" in recs["nap"].error
    timer.join()
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, left


# -- timeouts ------------------------------------------------------------------------------------------
def test_stage_timeout_stops_the_stage_names_it_and_keeps_finished_outputs(files, monkeypatch):
    monkeypatch.setenv("SLEEPY_SHAPE", "diamond")
    p = load_pipeline(str(files / "sleepy.py"))
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(StageFailedError) as err:
        execute(p, "all=cpu", executor="threads", stage_timeout=1.0)
    assert err.value.stage == "nap"
    assert "stage 'nap' did not finish within 1 s" in str(err.value) and "--stage-timeout" in str(err.value)
    assert sorted(err.value.outputs) == ["first", "other"]
    assert err.value.run.failed_stage == "nap"
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, left


@pytest.mark.slow
def test_stage_timeout_on_the_cli_exits_1_naming_the_stage(files, tmp_path):
    env, _ = sleepy_env(tmp_path)
    out = run_cli("run", str(files / "sleepy.py"), "--placement", "all=cpu", "--stage-timeout", "1", env=env)
    assert out.returncode == 1
    line = one_error_line(out.stderr)
    assert "stage 'nap' did not finish within 1 s" in line


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_stage_timeout_that_is_not_a_positive_number_is_a_usage_error(files, value):
    out = invoke("run", str(files / "sleepy.py"), "--stage-timeout", value)
    assert out.exit_code == 2
    assert "--stage-timeout must be a finite number of seconds > 0" in one_error_line(out.stderr)


@pytest.mark.slow
def test_stage_timeout_on_the_cluster_cancels_the_task(client, files, monkeypatch):
    p = load_pipeline(str(files / "sleepy.py"))
    with pytest.raises(StageFailedError, match="stage 'nap' did not finish within 8 s") as err:
        execute(p, "all=cpu", scheduler=client, stage_timeout=8.0)  # room for a loaded worker's first task
    assert list(err.value.outputs) == ["first"]
    assert_no_stage_runs_on_the_workers(client)  # the 60 s stage was stopped there, not left running
    assert client.submit(sum, [2, 3], pure=False).result(timeout=90) == 5


@pytest.mark.slow
def test_profile_honours_the_stage_timeout(files, tmp_path):
    env, _ = sleepy_env(tmp_path)
    env["PLACER_CACHE_DIR"] = str(seeded_cache(tmp_path / "cache"))
    out = run_cli("profile", str(files / "sleepy.py"), "--budget-s", "2", "--fresh", "--stage-timeout", "2",
                  env=env, timeout=90)
    assert out.returncode == 1
    assert "stage 'nap' did not finish within 2 s" in one_error_line(out.stderr)


@pytest.mark.slow
def test_without_a_timeout_profiling_bounds_a_hung_stage_by_its_budget(files, tmp_path, monkeypatch):
    """The default bound is twice the budget (at least MIN_BOUND_S, lowered here): the 60 s stage stops at 1 s."""
    from placer.profile import profile, profiler

    monkeypatch.setattr(profiler, "MIN_BOUND_S", 1.0)
    monkeypatch.setenv("SLEEPY_SECONDS", "60")
    t = time.monotonic()
    with pytest.raises(StageFailedError, match="stage 'nap' did not finish within 1 s") as err:
        profile(str(files / "sleepy.py"), budget_s=0.5, cache=False, progress=False)
    assert time.monotonic() - t < 30  # stopped, not waited for (60 s)
    assert err.value.stage == "nap"


@pytest.mark.slow
def test_an_interrupt_stops_a_stream_whose_stage_runs_on_the_cluster(client, python_handles_sigint):
    """The stream runs in a lane thread (threads executor); its batches are cluster tasks of 2 s each."""
    import _thread

    from placer import Pipeline

    p = Pipeline("slow-stream")

    @p.source()
    def items():
        return list(range(50))

    @p.stage()
    def slow(items):
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            time.sleep(0.01)
        return items

    @p.step(kind="inference")
    def out(slow):
        return slow

    from placer.devices import discover

    discover()
    before = {t.ident for t in threading.enumerate()}
    timer = threading.Timer(4.0, _thread.interrupt_main)
    timer.start()
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        execute(p, "all=cpu", scheduler=client, executor="threads")
    assert time.monotonic() - t < 50  # 50 batches of 2 s were not waited for
    timer.join()
    assert_no_stage_runs_on_the_workers(client, within=10)
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()
            and t.name.startswith("placer")]
    assert not left, left
