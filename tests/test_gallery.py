"""The pipeline gallery: every pipeline gives the same answer on every placement.

Each pipeline runs at a small size with tiny models on ``all=cpu``, ``all=gpu-sim``
(the simulated device: GPU implementations, numba.cuda in its simulator), a mixed
placement, and every placement of its placeable stages; all digests must match
and all outputs must be close to the all-CPU run's.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from placer.digest import assert_outputs_close
from placer.executor import execute
from warm_cli import run as run_placer
from seeded_cache import seeded_cache

ROOT = Path(__file__).resolve().parents[1]

#: (module, small size, params): small enough that the whole file stays quick
GALLERY = {
    "mnist_mlp": (64, {"batch": 16}),
    "mnist_cnn": (40, {"batch": 16}),
    "cifar_augment": (40, {"batch": 16}),
    "batched_inference": (300, {"batch": 128}),
    "timeseries": (400, {}),
    "branches": (60, {}),
    "etl_dask": (1500, {"epochs": 20}),
    "transformer": (4, {"d_model": 32, "heads": 4, "vocab": 64, "seq": 16}),
}


def build(name: str, size: int | None = None, **params):
    small, defaults = GALLERY[name]
    mod = importlib.import_module(f"pipelines.{name}")
    return mod.build(size or small, **{**defaults, **params})


def placeable(p) -> list[str]:
    """Stages the planner may move: not pinned, with both a CPU and a GPU implementation."""
    return [n for n, s in p.stages.items() if s.pin is None and len(s.device_classes()) == 2]


def all_placements(p) -> list[dict[str, str]]:
    names = placeable(p)
    return [dict(zip(names, devs)) for devs in itertools.product(["cpu", "gpu-sim"], repeat=len(names))]


@pytest.mark.parametrize("name", sorted(GALLERY))
@pytest.mark.slow
def test_every_placement_gives_the_same_outputs(name):
    p = build(name)
    names = placeable(p)
    assert 2 <= len(names) <= 6, f"{name}: expected a small set of placeable stages, got {names}"
    reference = execute(p, "all=cpu")
    assert all(s.device == "cpu" for s in reference.stages)
    mixed = {n: ("gpu-sim" if i % 2 == 0 else "cpu") for i, n in enumerate(names)}
    placements = [{n: "gpu-sim" for n in names}, mixed, *all_placements(p)]
    for placement in placements:
        run = execute(p, placement)
        for n, dev in placement.items():
            assert run.stage(n).device == dev, f"{name}: {n} ran on {run.stage(n).device}, not {dev}"
        assert run.outputs_digest == reference.outputs_digest, f"{name}: digest differs under {placement}"
        assert_outputs_close(reference.final_outputs, run.final_outputs)


@pytest.mark.parametrize("name", sorted(GALLERY))
def test_all_gpu_moves_data_and_keeps_the_source_on_the_host(name):
    p = build(name)
    run = execute(p, "all=gpu-sim")
    for n, s in p.stages.items():
        expected = "cpu" if s.pin == "cpu" else "gpu-sim"
        assert run.stage(n).device == expected, f"{name}: {n}"
    assert any(t.direction == "h2d" for t in run.transfers), f"{name}: no host-to-device copy recorded"
    assert any(t.direction == "d2h" for t in run.transfers), f"{name}: results never came back to the host"


@pytest.mark.parametrize("name", sorted(GALLERY))
def test_outputs_depend_on_the_seed_and_are_finite(name):
    a = execute(build(name), "all=cpu")
    b = execute(build(name, seed=3), "all=cpu")
    assert a.outputs_digest != b.outputs_digest, f"{name}: the seed does not reach the outputs"
    again = execute(build(name), "all=cpu")
    assert again.outputs_digest == a.outputs_digest, f"{name}: not deterministic"
    from placer.digest import to_numpy

    def leaves(v):
        if isinstance(v, dict):
            for x in v.values():
                yield from leaves(x)
        else:
            yield np.asarray(to_numpy(v))

    for out in a.final_outputs.values():
        for arr in leaves(out):
            assert np.isfinite(arr).all(), f"{name}: non-finite output"


@pytest.mark.parametrize("name", sorted(GALLERY))
def test_too_small_a_size_is_refused_naming_the_pipeline(name):
    mod = importlib.import_module(f"pipelines.{name}")
    with pytest.raises(ValueError, match=name):
        mod.build(0)


def test_training_learns_something():
    """The synthetic digits are learnable: more epochs give a lower held-out loss."""
    short = execute(build("mnist_mlp", 400, epochs=1, batch=32), "all=cpu").final_outputs["evaluate"]
    longer = execute(build("mnist_mlp", 400, epochs=4, batch=32), "all=cpu").final_outputs["evaluate"]
    assert float(longer["test_loss"]) < float(short["test_loss"])
    assert float(longer["p_true"].mean()) > 0.5


def test_cifar_augmentation_paths_agree_bit_for_bit_and_match_a_reference_loop():
    import torch

    from pipelines import cifar_augment as c

    labels = c._labels(50, 1)
    images, jitter = c._images(labels, 1), c._jitter(50, 1)
    assert set(np.unique(jitter[:, 2])) == {0, 1}
    cpu = c.augment_cpu(images, jitter)
    gpu = c.augment_gpu(torch.from_numpy(images), torch.from_numpy(jitter), torch.device("cpu")).numpy()
    np.testing.assert_array_equal(cpu, gpu)
    mean, std = np.array(c.CIFAR_MEAN)[:, None, None], np.array(c.CIFAR_STD)[:, None, None]
    for k in range(len(images)):
        dy, dx, flip = jitter[k]
        crop = np.pad(images[k], ((0, 0), (4, 4), (4, 4)))[:, dy : dy + 32, dx : dx + 32]
        if flip:
            crop = crop[:, :, ::-1]
        np.testing.assert_allclose(cpu[k], (crop / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)


def test_ema_kernels_compute_the_recurrence():
    from pipelines import timeseries as t

    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    want, acc = np.empty(300), float(x[0])
    for i, v in enumerate(x):
        acc = 0.1 * float(v) + 0.9 * acc
        want[i] = acc
    cpu = t._ema_cpu(x, 0.1)
    np.testing.assert_allclose(cpu, want, rtol=1e-6, atol=1e-7)
    from numba import cuda

    gpu = t._ema_gpu(cuda.to_device(x), 0.1).copy_to_host()
    np.testing.assert_array_equal(gpu, cpu)


def test_numba_cache_failure_falls_back_to_compiling_in_memory(monkeypatch):
    import numba

    from pipelines import timeseries as t

    real = numba.njit

    def njit(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kwargs)

    t.ema_cpu_kernel.cache_clear()
    monkeypatch.setattr(numba, "njit", njit)
    try:
        kernel = t.ema_cpu_kernel()
        out = np.empty(5, dtype=np.float32)
        kernel(np.ones(5, dtype=np.float32), 0.5, out)
        np.testing.assert_allclose(out, 1.0)
    finally:
        t.ema_cpu_kernel.cache_clear()


def test_etl_cpu_group_by_runs_on_dask_partitions(monkeypatch):
    from pipelines import etl_dask as e

    calls = []
    real = e._partial_sums

    def counting(part, users):
        calls.append(part.shape[0])
        return real(part, users)

    p = build("etl_dask", 3000)
    reference = execute(p, "all=cpu")
    monkeypatch.setattr(e, "PARTITION_ROWS", 700)
    monkeypatch.setattr(e, "_partial_sums", counting)
    run = execute(p, "all=cpu")
    assert calls and sum(calls) == 3000 and len(calls) == 5
    assert run.outputs_digest == reference.outputs_digest


def test_etl_cpu_cleaning_uses_the_executors_data_parallel_path():
    from placer.executor.stagecall import MIN_ROWS_PER_PARTITION

    p = build("etl_dask", 2 * MIN_ROWS_PER_PARTITION)
    assert p.stages["clean"].data_parallel
    one = execute(p, "all=cpu", workers=1)
    two = execute(p, "all=cpu", workers=2)
    assert one.outputs_digest == two.outputs_digest
    np.testing.assert_array_equal(one.outputs["clean"], two.outputs["clean"])


def test_batched_inference_uses_the_requests_model():
    """One row scored by the batched pipeline equals the requests pipeline's scoring of it."""
    import torch

    from pipelines import batched_inference as b
    from pipelines import requests as r

    raw = torch.from_numpy(b._requests(5, 7))
    cpu = torch.device("cpu")
    want = torch.softmax(r._infer(r._preprocess(raw, cpu), cpu), 1)
    got = b._postprocess(b._infer(b._preprocess(raw, cpu), cpu, batch=2), cpu)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name,placement", [("timeseries", "all=gpu-sim"), ("cifar_augment", "all=cpu,train=gpu-sim")])
