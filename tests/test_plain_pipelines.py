"""The pipeline forms of the plain scripts (``benchmarks/plain/pipelines``) and their plans as the scripts' flags.

Each form validates and runs a tiny stream; a form reads the same batches as its
script (the digest of every batch, as the script's loop takes it), with and without
workers and, for ``audio_cache_train``, with its cache; ``plan_flags`` writes a plan's
settings as the script's flags and names what they cannot express.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from placer.executor import execute  # noqa: E402
from placer.executor.stream.config import StreamConfig  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from plain_pipeline import forms, plan_flags  # noqa: E402

#: script -> tiny sizes (the script's flags; the form's build() takes the same)
SIZES = {"images_train": dict(size=12, epochs=2, batch_size=4),
         "table_train": dict(size=40, epochs=2, batch_size=8),
         "audio_cache_train": dict(size=6, epochs=2, batch_size=4),
         "text_infer": dict(size=24, epochs=1, batch_size=8)}
#: script -> its step
STEP = {"text_infer": "predict"}


def load(script: str):
    spec = importlib.util.spec_from_file_location(f"{script}_pipeline", forms()[script])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_form(script: str, data_dir: Path, config: StreamConfig):
    p = load(script).build(**SIZES[script], data_dir=str(data_dir))
    threads = torch.get_num_threads()
    try:
        return execute(p, {n: "cpu" for n in p.stages}, stream=config)
    finally:
        torch.set_num_threads(threads)


def run_script(script: str, data_dir: Path, capsys, monkeypatch) -> dict:
    sizes = SIZES[script]
    monkeypatch.setattr(sys, "argv", [script, "--size", str(sizes["size"]), "--epochs", str(sizes["epochs"]),
                                      "--batch-size", str(sizes["batch_size"]), "--data-dir", str(data_dir)])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(BENCH / "plain" / f"{script}.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_forms_are_the_expected_scripts():
    assert set(SIZES) <= set(forms())


@pytest.mark.parametrize("script", sorted(SIZES))
def test_form_validates_and_runs_a_few_batches(script, tmp_path):
    p = load(script).build(**SIZES[script], data_dir=str(tmp_path))
    p.validate()
    run = run_form(script, tmp_path, StreamConfig(max_batches=2))
    assert run.streams[0].batches == 2
    state = run.outputs[STEP.get(script, "train")]
    if script == "text_infer":  # predicted classes counted for every document of the two batches
        assert state["counts"].sum() == 2 * SIZES[script]["batch_size"]
    else:  # a training step per batch
        assert len(state["losses"]) == 2


@pytest.mark.parametrize("script", sorted(SIZES))
@pytest.mark.slow
def test_form_reads_the_scripts_batches(script, tmp_path, capsys, monkeypatch):
    """The digest of every batch the step took equals the script's, whatever the settings."""
    written = run_script(script, tmp_path, capsys, monkeypatch)
    source = next(iter(load(script).build(**SIZES[script], data_dir=str(tmp_path)).validate().streams()))
    configs = [StreamConfig(workers=0), StreamConfig(stage_workers={source: 2}, prefetch=1, torch_threads=1)]
    if script == "audio_cache_train":  # the script's --cache: the spectrograms kept by sample at the source
        configs.append(StreamConfig(stage_workers={source: 2}, cache=source))
    for config in configs:
        state = run_form(script, tmp_path, config).outputs[STEP.get(script, "train")]
        assert state["digest"].hexdigest() == written["digest"], config


SETTINGS = {"workers": 1, "stage_workers": {}, "worker_kind": {}, "prefetch": 2, "pin_memory": True, "cache": None,
            "torch_threads": None, "stage_group": {}}


def flags_of(source="src", step="train", stages=(), cache_flag=False, thread_flag=True, **settings):
    placement = {source: "cpu", **{s: "cpu" for s in stages}, step: "cpu"}
    return plan_flags({"placement": placement, **SETTINGS, **settings}, source, step, cache_flag=cache_flag,
                      thread_flag=thread_flag)


def test_plan_flags_workers_prefetch_threads():
    assert flags_of(stage_workers={"src": 3}, prefetch=4, torch_threads=1) == (
        ["--num-workers", "3", "--prefetch-factor", "4", "--threads", "1"], [])
    assert flags_of(workers=0, stage_workers={"src": 3}) == ([], [])  # one batch at a time: the script as written


def test_plan_flags_cache_at_the_source():
    flags, notes = flags_of(stage_workers={"src": 2}, cache="src", cache_flag=True)
    assert flags == ["--num-workers", "2", "--prefetch-factor", "2", "--persistent-workers", "--cache"] and not notes
    assert flags_of(workers=0, cache="src", cache_flag=True) == (["--cache"], [])


def test_plan_flags_loader_in_a_thread():
    """No DataLoader workers, but the stream reads the loader in a thread beside the step: the script's
    thread-pool loader with one thread, where it has one."""
    assert flags_of(stage_workers={"src": 0}, prefetch=3) == (
        ["--num-workers", "1", "--worker-kind", "thread", "--prefetch-factor", "3"], [])
    flags, notes = flags_of(stage_workers={"src": 0}, thread_flag=False)
    assert flags == [] and "no thread-pool loader" in notes[0]


def test_plan_flags_names_what_it_cannot_express():
    flags, notes = flags_of(stage_workers={"src": 0}, cache="src")
    assert flags == ["--num-workers", "1", "--worker-kind", "thread", "--prefetch-factor", "2"]
    assert any("cannot be applied" in n and "no --cache" in n for n in notes)
    flags, notes = flags_of(stages=["augment"], stage_workers={"src": 1, "augment": 2},
                            worker_kind={"augment": "process"}, cache="augment", cache_flag=True)
    assert flags == ["--num-workers", "1", "--prefetch-factor", "2"]
    assert any("2 process workers of 'augment'" in n for n in notes)
    assert any("cache after 'augment': cannot be applied" in n for n in notes)
    flags, notes = flags_of(stages=["augment"], stage_workers={"src": 1, "augment": 1})
    assert not notes  # one thread for a per-batch stage beside worker processes: what the script's loader does
    flags, notes = flags_of(stages=["augment"], stage_workers={"src": 0, "augment": 1})
    assert flags[:4] == ["--num-workers", "1", "--worker-kind", "thread"]
    assert notes == ["'augment' in a thread of its own beside the loader's: no flag (the script's loader runs it "
                     "in its thread)"]
