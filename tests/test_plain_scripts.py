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
    # "keep your settings": the script as written, not flags restating its settings
    kept = {**advice, "num_workers": 0, "torch_threads": 2, "change": False}
    assert plain_grid.config_from_advice(kept) == plain_grid.Config() and not plain_grid.config_from_advice(kept).args()
    assert plain_grid.config_from_advice({**kept, "change": True}).args() == ["--threads", "2"]


def _plain_grid():
    sys.path.insert(0, str(PLAIN.parent))
    try:
        import plain_grid
    finally:
        sys.path.remove(str(PLAIN.parent))
    return plain_grid


def test_the_drop_in_is_scored_by_running_the_script_with_its_advice_applied(monkeypatch):
    """Each final round runs the script with --placer-advice (the advice applied by the script, cache
    and thread loader included), interleaved with the grid's best and the script as written; the claim
    is checked against the same rounds."""
    pg = _plain_grid()
    calls = []
    rates = {"as written": 100.0, pg.DROPIN: 300.0}

    def fake(script, config, *, base, phase, timeout_s, extra=(), label=None, keep_output=False, prefix=()):
        calls.append((label, list(extra), keep_output))
        if label and label.startswith("drop-in settings"):
            assert config.args() == ["--threads", "1", "--cache"]
        rate = rates.get(label, 250.0)
        advice = {"num_workers": 0, "torch_threads": 1, "cache": True, "claimed_speedup": 2.8} \
            if "--placer-advice" in extra else None
        return pg.Run(script, label, list(extra), phase, 1.0, True, seconds=1.0, samples_per_s=rate, digest="d",
                      advice=advice, output="advice text" if keep_output else None, load=1.0)

    monkeypatch.setattr(pg, "run_script", fake)
    a = type("A", (), dict(quick=True, advise=True, pipeline=False, score=[], repeats=1, final_rounds=3, top=1,
                           timeout_s=9, gpu=False))()
    doc = pg.bench_script("audio_cache_train", a, PLAIN, lambda m: None)
    dropin = [c for c in calls if c[0] == pg.DROPIN]
    assert len(dropin) == 3 and all(c[1] == ["--placer-advice"] and c[2] for c in dropin)
    # and the settings of one advice run before the grid, as the script's flags in a new process
    key = "drop-in settings: 0 workers, torch threads 1, cache"
    assert [c[0] for c in calls].count(key) == 3 and doc["scored"][key]["cache"]
    assert doc["claimed_vs_measured_settings"]["measured"] == pytest.approx(2.5)
    assert doc["final"][pg.DROPIN]["median"] == 300.0
    assert doc["score_vs_grid_best"][pg.DROPIN] == pytest.approx(300 / 250)
    c = doc["claimed_vs_measured"]
    assert c["claimed"] == 2.8 and c["measured"] == pytest.approx(3.0) and c["within"]
    assert [d["settings"] for d in doc["advice"]] == ["0 workers, torch threads 1, cache"] * 3
    # a script without a --cache flag cannot run a cache as flags: scored as applied only
    calls.clear()
    table = pg.bench_script("table_train", a, PLAIN, lambda m: None)
    assert not any((c[0] or "").startswith("drop-in settings") for c in calls) and table["final"][pg.DROPIN]["ok"] == 3
    assert "advice applied" in pg.markdown({"machine": "m", "mode": "quick", "load_start": [1], "load_end": [1],
                                            "seconds": 1, "command": "c", "scripts": [doc]})