@pytest.mark.slow
def test_placer_run_cli_gives_the_in_process_digest(name, placement, sim_env):
    small, _ = GALLERY[name]
    mod = importlib.import_module(f"pipelines.{name}")
    expected = execute(mod.build(small), "all=cpu").outputs_digest
    proc = run_placer(["run", f"pipelines.{name}:build",
         "--size", str(small), "--placement", placement, "--json"], via="-c",
        capture_output=True, text=True, env=sim_env, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["outputs_digest"] == expected
    devices = {s["name"]: s["device"] for s in doc["stages"]}
    for item in placement.split(","):
        stage, dev = item.split("=")
        if stage != "all":
            assert devices[stage] == dev
    if placement == "all=gpu-sim":
        assert all(devices[n] == "gpu-sim" for n in placeable(mod.build(small)))


#: sizes for the advise flow: large enough that the profiler's smaller sizes build
ADVISE_SIZES = {"mnist_mlp": 200, "mnist_cnn": 100, "cifar_augment": 100, "batched_inference": 500,
                "timeseries": 1000, "branches": 100, "etl_dask": 2000, "transformer": 2}
#: parameters that keep a pipeline's advise flow affordable on a 2-core CPU (the transformer's
#: defaults are a realistic model width: seconds per step of one sequence here)
ADVISE_PARAMS = {"transformer": {"d_model": 64, "heads": 4, "vocab": 128, "seq": 32}}


@pytest.mark.parametrize("name", sorted(GALLERY))
@pytest.mark.slow
def test_advise_plans_and_runs_every_pipeline(name, tmp_path, monkeypatch):
    from placer.advisor import advise

    monkeypatch.setenv("PLACER_CACHE_DIR", str(seeded_cache(tmp_path)))
    size = ADVISE_SIZES[name]
    mod = importlib.import_module(f"pipelines.{name}")
    small = ADVISE_PARAMS.get(name)
    ref = functools.partial(mod.build, **small) if small else f"pipelines.{name}:build"
    advice = advise(ref, size=size, budget_s=1.5, target="none")
    p = advice.pipeline
    assert set(advice.plan.placement) == set(p.stages)
    for n, s in p.stages.items():
        if s.pin == "cpu":
            assert advice.run.stage(n).device == "cpu", f"{name}: pinned stage {n} left the CPU"
    # the same answer as all on the CPU in the precisions the plan chose (a lower one only where its accuracy was
    # checked here first: the transformer's train step may be planned in bf16, which the CPU runs too)
    same = execute(mod.build(size, **(small or {})), "all=cpu", precision=dict(advice.plan.precision) or None)
    assert advice.run.outputs_digest == same.outputs_digest
    assert advice.facts.summary.digests_agree is not False


def test_placer_advise_cli_writes_a_report(tmp_path, sim_env):
    env = {**sim_env, "PLACER_CACHE_DIR": str(seeded_cache(tmp_path / "cache"))}
    out = tmp_path / "report.md"
    proc = run_placer(["advise", "pipelines.branches:build",
         "--size", "100", "--budget-s", "1.5", "--target", "none", "-o", str(out), "--json"], via="-c",
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc["placement"]) == {"events", "sessions", "embed", "score"}
    assert doc["placement"]["events"] == "cpu"
    assert "branches" in out.read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GALLERY))
