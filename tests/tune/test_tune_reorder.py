"""``placer tune --allow-reorder``: in_order=False tried for the fastest settings with worker processes, applied."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from placer.data.stream import LoaderSettings
from placer.tune.runs import python_command, run_script
from placer.tune.search import settings_dict, settings_from, tune
from placer.tune.words import describe, to_json

SCRIPTS = Path(__file__).parent / "tune_scripts"


def test_in_order_false_is_saved_and_read_back_in_dataloaders_words():
    s = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True, in_order=False)
    d = settings_dict(s)
    assert d["in_order"] is False and settings_from(d) == s
    assert "in_order" not in settings_dict(s.model_copy(update={"in_order": True}))
    assert settings_from(settings_dict(s.model_copy(update={"in_order": True}))).in_order is True
    # a thread pool or no workers: no order to change
    assert "in_order" not in settings_dict(LoaderSettings(num_workers=0, in_order=False))


def _run(settings=None, mode="apply", site=None):
    cmd = [sys.executable, str(SCRIPTS / "skewed_train.py")]
    return run_script(cmd, {"mode": mode, "target": site, "settings": settings}, timeout_s=120, trial=False)


@pytest.mark.slow
def test_allowed_reordering_is_tried_for_the_fastest_worker_settings_and_applied_with_the_same_batches(tmp_path):
    cmd = python_command([str(SCRIPTS / "skewed_train.py"), "--epochs", "3"])
    space = [LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True)]
    result = tune(cmd, budget_s=60, window_s=0.3, space=space, cache=False, allow_reorder=True)
    tried = [t.settings for t in result.trials]
    assert any(not s.in_order for s in tried)  # the fastest setting with worker processes, reordered, was run
    data = to_json(result)
    text = "\n".join(describe(result))
    if not result.recommended.settings.in_order:
        assert data["recommended"]["in_order"] is False and "varies from run to run" in text
    # applied from a saved recommendation at in_order=False: the same batches as written, in another order
    as_written = json.loads(_run().output_tail.strip().splitlines()[-1])
    site = result.site
    settings = settings_dict(space[0].model_copy(update={"in_order": False}))
    run = _run(settings, site=site)
    got = json.loads(run.output_tail.strip().splitlines()[-1])
    assert run.loader(site)["applied"]["in_order"] is False
    assert got["multiset"] == as_written["multiset"]


@pytest.mark.slow
def test_without_permission_nothing_is_reordered():
    cmd = python_command([str(SCRIPTS / "skewed_train.py"), "--epochs", "2"])
    space = [LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True)]
    result = tune(cmd, budget_s=30, window_s=0.3, space=space, cache=False)
    assert all(t.settings.in_order for t in result.trials) and result.recommended.settings.in_order