def test_the_pipeline_forms_claim_is_the_speed_up_its_report_states(monkeypatch):
    """The pipeline form's report states the plan's measured speed-up over one batch at a time (its options
    table); that is its claim, set against the script's. The model's predicted one (JSON only) is set against
    it apart, as the model's accuracy, and not counted among the claims."""
    pg = _plain_grid()
    rates = {"as written": 100.0}

    def fake(script, config, *, base, phase, timeout_s, extra=(), label=None, keep_output=False, prefix=()):
        rate = rates.get(label, 250.0 if (label or "").startswith("pipeline form") else 120.0)
        return pg.Run(script, label, list(extra), phase, 1.0, True, seconds=1.0, samples_per_s=rate, digest="d",
                      load=1.0)

    plan = {"script": "text_infer", "command": ["python", "-m", "placer", "advise", "x.py"], "source": "batches",
            "step": "predict", "settings": {"stage_workers": {"batches": 2}, "torch_threads": 1},
            "predicted_samples_per_s": 1.0, "measured_samples_per_s": 1.0, "predicted_speedup": 3.2,
            "measured_speedup": 2.4, "claimed_speedup": 2.4}
    monkeypatch.setattr(pg, "run_script", fake)
    monkeypatch.setattr(pg, "advise_pipeline", lambda script, base, **kw: dict(plan))
    a = type("A", (), dict(quick=True, advise=False, pipeline=True, score=[], repeats=1, final_rounds=3, top=1,
                           timeout_s=9, gpu=False, pipeline_budget_s=8.0))()
    doc = pg.bench_script("text_infer", a, PLAIN, lambda m: None)
    claim, model = doc["claimed_vs_measured_pipeline"], doc["predicted_vs_measured_pipeline"]
    assert claim["claimed"] == 2.4 and claim["measured"] == pytest.approx(2.5) and claim["within"]
    assert model["claimed"] == 3.2 and model["ratio"] == pytest.approx(3.2 / 2.5, rel=1e-3)
    md = pg.markdown({"machine": "m", "mode": "quick", "load_start": [1], "load_end": [1], "seconds": 1,
                      "command": "c", "scripts": [doc]})
    claims_table = md.split("| script | scored |")[1].split("\n\n")[0]
    assert "| text_infer | pipeline form's plan as flags | 2.40x | 2.50x | 0.96 | yes |" in claims_table
    assert "3.20x" not in claims_table
    assert "| text_infer | 3.20x | 2.50x | 1.28 |" in md
    assert "the model's predicted speed-up: placer advise's model predicted 3.20x" in md


def test_a_screened_grid_runs_every_cell_once_and_repeats_the_best_of_that_round(monkeypatch):
    """--screen K: the whole grid once, then only the K fastest of that round for the other rounds; the
    final comparison takes its best from those K (a cell run once has no median to rank by)."""
    pg = _plain_grid()
    calls = []
    cells = pg.grid("text_infer", cores=2, gpu=False)
    # a rate per cell, and one cell that was lucky once (fast in the first round, slow after)
    rate = {c.label(): 100.0 + i for i, c in enumerate(cells)}
    lucky = cells[0].label()
    rate[lucky] = 10_000.0

    def fake(script, config, *, base, phase, timeout_s, extra=(), label=None, keep_output=False, prefix=()):
        calls.append((phase, label))
        r = rate.get(label, 50.0)
        if label == lucky and sum(1 for c in calls if c[1] == lucky) > 1:
            r = 1.0
        return pg.Run(script, label, list(extra), phase, 1.0, True, seconds=1.0, samples_per_s=r, digest="d",
                      load=1.0)

    monkeypatch.setattr(pg, "run_script", fake)
    a = type("A", (), dict(quick=False, few_cells=False, advise=False, pipeline=False, score=[], repeats=3,
                           final_rounds=1, top=2, timeout_s=9, gpu=False, screen=4))()
    doc = pg.bench_script("text_infer", a, PLAIN, lambda m: None)
    grid_calls = [label for phase, label in calls if phase == "grid"]
    fastest = [c.label() for c in cells][-3:]  # the three fastest after the lucky one
    assert len(grid_calls) == len(cells) + 4 * 2
    assert all(grid_calls.count(k) == 3 for k in [lucky, *fastest])
    assert sum(1 for k in set(grid_calls) if grid_calls.count(k) == 1) == len(cells) - 4
    # the lucky cell's median (1.0) drops it from the final comparison's best; a cell run once is never there
    finals = [k for k in doc["final"] if k.startswith("grid #")]
    assert finals == [f"grid #1: {fastest[-1]}", f"grid #2: {fastest[-2]}"]
    assert doc["grid"][lucky]["runs"] == 3 and doc["grid"][cells[5].label()]["runs"] == 1


