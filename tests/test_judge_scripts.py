"""The judge scripts of ``benchmarks/judge/`` run, print their JSON line and read the same batches with workers.

Each script runs as a subprocess at a tiny size, as written and with ``--num-workers 2``
(worker processes); its last line must be JSON with the loop's seconds, samples,
samples/s, the digest of every batch it read and its result, and the two digests must
agree. The second run reads the data the first one wrote. Each run is forked from an interpreter
that has imported torch (``tests/warm_cli.py``): still its own process, with its own arguments, ``sys.path``,
exit and worker processes, without importing torch 24 times.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from warm_cli import run as run_python

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "benchmarks" / "judge"

#: script -> its tiniest useful sizes (a few batches, two epochs where the script trains for several)
TINY = {
    "imagefolder_train": ["--size", "20", "--epochs", "2", "--batch-size", "8"],
    "tar_shards_train": ["--size", "24", "--shards", "2", "--epochs", "1", "--batch-size", "8"],
    "memmap_train": ["--size", "32", "--epochs", "2", "--batch-size", "8"],
    "csv_parts_train": ["--size", "400", "--parts", "4", "--epochs", "1", "--batch-size", "50"],
    "columnar_train": ["--size", "64", "--epochs", "2", "--batch-size", "16"],
    "hf_map_infer": ["--size", "40", "--batch-size", "8"],
    "audio_stft_train": ["--size", "16", "--epochs", "1", "--batch-size", "8"],
    "varsize_pad_train": ["--size", "24", "--epochs", "2", "--batch-size", "8"],
    "lines_iterable_train": ["--size", "100", "--epochs", "2", "--batch-size", "16"],
    "split_compose_train": ["--size", "40", "--epochs", "2", "--batch-size", "8"],
    "epoch_index_train": ["--size", "24", "--epochs", "2", "--batch-size", "8"],
    "model_bound_infer": ["--size", "24", "--batch-size", "8"],
}
FIELDS = {"seconds", "samples", "samples_per_s", "digest", "result"}


def _run(script: str, data: Path, extra: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return run_python([str(JUDGE / f"{script}.py"), "--data-dir", str(data), *TINY[script], "--threads", "1", *extra],
                      via="script", capture_output=True, text=True, timeout=180, env=env)


def _both(script: str, data: Path) -> tuple:
    """As written (which writes the data), then with two worker processes."""
    return _run(script, data, []), _run(script, data, ["--num-workers", "2"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {s: _both(s, tmp_path_factory.mktemp(s)) for s in sorted(TINY)}


def _last_json(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert FIELDS <= set(out), out
    assert out["samples"] > 0 and out["seconds"] > 0
    return out


def test_every_judge_script_is_listed():
    assert sorted(TINY) == sorted(p.stem for p in JUDGE.glob("*.py"))


@pytest.mark.parametrize("script", sorted(TINY))
@pytest.mark.slow
def test_judge_script_reads_the_same_batches_with_workers(script, runs):
    written, workers = (_last_json(p) for p in runs[script])
    assert workers["digest"] == written["digest"]
    assert workers["samples"] == written["samples"]
