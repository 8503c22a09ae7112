"""Chrome traces (Trace Event Format) of measured runs: the format, the tracks, the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.data.run import Run, StageRecord, TransferRecord
from placer.trace import chrome_trace, write_trace
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {"X": {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}, "M": {"name", "ph", "pid", "tid", "args"}}


def check_format(doc: dict) -> list[dict]:
    """Assert ``doc`` is a valid JSON-object trace; return its complete events."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] in ("ms", "ns")
    named = {}
    for e in doc["traceEvents"]:
        assert e["ph"] in REQUIRED, e
        assert REQUIRED[e["ph"]] <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if e["name"] == "thread_name":
                named[(e["pid"], e["tid"])] = e["args"]["name"]
        else:
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in named for e in complete), "every event sits on a named track"
    json.dumps(doc)  # plain JSON
    return complete


def tracks(doc: dict) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}


def two_device_run() -> Run:
    return Run(
        pipeline="demo", size=100, placement={"load": "cpu", "side": "cpu", "train": "gpu:0", "score": "gpu:0"}, executor="threads",
        workers=2, makespan_s=1.6,
        stages=[StageRecord(name="load", device="cpu", lane="cpu/0", start_s=0.0, end_s=0.25, seconds=0.25,
                            output_bytes=4096),
                StageRecord(name="side", device="cpu", lane="cpu/1", start_s=0.0, end_s=0.5, seconds=0.5),
                StageRecord(name="train", device="gpu:0", lane="gpu:0", start_s=0.3, end_s=1.5, seconds=1.2,
                            busy_s=1.0, starved_s=0.2, blocked_s=0.0, workers=1, worker_kind="thread"),
                StageRecord(name="score", device="gpu:0", lane="gpu:0", start_s=1.5, end_s=1.6, seconds=0.1)],
        transfers=[TransferRecord(data="load", src="host", dst="gpu:0", direction="h2d", bytes=4096,
                                  start_s=0.25, end_s=0.3, seconds=0.05)])


def test_one_complete_event_per_stage_and_copy_in_microseconds():
    run = two_device_run()
    events = check_format(chrome_trace(run))
    stages = {e["name"]: e for e in events if e["cat"] == "stage"}
    assert sorted(stages) == ["load", "score", "side", "train"]
    assert stages["train"]["ts"] == pytest.approx(0.3e6) and stages["train"]["dur"] == pytest.approx(1.2e6)
    assert stages["load"]["args"]["output_bytes"] == 4096
    assert stages["train"]["args"]["starved_s"] == 0.2  # a stream stage's accounting travels along
    (copy,) = [e for e in events if e["cat"] == "copy"]
    assert copy["args"]["bytes"] == 4096 and copy["args"]["direction"] == "h2d"
    assert copy["dur"] == pytest.approx(0.05e6)


def test_each_cpu_worker_gpu_and_link_is_its_own_track():
    doc = chrome_trace(two_device_run())
    events = {e["name"]: e for e in check_format(doc)}
    names = tracks(doc)
    track_of = {n: names[(e["pid"], e["tid"])] for n, e in events.items()}
    assert track_of["load"] == "cpu worker 0" and track_of["side"] == "cpu worker 1"
    assert track_of["score"] == "gpu:0"
    assert track_of["train"] == "stream stage train (gpu:0, 1 thread worker)"  # a stream stage: its own track
    assert track_of["copy load"] == "link host → gpu:0"
    assert len(set(track_of.values())) == 5


def test_several_runs_are_several_processes_in_order(tmp_path):
    plan, cpu = two_device_run(), two_device_run()
    path = write_trace({"plan": plan, "all_cpu": cpu}, tmp_path / "t.json", note="x")
    doc = json.loads(Path(path).read_text())
    check_format(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs[1].startswith("demo: plan") and procs[2].startswith("demo: all_cpu")
    assert doc["otherData"]["note"] == "x" and doc["otherData"]["pipeline"] == "demo"


@pytest.mark.slow
def test_placer_run_trace_writes_one_complete_event_per_stage(tmp_path):
    out = tmp_path / "t.json"
    r = run_placer(["run", "pipelines/tabular.py", "--size", "2000",
                        "--placement", "all=cpu", "--trace", str(out), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    events = check_format(doc)
    run = json.loads(r.stdout)
    assert sorted(e["name"] for e in events) == sorted(s["name"] for s in run["stages"])
    for s in run["stages"]:
        (e,) = [e for e in events if e["name"] == s["name"]]
        assert e["ts"] == pytest.approx(s["start_s"] * 1e6)
        assert e["dur"] == pytest.approx((s["end_s"] - s["start_s"]) * 1e6)


def test_a_failed_run_traces_the_stages_up_to_the_failure(tmp_path):
    (tmp_path / "fails.py").write_text(
        "from placer import Pipeline\n"
        "def boom(make, device):\n"
        "    raise RuntimeError('bad row')\n"
        "def build(size=None):\n"
        "    p = Pipeline('fails')\n"
        "    p.add(name='make', kind='cleaning', fn=lambda device: [1, 2])\n"
        "    p.add(name='boom', kind='other', fn=boom, inputs=['make'])\n"
        "    return p\n")
    out = tmp_path / "t.json"
    r = run_placer(["run", str(tmp_path / "fails.py"), "--placement", "all=cpu",
                        "--trace", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode != 0 and "boom" in r.stderr
    events = {e["name"]: e for e in check_format(json.loads(out.read_text()))}
    assert events["make"]["args"]["status"] == "ok" and events["boom"]["args"]["status"] == "failed"
    assert "bad row" in events["boom"]["args"]["error"]


@pytest.mark.slow
def test_a_run_with_copies_traces_them_on_a_link(tmp_path, sim_env):
    out = tmp_path / "t.json"
    r = run_placer(["run", "pipelines/tabular.py", "--size", "2000",
                        "--placement", "load=cpu,clean=gpu-sim,features=gpu-sim,train=cpu,predict=cpu",
                        "--trace", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=sim_env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    copies = [e for e in check_format(doc) if e["cat"] == "copy"]
    assert copies and all(e["args"]["bytes"] > 0 for e in copies)
    assert {tracks(doc)[(e["pid"], e["tid"])] for e in copies} >= {"link host → gpu-sim", "link gpu-sim → host"}