def test_real_gpu_placements_give_the_same_outputs(name):
    import os

    p = build(name)
    uses_numba_cuda = any(s.gpu is not None and s.gpu.api == "numba.cuda" for s in p.stages.values())
    if uses_numba_cuda and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("numba.cuda runs in its simulator here; set PLACER_REAL_GPU=1 to run the kernels on the GPU")
    reference = execute(p, "all=cpu")
    names = placeable(p)
    mixed = {n: ("gpu:0" if i % 2 == 0 else "cpu") for i, n in enumerate(names)}
    for placement in ({n: "gpu:0" for n in names}, mixed):
        run = execute(p, placement)
        assert_outputs_close(reference.final_outputs, run.final_outputs, rtol=1e-3, atol=1e-4)
        assert run.outputs_digest == reference.outputs_digest, f"{name}: digest differs under {placement}"


def _benchmark(tmp_path, env, *args):
    out = tmp_path / "advisor.txt"
    proc = run_placer(
        ["benchmarks/advisor.py", "--pipelines", "requests", "--sizes", "small", "--budget-s", "2",
         "--reps", "1", "--out", str(out), *args],
        via="script", capture_output=True, text=True, env=env, timeout=240, cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_text(), json.loads(out.with_suffix(".json").read_text())



@pytest.mark.slow
def test_advisor_benchmark_records_the_machine_and_never_calls_the_simulator_a_gpu(tmp_path):
    import os

    import torch

    env = {k: v for k, v in os.environ.items() if k != "PLACER_TEST_DEVICES"}
    env["PLACER_CACHE_DIR"] = str(seeded_cache(tmp_path / "cache"))
    text, doc = _benchmark(tmp_path, env)
    assert f"{os.cpu_count()} cores" in text and "torch " + torch.__version__ in text
    assert "gpu-sim" not in doc["meta"]["devices"]
    (row,) = doc["rows"]
    assert row["pipeline"] == "requests" and row["plan_measured_s"] > 0
    if not torch.cuda.is_available():
        assert "GPU placements were not measurable here" in text
        assert row["placements_measured"] == 1 and row["baselines_s"].keys() == {"all_cpu"}

    text, doc = _benchmark(tmp_path, env, "--simulated")
    assert "SIMULATED" in text and "It is not a GPU" in text
    (row,) = doc["rows"]
    assert row["oracle_complete"] and row["placements_measured"] == 2 ** row["placeable"]
    assert row["digests_agree"] and row["outputs_agree"] and row["outputs_differ"] is None
    assert row["plan_over_oracle"] >= 1.0 or row["plan_placement"] == row["oracle_placement"]


def test_cnn_turns_off_tf32_on_cuda_only_inside_its_stages():
    import torch

    from pipelines.mnist_cnn import exact_fp32

    before = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic)
    with exact_fp32(torch.device("cuda", 0)):
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cudnn.deterministic is True
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic) == before
    with exact_fp32(torch.device("cpu")):
        assert torch.backends.cudnn.allow_tf32 == before[0]


def test_advisor_benchmark_calls_digests_on_two_sides_of_a_rounding_step_close_not_different():
    """Two placements' digests may differ only because an aggregate rounded the other way; the advisor
    benchmark then compares the values (as placer's own report does) and says "close", keeping "DIFFER"
    for outputs that differ beyond the tolerance."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import advisor as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    base = {"w": np.linspace(1.0, 2.0, 1000)}
    nudged = {"w": base["w"] * (1 + 3e-6)}
    far = {"w": base["w"] * (1 + 1e-2)}
    assert bench.outputs_differ({"a": base, "b": nudged}, ["a", "b", "a"]) is None
    why = bench.outputs_differ({"a": base, "b": nudged, "c": far}, ["a", "b", "c"])
    assert why is not None and "'w'" in why
    assert bench.outputs_differ({"a": base}, ["a", "z"]) is None  # a digest with no outputs kept: not compared
    assert bench.agreement({"digests_agree": True}) == "same"
    assert bench.agreement({"digests_agree": False, "outputs_agree": True}) == "close"
    assert bench.agreement({"digests_agree": False, "outputs_agree": False}) == "DIFFER"
    assert bench.agreement({"digests_agree": False}) == "DIFFER"  # a record from before values were compared