def test_a_short_loop_gets_more_final_rounds_up_to_three_times_as_many(monkeypatch):
    """A loop of half a second swings by a third run to run: the final comparison runs more rounds until each
    configuration has --final-min-s seconds of loop (at most 3x --final-rounds); a long loop keeps its rounds."""
    pg = _plain_grid()
    assert pg.final_rounds(4, 0.5, 8.0) == 12 and pg.final_rounds(4, 1.0, 8.0) == 8
    assert pg.final_rounds(4, 4.0, 8.0) == 4 and pg.final_rounds(4, 0.5, 0.0) == 4 and pg.final_rounds(4, None, 8) == 4

    for loop_s, expected in ((0.4, 9), (1.6, 5), (5.0, 3)):
        calls = []

        def fake(script, config, *, base, phase, timeout_s, extra=(), label=None, keep_output=False, prefix=()):
            calls.append((phase, label))
            return pg.Run(script, label, list(extra), phase, 1.0, True, seconds=loop_s, samples_per_s=100.0,
                          digest="d", load=1.0)

        monkeypatch.setattr(pg, "run_script", fake)
        a = type("A", (), dict(quick=True, few_cells=False, advise=False, pipeline=False, score=[], repeats=1,
                               final_rounds=3, final_min_s=8.0, top=1, timeout_s=9, gpu=False))()
        doc = pg.bench_script("table_train", a, PLAIN, lambda m: None)
        assert [label for phase, label in calls if phase == "final"].count("as written") == expected, loop_s
        assert doc["final_rounds"] == expected and doc["final"]["as written"]["runs"] == expected


def test_entries_with_the_same_flags_are_one_configuration_in_the_final_comparison(monkeypatch):
    """A choice that is one of the grid's best (or keeps the script as written) runs once a round, its run
    counted for each name: run twice, the same flags differ by the machine's noise, not by the advice."""
    pg = _plain_grid()
    calls = []

    def fake(script, config, *, base, phase, timeout_s, extra=(), label=None, keep_output=False, prefix=()):
        calls.append((label, tuple(config.args()) if config else None, tuple(extra)))
        return pg.Run(script, label, list(extra), phase, 1.0, True, seconds=1.0, samples_per_s=100.0 + len(calls),
                      digest="d", load=1.0)

    monkeypatch.setattr(pg, "run_script", fake)
    two = pg.Config(num_workers=2, prefetch_factor=2, persistent_workers=True, threads=1)
    configs = {"as written": pg.Config(), "grid #1: 2 proc": two, "pipeline form: 2 proc": pg.Config(**vars(two)),
               "pipeline form: 0 workers": pg.Config(), pg.DROPIN: pg.Config()}
    runs = pg.interleaved("text_infer", configs, 3, base=[], phase="final", timeout_s=9, seed=2,
                          log=lambda m: None, extras={pg.DROPIN: ["--placer-advice"]})
    # three configurations (no flags; two workers; no flags with --placer-advice), three rounds each
    assert sorted(set((a, e) for _, a, e in calls)) == sorted({((), ()), (tuple(two.args()), ()),
                                                               ((), ("--placer-advice",))})
    assert len(calls) == 9
    assert runs["grid #1: 2 proc"] == runs["pipeline form: 2 proc"] and len(runs["grid #1: 2 proc"]) == 3
    assert runs["as written"] == runs["pipeline form: 0 workers"] != runs[pg.DROPIN]
