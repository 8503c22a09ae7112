"""The memory each setting of the drop-in holds: measured where the loader runs, projected over the run, budgeted."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")
from torch.utils.data import DataLoader

from placer.data.stream import LoaderSettings
from placer.errors import ArgumentError, ArgumentTypeError
from placer.stream import procmem
from placer.stream.dropin import Trial, advise_loader, fits
from placer.stream.dropin.fits import python_bytes
from placer.stream.dropin.memory import NOISE_BYTES, RunMemory, combined, growth, projected
from records import Records, loader, workers_uss

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="unique and proportional set sizes are read from /proc/PID/smaps_rollup (Linux)")


def step(batch):
    return batch.sum()


def _script_reads(workers: int, batches: int) -> tuple[int, int]:
    """The worker processes' unique set sizes (summed) and count, as psutil reads them in a script of its own
    (the process a user's script runs in) that iterates the same loader ``batches`` batches."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "records.py"), str(workers), str(batches)],
                         capture_output=True, text=True, timeout=300, check=True)
    uss, n = out.stdout.split()
    return int(uss), int(n)


@pytest.fixture(scope="module")
def records():
    return Records()


@pytest.fixture
def frozen_collector():
    """The test process's objects moved out of the garbage collector's reach while the test runs: a worker
    process's collection traverses every object it can reach, copying their pages, whenever the counts it
    inherits from the process it forked from say so; in a test process that holds much else, one loader's
    workers then read 50 % larger than the next's. Frozen, two loaders' workers compare what is read, not
    when a collection fell."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@linux
@pytest.mark.slow
def test_the_advice_reads_each_worker_as_psutil_reads_the_running_workers(records, frozen_collector):
    # the runs in this process: the workers the test reads are forked from the same process as the advice's
    advice = advise_loader(loader(records, 2), step, batches=40, budget_s=3, epochs=2, cache_bytes=0, fresh=False)
    mine = advice.user.memory
    assert mine is not None and mine.processes == 2
    d = json.loads(advice.to_json())["user"]["memory_bytes"]
    assert d["workers"] == mine.end["workers"] and d["worker_processes"] == 2
    # the advice's figure is the largest end of its runs of these settings (the longest run's): the same loader
    # read here to that length, each run reading from the start of an epoch
    # (what the advice left behind frozen too: a worker's collection would traverse it; and the median of three
    # loaders, a measurement being a set of repeats)
    gc.collect()
    gc.freeze()
    longest = max(n for n, _, _ in advice.user.each_read)
    reads = [workers_uss(loader(records, 2), longest) for _ in range(3)]
    assert all(n == 2 for _, n in reads)
    theirs = float(np.median([uss / n for uss, n in reads]))
    ours = mine.end["workers"] / mine.processes
    assert abs(ours - theirs) <= 0.25 * theirs, (ours, [uss / n for uss, n in reads])
    # the main process's figure is its own memory: the records counted once, though the workers share them
    assert mine.end["main"] > python_bytes(records)


@linux
@pytest.mark.slow
def test_runs_in_fresh_processes_bring_back_the_memory_where_the_loader_ran(records):
    advice = advise_loader(loader(records, 2), step, batches=40, budget_s=3, epochs=2, cache_bytes=0, fresh=True)
    assert advice.runs_in == "fresh processes"
    mine = advice.user.memory
    assert mine is not None and mine.processes == 2 and mine.end["workers"] > 0
    # the fresh process's main holds its own copy of the records
    assert mine.end["main"] > python_bytes(records)
    # and a script's worker processes, read by psutil at the same length, are as large within a factor of two
    # (a fresh run's workers are forked from a process placer primed: they start smaller, docs/streams.md)
    theirs, n = _script_reads(2, max(r for r, _, _ in advice.user.each_read))
    assert 0.5 < mine.end["workers"] / theirs < 2


@linux
def test_a_setting_over_the_memory_budget_is_not_recommended_and_the_advice_says_why(records):
    # the test's own process holds the records; the runs stay here, so the budget is its memory and a little:
    # the user's settings (no workers) fit, and any worker process that copies the records does not
    here = procmem.sizes()["anon"]
    budget = here + 48 * 2**20
    advice = advise_loader(loader(records, 0), step, budget_s=6, epochs=3, cache_bytes=0, fresh=False,
                           memory_bytes=budget)
    d = advice.as_dict()
    assert d["memory"]["budget_bytes"] == budget and d["memory"]["budget_from"] == "memory_bytes"
    assert d["projected_memory_bytes"]["total"] <= budget
    assert d["recommended"]["projected_memory_bytes"] == d["projected_memory_bytes"]
    assert d["memory"]["user"]["total"] <= budget
    rec = advice.recommended.settings
    assert rec.num_workers == 0 or rec.worker_threads
    over = d["memory"]["over_budget"]
    assert over, "no setting with worker processes was measured"
    for o in over:
        assert o["projected"]["total"] > budget
        assert "over the memory budget" in o["why"] and "it would take" in o["why"]
    # the workers grew by copying the records they read: the cause named, with the fix
    with_workers = [o for o in over if "(processes)" in o["settings"]]
    assert any(o["copy_on_read"] and "self.items: a list of 300,000 dict" in o["copy_on_read"]
               and "numpy arrays" in o["copy_on_read"] for o in with_workers), with_workers
    text = str(advice)
    assert "not recommended" in text and "Memory (budget" in text and "copy-on-read" in text
    assert "(over the memory budget)" in text
    # the set-aside settings are in the table and the JSON, with their memory
    assert any(t["memory_bytes"] and t["memory_bytes"]["worker_processes"] for t in d["trials"])


def test_growth_is_the_smaller_halfs_and_a_step_in_one_half_is_not_extrapolated():
    mb = 2**20
    start = {"main": 100 * mb, "workers": 20 * mb, "processes": 2}
    mid = {"main": 140 * mb, "workers": 30 * mb, "processes": 2}
    end = {"main": 140 * mb, "workers": 40 * mb, "processes": 2}
    g = growth(start, mid, end, (10, 10))
    assert g == {"main": 0.0, "workers": mb}
    # under the noise floor (per process): none
    assert growth(start, None, {**start, "workers": start["workers"] + NOISE_BYTES}, (10, 0))["workers"] == 0


def test_the_projection_follows_the_workers_lives_and_is_capped_by_what_they_can_copy():
    mb = 2**20
    m = RunMemory(start={"main": 200 * mb, "workers": 20 * mb, "processes": 2},
                  end={"main": 200 * mb, "workers": 30 * mb, "processes": 2},
                  per_batch={"main": 0.0, "workers": 0.1 * mb}, batches=100)
    two = LoaderSettings(num_workers=2, persistent_workers=False)
    p = projected(m, two, epochs=5, per_epoch=1000)
    assert p["workers"] == 20 * mb + 100 * mb and p["main"] == 200 * mb  # one epoch's life: they restart
    kept = projected(m, two.model_copy(update={"persistent_workers": True}), epochs=5, per_epoch=1000)
    assert kept["workers"] == 20 * mb + 400 * mb and kept.get("capped")  # five epochs' 500 MiB, capped at 2 x 200
    assert projected(m, two, epochs=5, per_epoch=None)["total"] == m.total  # no length: the measured end
    # a setting whose short runs showed no growth grows as the best-measured setting's workers did
    flat = RunMemory(start=m.start, end=m.start, per_batch={"main": 0.0, "workers": 0.0}, batches=5)
    assert projected(flat, two, epochs=5, per_epoch=1000)["workers"] == m.start["workers"]
    assert projected(flat, two, epochs=5, per_epoch=1000, read_growth=0.1 * mb)["workers"] == 120 * mb
    # the main process starts no smaller than the process that asked (a fresh run's holds a copy of the loader)
    assert projected(m, two, epochs=5, per_epoch=1000, main_at_least=250 * mb)["main"] == 250 * mb
    # the Dataset's Python objects cap what a worker can copy, where they are known
    assert projected(m, two.model_copy(update={"persistent_workers": True}), epochs=5, per_epoch=1000,
                     copyable=50 * mb)["workers"] == 20 * mb + 2 * 50 * mb
    both = combined([m, RunMemory(start=m.start, end={**m.end, "workers": 50 * mb},
                                  per_batch={"main": 0.0, "workers": 0.3 * mb}, batches=50)])
    assert both.end["workers"] == 50 * mb and both.per_batch["workers"] == pytest.approx(0.2 * mb)
    assert both.runs == 2 and both.batches == 150


def _trial(workers: int, rate: float, worker_bytes: int, *, runs: int = 3):
    mb = 2**20
    start = {"main": 300 * mb, "workers": worker_bytes, "processes": workers}
    return Trial(settings=LoaderSettings(num_workers=workers, prefetch_factor=2 if workers else None),
                 samples_per_s=rate, first_batch_s=0.1, fetch_fraction=0.5, batches=50, samples=3200, seconds=1.0,
                 repeats=(rate,) * runs, read=52, read_s=1.1,
                 memory=RunMemory(start=start, end=start, per_batch={"main": 0.0, "workers": 0.0}, batches=50))


def test_a_recommendation_past_the_budget_gives_way_to_the_users_settings_and_set_aside_keeps_the_users():
    mb = 2**20
    mine, fast, lean = _trial(0, 1000.0, 0), _trial(4, 3000.0, 400 * mb), _trial(1, 2000.0, 50 * mb)
    a = SimpleNamespace(trials=[mine, fast, lean], over_memory=[], epochs=2, per_epoch=100, loader=None,
                        memory_budget={"bytes": 500 * mb, "from": "memory_bytes", "own": 0}, best=fast, longer=None,
                        noise=None, confirmed={"held": True}, run=None, threads_helped=lambda: None)
    a.mine = mine
    fits.hold(a)  # the recommendation holds 700 MiB: the user's settings are kept, and the advice says why
    assert a.best is mine and a.confirmed is None and "over the memory budget of 500 MiB" in a.noise
    fits.set_aside(a)  # the user's settings stay whatever they hold; the setting over the budget is set aside
    assert a.trials == [mine, lean] and a.over_memory == [fast]
    a.memory_budget["bytes"] = 100 * mb  # the user's own past the budget: measured, kept, and said
    fits.set_aside(a)
    assert a.trials[0] is mine and fits.passes(mine, a, as_recommended=False)


@pytest.mark.parametrize("bad, error", [(-1, ArgumentError), (0, ArgumentError), (1.5e9, ArgumentTypeError),
                                        ("8G", ArgumentTypeError), (True, ArgumentTypeError)])
def test_memory_bytes_must_be_a_whole_number_of_bytes_above_zero(bad, error):
    loader = DataLoader(list(range(8)), batch_size=2)
    with pytest.raises(error, match="memory_bytes"):
        advise_loader(loader, step, budget_s=1, memory_bytes=bad)
