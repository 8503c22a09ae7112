"""The README's code runs as written, and gives the same answer on the simulated device."""

from __future__ import annotations

import re
from pathlib import Path

from placer.digest import assert_outputs_close
from placer.executor import execute

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs_and_is_placement_independent(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)  # noqa: S102 - our own README
    out = capsys.readouterr().out
    run = ns["run"]
    assert run.outputs_digest in out
    assert [s.name for s in run.stages] == ["load", "clean", "ema"]
    sim = execute(ns["p"], "all=cpu,clean=gpu-sim,ema=gpu-sim")
    assert sim.stage("ema").device == "gpu-sim"
    assert sim.outputs_digest == run.outputs_digest
    assert_outputs_close(run.final_outputs, sim.final_outputs)


def test_readme_stream_example_runs_and_equals_the_sequential_run(capsys):
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "@p.source" in b]
    assert blocks, "the README has no stream example"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)  # noqa: S102 - our own README
    assert "augment" in capsys.readouterr().out
    from placer.stream import StreamConfig

    run = ns["run"]
    assert run.streams[0].batches == 2 * 1024 // 64
    seq = execute(ns["p"], "all=gpu-sim", stream=StreamConfig(workers=0))
    assert seq.outputs_digest == run.outputs_digest
    assert_outputs_close(run.final_outputs, seq.final_outputs)
