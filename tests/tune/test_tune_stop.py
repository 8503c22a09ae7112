"""``placer tune`` stopped by Ctrl-C: every process of the script ended, what was measured shown and saved,
marked interrupted, and a result without a recommendation refused by ``--apply``.

The Ctrl-C comes as a terminal sends it (SIGINT to placer's process group) and as ``kill -INT PID`` does
(placer's process alone); the script runs in its own session in both, as ``placer tune`` starts it.
"""

from __future__ import annotations

import json
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
from typer.testing import CliRunner

from placer.data.stream import LoaderSettings
from placer.stream.dropin import Trial
from placer.tune.caching import CacheResult
from placer.tune.search import FIRST_ROUND, FIRST_RUN, ROUNDS, WEIGHING, Tuned, TuneState, settings_dict
from placer.tune.stopping import by_settings, stopped
from placer.tune.words import describe, recommendation, to_json, unmeasured

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "tune_scripts" / "sleepy_train.py"
PY = sys.executable


def _lines_of(stream, into: list[str]) -> threading.Thread:
    def read():
        for line in stream:
            into.append(line)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def _script_of(placer: psutil.Process, after: set[int]) -> psutil.Process | None:
    """The run of the script under way: placer's child running it, other than the runs in ``after``."""
    for child in placer.children():
        try:
            if child.pid not in after and any("sleepy_train.py" in c for c in child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def _in_group(pgid: int) -> list[psutil.Process]:
    """The live processes of process group ``pgid`` (zombies aside: they are gone, their parent not yet told)."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def _interrupt(proc: subprocess.Popen, err: list[str], how: str, workers: bool) -> tuple[int, list[psutil.Process]]:
    """Wait for a measuring run after your settings' run: the next one, or (``workers``) the first that starts
    DataLoader worker processes, and Ctrl-C placer ``how`` while it runs. Returns that run's process group
    and its processes then."""
    placer = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    seen: set[int] = set()
    while not any("samples/s" in line for line in err):  # your settings' run has ended
        assert proc.poll() is None and time.monotonic() < deadline, "".join(err)
        seen |= {c.pid for c in placer.children()}
        time.sleep(0.02)
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "".join(err)
        script = _script_of(placer, seen)
        try:
            if script is not None and (not workers or script.children()):
                family = [script, *script.children(recursive=True)]
                break
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.01)
    pgid = os.getpgid(script.pid)
    assert pgid == script.pid != os.getpgid(proc.pid)  # the run is its own process group, apart from placer's
    if how == "group":
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: placer's (foreground) process group
    else:
        proc.send_signal(signal.SIGINT)
    return pgid, family


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how, workers", [("group", False), ("pid", True)], ids=["second-run-terminal",
                                                                                  "run-with-workers-kill-pid"])
@pytest.mark.slow
def test_ctrl_c_in_a_run_ends_the_script_and_keeps_the_runs_measured(tmp_path, how, workers):
    out = tmp_path / "tuned.json"
    as_json = ["--json"] if how == "pid" else []
    cmd = [PY, "-m", "placer", "tune", "--no-cache", "--budget-s", "60", "--window-s", "0.3", "-o", str(out),
           *as_json, "--", PY, str(SCRIPT), "--epochs", "50"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err: list[str] = []
    reader = _lines_of(proc.stderr, err)
    try:
        pgid, family = _interrupt(proc, err, how, workers)
        stdout = proc.stdout.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    stderr = "".join(err)
    assert proc.returncode == 130, stderr
    assert "placer: interrupted" in stderr and f"saved in {out}" in stderr
    # no process of the script left: the run's group is empty
    assert len(family) >= (2 if workers else 1)  # the script, and its DataLoader's worker processes
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert _in_group(pgid) == []
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and data["recommended"] is None and data["change"] is False
    assert data["stopped_during"] == FIRST_ROUND and "Stopped by Ctrl-C" in data["verdict"]["sentence"]
    # your settings' completed run is kept, with its samples/s, in the trials and in the runs
    mine = data["as_written"]
    assert data["trials"][0]["num_workers"] == mine["num_workers"] == 0
    assert len(data["trials"][0]["runs"]) == 1 and data["trials"][0]["runs"][0] > 0
    assert data["runs"][0]["settings"] == mine and data["runs"][0]["samples_per_s"] > 0
    # every completed run is there, once; the run cut short is not
    assert len(data["runs"]) == sum(len(t["runs"]) for t in data["trials"])
    # as many as the progress lines that reported a completed run (which runs came before the first with
    # workers depends on what the budget let the first round try)
    completed = [line for line in err if re.search(r": ([\d,]+ samples/s|failed)  \(\d+ of \d+ s\)", line)]
    assert len(data["runs"]) == len(completed) >= 1 and (workers or len(completed) == 1), stderr
    assert all(t["num_workers"] == 0 for t in data["trials"])  # the run with workers was the one stopped
    if as_json:
        assert json.loads(stdout) == data
    else:
        assert "Recommended: none" in stdout and "(as written)" in stdout
    r = CliRunner().invoke(_app(), ["tune", "--apply", str(out), "--", PY, str(SCRIPT)])
    assert r.exit_code == 1
    assert str(out) in r.output and "stopped by Ctrl-C" in r.output and "no recommendation to apply" in r.output
    assert "to its end" in r.output


def _app():
    from placer.cli import app

    return app


def _trial(settings: LoaderSettings, *rates: float, started: float = 0.0) -> Trial:
    """A setting's runs at ``rates`` samples/s (one run: started at ``started``)."""
    many = len(rates) > 1
    return Trial(settings=settings, samples_per_s=float(np.median(rates)), first_batch_s=0.1, fetch_fraction=0.6,
                 batches=10, samples=80, seconds=1.0, repeats=rates if many else (),
                 started=tuple(float(k) for k in range(len(rates))) if many else (started,))


MINE = LoaderSettings(num_workers=0)
TWO = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True)


