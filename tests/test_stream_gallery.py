"""The stream pipelines of the gallery: the same answer under every placement and number of workers.

``gpu-sim`` is the labelled simulated test device (GPU implementations run on the
CPU), so every placement of the placeable stages runs here.
"""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from placer.digest import assert_outputs_close
from placer.executor import execute
from placer.stream import StreamConfig

ROOT = Path(__file__).resolve().parents[1]

#: (module, small size, params)
STREAMS = {
    "stream_images": (96, {"batch": 16, "epochs": 2}),
}


def build(name: str, **params):
    small, defaults = STREAMS[name]
    return importlib.import_module(f"pipelines.{name}").build(small, **{**defaults, **params})


def placements(p) -> list[dict[str, str]]:
    names = [n for n, s in p.stages.items() if s.pin is None and len(s.device_classes()) == 2]
    return [dict(zip(names, devs)) for devs in itertools.product(["cpu", "gpu-sim"], repeat=len(names))]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_every_placement_and_worker_count_gives_the_sequential_answer(name):
    p = build(name)
    ref = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    assert ref.streams[0].batches > 2
    for placement in placements(p):
        for workers in (1, 3):
            run = execute(p, placement, stream=StreamConfig(workers=workers, prefetch=2))
            assert run.outputs_digest == ref.outputs_digest, (placement, workers)
            assert_outputs_close(run.final_outputs, ref.final_outputs)


def test_pure_python_augmentation_equals_the_numpy_one():
    a = execute(build("stream_images", augment="numpy"), "all=cpu", stream=StreamConfig(workers=2))
    b = execute(build("stream_images", augment="python"), "all=cpu", stream=StreamConfig(workers=2))
    assert a.outputs_digest == b.outputs_digest


def test_placer_run_json_reports_the_stream(sim_env):
    def run(*extra):
        res = subprocess.run([sys.executable, "-m", "placer", "run", "pipelines/stream_images.py", "--size", "64",
                              "--placement", "all=cpu", "--json", *extra], capture_output=True, text=True,
                             cwd=ROOT, env=sim_env, timeout=300)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    doc, seq = run("--workers", "2"), run("--workers", "0")
    assert doc["batches"] == 2 * 64 // 64 and doc["samples_per_s"] > 0
    stages = {s["name"]: s for s in doc["stages"]}
    for name in ("batches", "augment", "train"):
        assert {"busy_s", "starved_s", "blocked_s", "workers", "worker_kind"} <= set(stages[name])
    assert stages["augment"]["workers"] == 2 and stages["augment"]["worker_kind"] == "thread"
    assert doc["outputs_digest"] == seq["outputs_digest"]
    assert doc["streams"][0]["consumer_idle_fraction"] >= 0
