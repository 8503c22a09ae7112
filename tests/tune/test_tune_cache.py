"""``placer tune`` and the cache inside the Dataset: found in the script's process, weighed by runs of the
script with and without it, applied in trials and by ``--apply`` with the script's batches unchanged.

``tests/tune/tune_scripts/decode_train.py`` decodes each item slowly and deterministically (``self.decode(i)``),
then draws a random gain from torch's global generator; with ``--random`` the slow work itself draws.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from placer.tune import caching
from placer.tune.caching import CacheResult
from placer.tune.runs import run_script
from placer.tune.search import holding_loader, tune
from placer.tune.words import describe, recommendation, to_json

SCRIPTS = Path(__file__).parent / "tune_scripts"
SCRIPT = SCRIPTS / "decode_train.py"
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def digest_of(output: str) -> str:
    return json.loads(output.strip().splitlines()[-1])["digest"]


@pytest.fixture(scope="module")
def as_written():
    """The script run to its end as written: its batches' digest, and the place it builds its loader."""
    run = run_script([PY, str(SCRIPT)], {"mode": "apply", "target": None, "settings": None}, timeout_s=120,
                     trial=False)
    return digest_of(run.output_tail), holding_loader(run)[0]["site"]


@pytest.fixture(scope="module")
def tuned():
    """``placer tune`` on the decoding script: no other setting to try (the cache is what is searched here)."""
    result = tune([PY, str(SCRIPT)], budget_s=90, window_s=0.3, space=[])
    return result, to_json(result)


@pytest.mark.slow
def test_tune_finds_the_deterministic_decode_and_recommends_keeping_it(tuned):
    result, data = tuned
    cache = data["cache"]
    assert cache["method"] == "Clips.decode"  # __getitem__ draws a random gain: only the decode inside is pure
    assert cache["recommended"] is True and result.cached
    assert cache["hit_rate"] == 1.0 and cache["epoch_speedup"] > 1
    # the window read at least the filling epoch, an epoch reading the cache and a batch past it (8 a epoch)
    assert cache["window_batches"] >= 2 * 8 + 1
    assert len(cache["gain_rounds"]) >= 2  # the rule's rounds, each with and without the cache
    assert data["recommended"]["cache"] == {"method": "Clips.decode", "budget_bytes": cache["budget_bytes"]}
    assert data["change"] is True and data["speedup"] == round(result.speedup * result.cache.gain, 4)
    runs = [r for r in data["runs"] if r["batches"] == cache["window_batches"]]
    assert {r["cache"] for r in runs} == {None, "Clips.decode"}
    assert len({r["digest"] for r in runs}) == 1  # the same batches with the cache and without it
    text = "\n".join(describe(result))
    assert "Cache inside the Dataset: keep `Clips.decode`" in text and "placer tune --apply" in text


