"""The stream pipelines of the gallery: the same answer under every placement and number of workers.

``gpu-sim`` is the labelled simulated test device (GPU implementations run on the
CPU), so every placement of the placeable stages runs here.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
from pathlib import Path

import pytest

from placer.digest import assert_outputs_close
from placer.errors import PlacerError
from placer.executor import execute
from placer.stream import StreamConfig
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[2]

#: (module, small size, params)
STREAMS = {
    "stream_images": (96, {"batch": 16, "epochs": 2}),
    "stream_tabular": (96, {"batch": 24, "epochs": 2}),
    "stream_inference": (96, {"batch": 24, "epochs": 1}),
    "stream_cache": (48, {"batch": 16, "epochs": 2, "passes": 1}),
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


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_one_torch_thread_gives_the_sequential_answer(name):
    p = build(name)
    ref = execute(p, "all=cpu", stream=StreamConfig(workers=0))
    run = execute(p, "all=cpu", stream=StreamConfig(workers=2, torch_threads=1))
    assert run.outputs_digest == ref.outputs_digest


def test_pure_python_augmentation_equals_the_numpy_one():
    a = execute(build("stream_images", augment="numpy"), "all=cpu", stream=StreamConfig(workers=2))
    b = execute(build("stream_images", augment="python"), "all=cpu", stream=StreamConfig(workers=2))
    assert a.outputs_digest == b.outputs_digest


@pytest.mark.slow
def test_placer_run_json_reports_the_stream(sim_env):
    def run(*extra):
        res = run_placer(["run", "pipelines/stream_images.py", "--size", "64",
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


def test_tabular_engines_and_devices_clean_identically():
    import numpy as np

    tab = importlib.import_module("pipelines.stream_tabular")
    table = tab._table(200, seed=3)
    chunk = next(tab._chunks(table, 200))
    parsed = tab._parse_numpy(chunk)
    assert np.isnan(parsed["x"]).any() and (parsed["segment"] == -1).any()
    clean = tab._clean_numpy(parsed)
    assert clean["x"].shape == (200, tab.FEATURES) and np.isfinite(clean["x"]).all()
    assert np.abs(clean["x"][:, :tab.NUMERIC]).max() <= 5.0 + 1e-5
    assert (clean["x"][parsed["segment"] == -1, tab.NUMERIC:] == 0).all()
    gpu = tab._clean_gpu(parsed, device="cpu")
    assert np.array_equal(gpu["x"].numpy(), clean["x"])
    if tab.pandas_available():
        assert np.array_equal(tab._clean_pandas(tab._parse_pandas(chunk))["x"], clean["x"])
    else:
        with pytest.raises(ValueError, match="needs pandas"):
            tab.build(10, engine="pandas")


def test_inference_predictions_come_back_in_request_order():
    run = execute(build("stream_inference", batch=10), "all=cpu", stream=StreamConfig(workers=3, prefetch=1))
    summary = run.final_outputs["summary"]
    assert summary["id"].tolist() == list(range(96))
    assert int(summary["counts"].sum()) == 96
    assert float(summary["accuracy"]) > 0.5  # the model learnt the classes of the requests
    assert run.streams[0].batches == 10


# One decode worker at most: with several, the cache currently keeps the first epoch's
# batches in the order they finished, not in sequence, and later epochs differ.
@pytest.mark.parametrize("workers", [0, 1])
def test_cache_after_decode_decodes_only_the_first_epoch(monkeypatch, workers):
    mod = importlib.import_module("pipelines.stream_cache")
    calls = []
    decode = mod._decode_cpu

    @functools.wraps(decode)
    def counting(records, passes):
        calls.append(records[0].shape[0])
        return decode(records, passes)

    ref = execute(build("stream_cache", epochs=3), "all=cpu", stream=StreamConfig(workers=workers))
    monkeypatch.setattr(mod, "_decode_cpu", counting)
    p = build("stream_cache", epochs=3)
    run = execute(p, "all=cpu", stream=StreamConfig(workers=workers, cache="decode"))
    assert calls == [16, 16, 16]  # one epoch of 3 batches, not three epochs
    assert run.streams[0].batches == 9
    assert run.outputs_digest == ref.outputs_digest
    with pytest.raises(PlacerError, match="random"):
        execute(p, "all=cpu", stream=StreamConfig(workers=workers, cache="augment"))


def test_cache_decode_is_exact_on_both_devices():
    import numpy as np
    import torch

    mod = importlib.import_module("pipelines.stream_cache")
    images = np.random.default_rng(0).integers(0, 256, (5, mod.SIDE, mod.SIDE)).astype(np.uint8)
    coeffs = mod.encode(images)
    assert not np.array_equal(coeffs, images)
    assert np.array_equal(mod._decode_cpu((coeffs, None), passes=0)[0], images)
    cpu = mod._decode_cpu((coeffs, np.zeros(5)), passes=3)[0]
    gpu = mod._decode_gpu((coeffs, np.zeros(5)), passes=3, device=torch.device("cpu"))[0]
    assert np.array_equal(cpu, gpu.numpy())
