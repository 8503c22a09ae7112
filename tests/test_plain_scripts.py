"""The plain scripts of ``benchmarks/plain/`` read the same batches whatever their loader settings.

Each script runs at a tiny size in this process (``runpy``, so torch is imported
once) with ``num_workers`` 0 and 2 (processes, and threads where the script has a
thread-pool loader, and its cache where it has one); the digest of every batch its
loop read, printed on its last line, must be the same.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PLAIN = Path(__file__).resolve().parents[1] / "benchmarks" / "plain"

#: script -> tiny sizes, and the loader settings compared with num_workers=0
CASES = {
    "images_train": (["--size", "24", "--epochs", "2", "--batch-size", "8"],
                     [["--num-workers", "2", "--prefetch-factor", "1", "--persistent-workers"],
                      ["--num-workers", "2", "--worker-kind", "thread"]]),
    "table_train": (["--size", "96", "--epochs", "2", "--batch-size", "16"],
                    [["--num-workers", "2"]]),
    "text_infer": (["--size", "48", "--batch-size", "8"],
                   [["--num-workers", "2", "--prefetch-factor", "4"], ["--num-workers", "2", "--worker-kind", "thread"]]),
    "audio_cache_train": (["--size", "12", "--epochs", "2", "--batch-size", "4"],
                          [["--num-workers", "2", "--persistent-workers", "--cache"],
                           ["--num-workers", "2", "--worker-kind", "thread", "--cache"]]),
    "mlp_big_train": (["--size", "64", "--epochs", "2", "--batch-size", "16", "--width", "64"],
                      [["--num-workers", "2"]]),
    "numpy_augment_infer": (["--size", "6", "--batch-size", "2"],
                            [["--num-workers", "2"], ["--num-workers", "2", "--worker-kind", "thread"]]),
}


def run(script: str, args: list[str], capsys, monkeypatch) -> dict:
    monkeypatch.setattr(sys, "argv", [script, *args])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(PLAIN / f"{script}.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["script"] == script
    return out


def test_every_script_is_covered():
    assert sorted(CASES) == sorted(p.stem for p in PLAIN.glob("*.py"))


@pytest.mark.parametrize("script", sorted(CASES))
def test_digest_does_not_depend_on_loader_settings(script, tmp_path, capsys, monkeypatch):
    sizes, others = CASES[script]
    base = [*sizes, "--data-dir", str(tmp_path), "--threads", "1"]
    ref = run(script, [*base, "--num-workers", "0"], capsys, monkeypatch)
    assert ref["samples"] > 0 and ref["samples_per_s"] > 0
    for extra in others:
        out = run(script, [*base, *extra], capsys, monkeypatch)
        assert out["samples"] == ref["samples"], extra
        assert out["digest"] == ref["digest"], f"{script} {extra}: other batches than with num_workers=0"
        assert out["result"] == pytest.approx(ref["result"], rel=1e-3), extra


def test_digest_sees_other_data(tmp_path, capsys, monkeypatch):
    """The digest would notice a change: another seed shuffles other batches."""
    sizes, _ = CASES["mlp_big_train"]
    base = [*sizes, "--data-dir", str(tmp_path), "--threads", "1"]
    a = run("mlp_big_train", base, capsys, monkeypatch)
    b = run("mlp_big_train", [*base, "--seed", "1"], capsys, monkeypatch)
    assert a["digest"] != b["digest"]


def test_grid_cells_are_the_scripts_flags():
    """Every grid cell is distinct and reads back from the flags the runner passes the script."""
    sys.path.insert(0, str(PLAIN.parent))
    try:
        import plain_grid
    finally:
        sys.path.remove(str(PLAIN.parent))
    for script, spec in plain_grid.SCRIPTS.items():
        cells = plain_grid.grid(script, cores=2, gpu=False)
        assert len(set(cells)) == len(cells)
        assert {c.num_workers for c in cells} == {0, 1, 2, 3, 4}
        assert ({c.worker_kind for c in cells} == {"process", "thread"}) == spec["thread"]
        assert any(c.cache for c in cells) == spec["cache"]
        for c in cells:
            assert plain_grid.config_from_flags(" ".join(c.args())) == c
    advice = {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True, "pin_memory": False,
              "torch_threads": 1, "worker_kind": "processes"}
    assert plain_grid.config_from_advice(advice).args() == [
        "--num-workers", "2", "--prefetch-factor", "4", "--persistent-workers", "--threads", "1"]
    threads = {**advice, "worker_kind": "threads", "worker_threads": True, "persistent_workers": False}
    assert plain_grid.config_from_advice(threads).args() == [
        "--num-workers", "2", "--worker-kind", "thread", "--prefetch-factor", "4", "--threads", "1"]