@pytest.mark.slow
def test_apply_with_the_cache_reads_the_batches_of_the_script_as_written(tuned, as_written, tmp_path):
    _, data = tuned
    saved = tmp_path / "tuned.json"
    saved.write_text(json.dumps(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([PY, "-m", "placer", "tune", "--apply", str(saved), "--", PY, str(SCRIPT)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "was not applied" not in p.stderr
    assert digest_of(p.stdout) == as_written[0]


@pytest.mark.slow
def test_a_cache_applied_in_a_stopped_trial_is_removed_and_one_for_another_class_is_not_applied(as_written):
    site = as_written[1]
    spec = {"mode": "trial", "target": site, "settings": None, "batches": 12, "stop_s": 60}
    run = run_script([PY, str(SCRIPT)], {**spec, "cache": {"method": "Clips.decode", "budget_bytes": 1 << 24}},
                     timeout_s=120)
    applied = run.loader(site)["cache"]
    assert run.report["stopped"] == "batches" and applied["applied"] is True
    assert not os.path.exists(applied["folder"])  # the hook ended the script and removed the store
    run = run_script([PY, str(SCRIPT)], {**spec, "cache": {"method": "Frames.decode", "budget_bytes": 1 << 24}},
                     timeout_s=120)
    other = run.loader(site)["cache"]
    assert other["applied"] is False and "not a Frames" in other["reason"]


@pytest.mark.slow
def test_a_loader_built_again_around_the_same_dataset_reads_the_same_cache_and_another_dataset_gets_its_own():
    cmd = [PY, str(SCRIPT), "--rebuild", "--epochs", "3"]
    run = run_script(cmd, {"mode": "apply", "target": None, "settings": None}, timeout_s=120, trial=False)
    site = holding_loader(run)[0]["site"]
    assert {r["site"] for r in run.loaders} == {site}  # train (each epoch) and validation: one place
    cached = run_script(cmd, {"mode": "apply", "target": site, "settings": None,
                              "cache": {"method": "Clips.decode", "budget_bytes": 1 << 24}}, timeout_s=120,
                        trial=False)
    folders = [r["cache"]["folder"] for r in cached.loaders]
    lengths = [r["length"] for r in cached.loaders]
    assert lengths == [8, 8, 2, 8, 2, 8, 2]  # the first loader, then each epoch's and its validation's
    train = {f for f, n in zip(folders, lengths) if n == 8}
    val = [f for f, n in zip(folders, lengths) if n == 2]
    assert len(train) == 1 and len(set(val)) == 3 and not train & set(val)
    assert not any(os.path.exists(f) for f in folders)  # removed at the script's end
    assert digest_of(cached.output_tail) == digest_of(run.output_tail)


@pytest.mark.slow
def test_random_per_item_work_gets_no_cache_and_says_why():
    result = tune([PY, str(SCRIPT), "--random"], budget_s=90, window_s=0.3, space=[])
    data = to_json(result)
    assert data["cache"]["method"] is None and data["cache"]["recommended"] is False
    assert data["recommended"]["cache"] is None
    assert "Clips.decode_with_noise: it draws random numbers" in data["cache"]["reason"]
    assert [r for r in data["runs"] if r.get("cache")] == []  # nothing to weigh: no run with a cache
    assert "Cache inside the Dataset: nothing to keep (" in "\n".join(describe(result))


def test_an_iterable_dataset_is_not_searched_and_says_why():
    found = caching.find([PY, "-c", "raise SystemExit(3)"], "train.py:1", {"iterable": True, "length": None},
                         budget_s=10, startup_s=1)
    assert found.method is None and "IterableDataset" in found.reason and not found.recommended


def _rounds(plain: list[float], cached: list[float], digests=("a", "a"), fits=lambda n: True) -> CacheResult:
    runs = iter([x for pair in zip(plain, cached) for x in pair])
    marks = iter(list(digests) * len(plain))
    found = CacheResult({"method": "Clips.decode", "recommended": True, "budget_bytes": 1 << 20})
    return caching.weigh(found, lambda with_cache: (next(runs), next(marks)), fits, 17)


def test_the_cache_is_recommended_only_by_the_rule_over_its_rounds():
    # every cached run faster than every uncached one: two rounds decide
    clear = _rounds([100, 104, 98], [160, 170, 150])
    assert clear.recommended and len(clear.plain) == 2 and clear.gain == pytest.approx(165 / 102)
    assert clear.spec()["method"] == "Clips.decode"
    # two rounds whose runs overlap (each round won): a third, and the sign test over three won rounds decides
    third = _rounds([100, 130, 98], [120, 160, 150])
    assert third.recommended and len(third.plain) == 3
    # a gain the median shows but the rounds do not: settled by more rounds, then kept out
    noisy = _rounds([100, 110, 90, 95, 105, 100, 98], [108, 92, 112, 99, 104, 97, 101])
    assert not noisy.recommended and "beyond the noise" in noisy.reason and noisy.spec() is None
    assert len(noisy.plain) == 5  # three rounds, then two more: after the fifth the median gain fell under 5 %
    differ = _rounds([100, 100, 100], [200, 200, 200], digests=("a", "b"))
    assert not differ.recommended and "batches with the cache differ" in differ.reason
    # batches that differ from run to run without the cache too (thread workers drawing from a global
    # generator) say nothing of the cache: not compared, and said so
    racy = iter(["a", "b", "c", "d", "e", "f"])
    found = CacheResult({"method": "Clips.decode", "recommended": True, "budget_bytes": 1 << 20})
    rates = iter([100, 160, 104, 170, 98, 150])
    racy_result = caching.weigh(found, lambda c: (next(rates), next(racy)), lambda n: True, 17)
    assert racy_result.recommended and "differ from run to run with these settings alone" in racy_result.reason
    none = _rounds([100], [200], fits=lambda n: False)
    assert not none.recommended and "--budget-s" in none.reason


def test_a_saved_cache_is_checked_before_it_is_applied():
    good = {"loader": "train.py:9", "recommended": {"num_workers": 0, "cache": {"method": "Clips.decode",
                                                                                 "budget_bytes": 1024}}}
    assert recommendation(good)[1]["cache"]["method"] == "Clips.decode"
    bad = json.loads(json.dumps(good))
    bad["recommended"]["cache"]["method"] = "decode"
    with pytest.raises(ValueError, match="recommended.cache.method must name the cached method as Class.method"):
        recommendation(bad)
    bad["recommended"]["cache"] = {"method": "Clips.decode", "budget_bytes": -1}
    with pytest.raises(ValueError, match="recommended.cache.budget_bytes must be a positive number"):
        recommendation(bad)


@pytest.mark.slow
def test_a_budget_too_small_to_weigh_a_cache_does_not_look_for_one_and_says_so():
    result = tune([PY, str(SCRIPT)], budget_s=20, window_s=0.3, space=[])
    assert result.cache is not None and result.cache.method is None and not result.cached
    assert "a larger --budget-s looks for one" in result.cache.reason
    assert all(not r.get("cache") for r in result.runs)