def test_a_search_stopped_before_any_measured_run_shows_what_it_knew_and_holds_nothing_to_apply():
    state = TuneState(command=["python", "train.py"], budget_s=60)
    assert state.step == FIRST_RUN and stopped(state) is None
    lines, data = unmeasured(state)
    assert data["interrupted"] is True and data["recommended"] is None and data["trials"] == []
    assert "before any run of your script was measured" in lines[1]
    with pytest.raises(ValueError, match="stopped by Ctrl-C during the first run of your script"):
        recommendation(json.loads(json.dumps(data)))


def test_the_runs_of_one_setting_are_one_trial_in_the_order_first_run():
    runs = [_trial(MINE, 100.0, started=1), _trial(TWO, 180.0, started=2), _trial(MINE, 110.0, started=3)]
    merged = by_settings(runs)
    assert [settings_dict(t.settings) for t in merged] == [settings_dict(MINE), settings_dict(TWO)]
    assert merged[0].rates == (100.0, 110.0) and merged[1].rates == (180.0,)


def test_a_search_stopped_while_the_cache_is_weighed_keeps_the_settings_its_rounds_decided():
    mine, two = _trial(MINE, 100.0, 104.0, 98.0), _trial(TWO, 210.0, 205.0, 215.0)
    cache = CacheResult({"method": "Clips.decode", "recommended": True, "budget_bytes": 1000}, plain=[200.0],
                        cached=[300.0], batches=50)
    tuned = Tuned(command=["python", "train.py"], site="train.py:9", others=[], user=mine, recommended=two,
                  trials=[mine, two], noise=None, startup_s=1.0, budget_s=60, used_s=30, batches=10, arguments={},
                  cache=cache)
    state = TuneState(command=tuned.command, budget_s=60, step=WEIGHING, tuned=tuned)
    result = stopped(state)
    assert result.interrupted == WEIGHING and result.decided and not result.cached
    assert "stopped by Ctrl-C while it was weighed, after 1 complete round" in result.cache.reason
    data = json.loads(json.dumps(to_json(result)))
    assert data["interrupted"] is True and data["recommended"]["num_workers"] == 2
    assert data["recommended"]["cache"] is None  # the cache's rounds did not decide: not applied
    site, settings = recommendation(data)  # a recommendation the completed rounds decided: --apply takes it
    assert site == "train.py:9" and settings["num_workers"] == 2
    assert any("the cache inside the Dataset was not" in line for line in describe(result))


def test_a_search_stopped_in_its_rounds_shows_the_runs_so_far_and_recommends_nothing():
    from types import SimpleNamespace

    runs = [_trial(MINE, 100.0, started=1), _trial(TWO, 250.0, started=2)]
    state = TuneState(command=["python", "train.py"], budget_s=60, step=ROUNDS,
                      rec={"site": "train.py:9", "arguments": {}}, as_written=MINE, batches=10,
                      runner=SimpleNamespace(measured=runs, runs=[{"settings": settings_dict(MINE)},
                                                                  {"settings": settings_dict(TWO)}]))
    result = stopped(state)
    assert not result.decided and result.interrupted == ROUNDS and not result.change
    data = to_json(result)
    assert data["recommended"] is None and data["speedup"] is None and len(data["trials"]) == 2
    assert "2.50x your settings' samples/s (1 run(s) against your 1; not decided)" in data["verdict"]["sentence"]
    text = "\n".join(describe(result))
    assert "Recommended: none" in text and "(recommended)" not in text
