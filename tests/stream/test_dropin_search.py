"""The drop-in's wider search and whole-run numbers: thread workers as a drop-in loader, workers past
the cores while the rate rises, prefetch depths, queue-drained rates, the whole run predicted, and
recommendations confirmed (or overturned) by longer runs."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler

from placer.data.stream import LoaderSettings
from placer.stream import ThreadLoader, advise_loader, dropin
from placer.stream.dropin import (Trial, decided_by, depth_bases, more_workers, prefetch_depths, rebuild, run_loader,
                                  settings_of)
from placer.stream.wholerun import RunCosts, costs, run_seconds
from placer.timing import sign_tail, torch_threads


class Records(Dataset):
    def __len__(self):
        return 37

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "i": i}


def as_lists(loader):
    return [(b["x"].tolist(), b["i"].tolist()) for b in loader]


# -- the thread-pool loader ----------------------------------------------------------------------
def test_the_thread_loader_yields_a_dataloaders_batches_in_order_epoch_after_epoch():
    def pair(**kw):
        a = DataLoader(Records(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3), **kw)
        b = ThreadLoader(Records(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3),
                         num_workers=3, prefetch_factor=1, **kw)
        return a, b

    a, b = pair()
    assert len(a) == len(b) == 10
    for _ in range(2):  # a second epoch draws the next order from the same generator
        assert as_lists(a) == as_lists(b)
    a, b = pair(drop_last=True)
    assert as_lists(a) == as_lists(b) and len(b) == 9
    # an unseeded shuffle draws from torch's global generator, as a DataLoader's does
    torch.manual_seed(7)
    first = as_lists(DataLoader(Records(), batch_size=5, shuffle=True))
    torch.manual_seed(7)
    assert as_lists(ThreadLoader(Records(), batch_size=5, shuffle=True, num_workers=2)) == first


def test_the_thread_loader_keeps_a_batch_sampler_and_refuses_what_it_cannot_run():
    sampler = BatchSampler(RandomSampler(Records(), generator=torch.Generator().manual_seed(1)), 6, False)
    ref = as_lists(DataLoader(Records(), batch_sampler=sampler))
    assert as_lists(ThreadLoader(Records(), batch_sampler=sampler, num_workers=2)) != [] and \
        len(as_lists(ThreadLoader(Records(), batch_sampler=sampler, num_workers=2))) == len(ref)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match="IterableDataset"):
        ThreadLoader(Stream(), num_workers=2)
    with pytest.raises(ValueError, match="num_workers >= 1"):
        ThreadLoader(Records(), num_workers=0)


def test_rebuilding_with_thread_workers_gives_a_thread_loader_with_the_users_batches():
    user = DataLoader(Records(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))
    state = user.generator.get_state()
    ref = as_lists(user)
    user.generator.set_state(state)
    threads = rebuild(user, LoaderSettings(num_workers=2, prefetch_factor=4, worker_threads=True))
    assert isinstance(threads, ThreadLoader) and as_lists(threads) == ref
    s = settings_of(threads)
    assert s.worker_kind == "threads" and s.num_workers == 2 and s.prefetch_factor == 4
    assert "persistent_workers" not in s.kwargs() and s.as_dict()["worker_threads"] is True
    assert dropin.label(s).startswith("num_workers=2 (threads), prefetch_factor=4, pin_memory")
    # and back to processes: a DataLoader again
    assert isinstance(rebuild(threads, LoaderSettings(num_workers=0)), DataLoader)


# -- the search space ----------------------------------------------------------------------------
def trial(w: int, rate: float, *, threads: bool = False, pf: int | None = 2, first: float = 0.01,
          close: float = 0.0, tt: int = 2) -> Trial:
    s = LoaderSettings(num_workers=w, prefetch_factor=pf if w else None, worker_threads=threads, torch_threads=tt)
    return Trial(settings=s, samples_per_s=rate, first_batch_s=first, fetch_fraction=0.5, batches=10, samples=80,
                 seconds=80 / rate, close_s=close)


def test_more_workers_are_tried_past_the_cores_only_while_the_rate_rises():
    rising = [trial(0, 100), trial(1, 150), trial(2, 200), trial(2, 400, threads=True)]
    nxt = {(s.num_workers, s.worker_threads) for s in more_workers(rising, cores=2)}
    assert nxt == {(3, False), (3, True)}  # threads: 2 beat one process worker
    flat = [trial(0, 100), trial(1, 150), trial(2, 152), trial(2, 140, threads=True)]
    assert more_workers(flat, cores=2) == []
    # past twice the cores the count doubles, up to the most the drop-in tries
    assert more_workers([trial(3, 100), trial(4, 200)], cores=2)[0].num_workers == 8
    assert more_workers([trial(16, 100), trial(dropin.MAX_WORKERS, 200)], cores=2) == []
    # the fastest is not the most workers measured: it has stopped rising
    assert more_workers([trial(1, 100), trial(2, 300), trial(3, 250)], cores=2) == []


def test_the_fastest_gets_every_prefetch_depth_not_yet_measured():
    best = LoaderSettings(num_workers=2, prefetch_factor=2)
    depths = prefetch_depths(best, [best, best.model_copy(update={"prefetch_factor": 4})])
    assert [s.prefetch_factor for s in depths] == [1, 8] and all(s.num_workers == 2 for s in depths)
    assert prefetch_depths(LoaderSettings(num_workers=0), []) == []


def test_the_next_worker_count_near_the_fastest_also_gets_other_prefetch_depths():
    # 4 processes fastest at depth 2; 3 processes within 10 % of it: both get the other depths
    first = [trial(0, 900, pf=None), trial(2, 700), trial(3, 930), trial(4, 1000), trial(4, 980, threads=True)]
    bases = depth_bases(first)
    assert [(s.num_workers, s.worker_threads) for s in bases] == [(4, False), (3, False)]
    # the fastest of another count is the thread loader when it is nearer than the other process counts
    assert [s.num_workers for s in depth_bases([trial(2, 700), trial(4, 1000), trial(2, 950, threads=True)])] == [4, 2]
    # a count far behind the fastest is not widened; no workers at all, nothing to widen
    assert [s.num_workers for s in depth_bases([trial(2, 500), trial(4, 1000)])] == [4]
    assert depth_bases([trial(0, 900, pf=None)]) == []


class Listed:
    """A loader-like iterable whose first ``fast`` batches are ready at once (a full queue), the rest
    take ``delay`` seconds each."""

    num_workers, prefetch_factor, pin_memory, persistent_workers, batch_size = 2, 2, False, False, 4

    def __init__(self, n: int, fast: int, delay: float):
        self.n, self.fast, self.delay = n, fast, delay

    def __iter__(self):
        for i in range(self.n):
            if i >= self.fast:
                time.sleep(self.delay)
            yield torch.zeros(4)


def test_a_run_leaves_out_the_batches_a_full_queue_held():
    from placer.devices import discover
    from placer.timing import Deadline

    cpu = discover().resolve("cpu")
    kw = dict(batches=14, warmup=2, device=cpu, deadline=Deadline(None))
    # batches 0-5 come at once, then 20 ms each: counted from batch 2 without draining, the queue's
    # four flatter the rate; draining them measures the workers
    flattered = run_loader(Listed(14, 6, 0.02), None, **kw)
    drained = run_loader(Listed(14, 6, 0.02), None, drain=4, **kw)
    assert drained.batches == 8 and flattered.batches == 12
    # a sleep only overshoots (a loaded machine stretches it): at most 4 samples / 20 ms
    assert 4 / 0.02 / 4 < drained.samples_per_s <= 4 / 0.02 * 1.05
    # 12 batches over the time of 8 slow ones against 8 over 8: 1.5x (less the instant batches' own time)
    assert flattered.samples_per_s > 1.25 * drained.samples_per_s


# -- the whole run -------------------------------------------------------------------------------
def test_the_whole_run_adds_start_up_epoch_boundaries_and_the_steady_state():
    c = RunCosts(start_s=1.0, per_batch_s=0.1, close_s=0.2, refill_s=0.05, persistent=False)
    # every epoch starts the workers again and stops them at its end
    assert run_seconds(c, epochs=3, batches=11) == pytest.approx(3 * (1.0 + 10 * 0.1 + 0.2))
    p = RunCosts(start_s=1.0, per_batch_s=0.1, close_s=0.2, refill_s=0.05, persistent=True)
    assert run_seconds(p, epochs=3, batches=11) == pytest.approx(1.0 + 10 * 0.1 + 2 * (0.05 + 10 * 0.1))
    with pytest.raises(ValueError, match="epochs=0"):
        run_seconds(c, epochs=0, batches=3)
    # from one measured run: no workers, nothing to start or stop but the first batch
    z = costs(first_batch_s=0.02, samples_per_s=400, samples_per_batch=8, close_s=0.3, refill_s=None, workers=0,
              persistent=False)
    assert z.per_batch_s == pytest.approx(0.02) and z.close_s == 0 and not z.persistent


def scripted(monkeypatch, search: dict, longer: dict, *, first: dict | None = None,
             first_longer: dict | None = None):
    """Runs of up to the advice's ``batches`` measure ``search[w]``; longer runs ``longer[w]`` (their
    first batch ``first_longer[w]`` where given, else ``first[w]``)."""
    first = first or {}
    first_longer = {**first, **(first_longer or {})}

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        w = -1 if getattr(loader, "worker_threads", False) else loader.num_workers
        rates = longer if batches > 20 else search
        rate = 5000.0 if step is None else rates.get(w, 10.0)
        starts = first_longer if batches > 20 else first
        return Trial(settings=settings_of(loader), samples_per_s=rate, first_batch_s=starts.get(w, 0.01),
                     fetch_fraction=0.5, batches=10, samples=80, seconds=80 / rate)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: 10_000.0)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    monkeypatch.setattr(dropin.space, "thread_counts", lambda *a: [])


class Many(Dataset):
    def __len__(self):
        return 800  # 100 batches of 8

    def __getitem__(self, i):
        return torch.zeros(2)


def test_a_recommendation_is_confirmed_by_longer_runs_and_claims_the_whole_runs_speed_up(monkeypatch):
    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 200.0}, {0: 100.0, 2: 190.0}, first={2: 0.5})
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=3)
    assert advice.change and advice.recommended.settings.num_workers == 2 and advice.confirmed["held"]
    w = advice.whole_run
    assert w["epochs"] == 3 and w["batches"] == 100 and w["from"] == "confirming runs"
    # yours: 3 x (0.01 + 99 x 80 ms); recommended: start once (0.5 s), then 2 refills of one batch
    mine = 3 * (0.01 + 99 * 0.08)
    rec = 0.5 + 99 * 8 / 190 + 2 * (0.01 + 99 * 8 / 190)
    assert w["user_s"] == pytest.approx(mine, rel=1e-3) and w["recommended_s"] == pytest.approx(rec, rel=1e-3)
    assert advice.speedup == pytest.approx(mine / rec, rel=1e-3) and advice.steady_speedup == pytest.approx(2.0)
    assert w["without_persistent_s"] > w["recommended_s"]
    doc = json.loads(advice.to_json())
    assert doc["speedup"] == pytest.approx(mine / rec, rel=1e-3) and doc["confirmed"]["batches"] == 40
    assert {k["knob"] for k in doc["decided_by"]} >= {"num_workers", "persistent_workers"}
    text = str(advice)
    assert "Your whole run (3 epochs x 100 batches)" in text and "Confirmed by longer runs" in text
    assert "Decided by: num_workers 0 -> 2" in text


def test_a_recommendation_the_longer_runs_do_not_confirm_keeps_your_settings(monkeypatch):
    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 200.0}, {0: 100.0, 2: 104.0})
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert not advice.change and advice.confirmed["held"] is False
    assert "not confirmed by longer runs" in advice.within_noise and advice.speedup == pytest.approx(1.0)
    assert "keep your settings" in str(advice)


def test_longer_runs_faster_only_in_the_steady_state_say_why_the_settings_are_kept(monkeypatch):
    # the longer runs measure 2 workers twice as fast in the steady state, but their workers take 4 s to
    # start: over one epoch of 100 batches (8 s as yours) that is no gain
    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 200.0}, {0: 100.0, 2: 200.0}, first_longer={2: 4.0})
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=1)
    assert not advice.change and advice.confirmed["held"] is False
    assert advice.confirmed["steady_speedup"] == pytest.approx(2.0)
    line = next(x for x in str(advice).splitlines() if x.startswith("Confirmed by longer runs"))
    assert "faster in the steady state, but not by enough over your whole run" in line
    assert "your settings are kept" in line


def test_start_up_that_a_short_run_would_not_repay_is_not_recommended(monkeypatch):
    # 2 workers are twice as fast in the steady state, but starting them takes 4 s: a one-epoch run of
    # 100 batches (8 s as yours) gains less than 10 %
    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 200.0}, {0: 100.0, 2: 200.0}, first={1: 4.0, 2: 4.0})
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=1)
    # the search ranks each setting by the whole run it predicts: 2 workers never reach the confirming runs
    assert not advice.change and advice.confirmed is None
    two = next(t for t in advice.trials if t.settings.num_workers == 2 and not t.settings.worker_threads)
    assert two.samples_per_s == pytest.approx(2 * advice.user.samples_per_s)  # twice as fast, steady
    assert two.score < 1.1 * advice.user.score  # not over the run: 4 s of start-up in 8
    with pytest.raises(ValueError, match="epochs=0"):
        advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, epochs=0)


def test_the_knobs_that_decided_are_those_that_changed_with_their_measured_gain():
    user = trial(0, 100.0)
    best = trial(2, 300.0, threads=True, pf=4)
    trials = [user, trial(2, 150.0, pf=4), trial(2, 250.0, threads=True, pf=2), best]
    knobs = {k["knob"]: k for k in decided_by(user, best, trials, None)}
    assert set(knobs) == {"num_workers", "worker_threads", "prefetch_factor"}
    assert knobs["num_workers"]["gain"] == pytest.approx(3.0)
    assert knobs["worker_threads"]["gain"] == pytest.approx(2.0)
    assert knobs["prefetch_factor"]["gain"] == pytest.approx(1.2)


def test_keeping_the_workers_is_credited_with_what_it_saves_not_with_what_the_cache_saves():
    from dataclasses import replace

    from placer.stream.dataset_cache import CacheAdvice

    user = trial(2, 100.0, first=0.5)
    best = trial(2, 150.0, first=0.5)
    best = replace(best, settings=best.settings.model_copy(update={"persistent_workers": True}))
    run = dropin.whole_run(user, best, [user, best], None, epochs=5, batches=16)
    plain = decided_by(user, best, [user, best], run)
    gain = next(k["gain"] for k in plain if k["knob"] == "persistent_workers")
    assert gain == pytest.approx(run["without_persistent_s"] / run["recommended_s"], abs=1e-3)
    assert 1.1 < gain < 2  # starting the workers again in each of 4 more epochs: 0.5 s of a 1.3 s epoch
    cache = CacheAdvice("Recordings.load", uncached_s=[1.0, 1.0], fill_s=1.08, cached_s=[0.16, 0.16],
                        recommended=True)
    cached = dropin.with_cache(run, cache)
    assert cached["recommended_s"] < run["recommended_s"] / 2  # the cache's own gain
    knobs = {k["knob"]: k for k in decided_by(user, best, [user, best], cached)}
    assert knobs["persistent_workers"]["gain"] == pytest.approx(gain, abs=1e-3)


def test_widening_yields_to_the_runs_that_decide():
    budget = dropin.runs.Budget(10.0, runs=20)
    budget.ran(1.0, 0.9)
    budget.ran(1.0, 0.9)  # runs of 1 s, 0.1 s of it fixed
    assert budget.leaves(8)  # 10 s left > 0.1 + 9 x 1 s
    assert not budget.leaves(9) and budget.runs == 19  # declined: its share goes to the runs to come


def test_an_epoch_read_whole_is_predicted_as_it_ran_not_from_its_steady_window():
    from dataclasses import replace

    # 6 batches an epoch, all in the workers' queue: the 2 counted looked 10x faster than the epoch ran
    t = replace(trial(3, 800.0, threads=True, first=0.1), read=6, read_s=0.6)  # 8 samples a batch
    whole = dropin.whole.run_costs(t, None, per_epoch=6)
    assert whole.per_batch_s == pytest.approx(0.5 / 5)
    assert dropin.whole.run_costs(t, None, per_epoch=50).per_batch_s == pytest.approx(8 / 800.0)  # an epoch not read whole


# -- ranking by the run the script will see ------------------------------------------------------
def test_a_short_epoch_that_the_queue_holds_whole_is_ranked_by_the_run_it_predicts():
    from dataclasses import replace

    # 2 epochs of 6 batches of 8: 3 threads x prefetch 8 hold the epoch whole, so the steady window
    # measured 10,000 samples/s; the epoch itself took 0.6 s (80 samples/s over the run)
    queued = replace(trial(3, 10_000.0, threads=True, pf=8, first=0.1), read=6, read_s=0.6)
    user = replace(trial(0, 200.0, first=0.04), read=6, read_s=0.24)
    assert dropin.run_rate(queued, 2, 6) == pytest.approx(2 * 6 * 8 / (2 * 0.6))
    assert dropin.run_rate(user, 2, 6) == pytest.approx(200.0)
    ranked = [replace(t, run_rates=(dropin.run_rate(t, 2, 6),)) for t in (user, queued)]
    assert dropin.choose(ranked[0], ranked) is ranked[0]
    # without the run's shape, the steady window decides (as before)
    assert dropin.choose(user, [user, queued]) is queued


def test_a_gain_every_interleaved_round_shows_beats_a_noisy_setting_whose_range_hides_it():
    from dataclasses import replace

    def runs(w, tt, rates):
        return replace(trial(w, float(sorted(rates)[1]), tt=tt), repeats=tuple(rates))

    # 2 step threads on 2 shared cores: one run fast, the others slow (the other load moves them both)
    user = runs(0, 2, (185.0, 1981.0, 600.0))
    fewer = runs(0, 1, (1454.0, 2206.0, 1700.0))
    assert min(fewer.rates) < max(user.rates)  # the ranges overlap
    assert dropin.beats(fewer, user)
    best, noise = dropin.decide(user, [user, fewer], waits=False)  # only the step's threads may change
    assert best is fewer and noise is None
    # one round lost: within noise, the user's settings are kept and the advice says why
    lost = runs(0, 1, (1454.0, 1900.0, 1700.0))
    assert not dropin.beats(lost, user)
    best, noise = dropin.decide(user, [user, lost], waits=False)
    assert best is user and "within noise" in noise
    # fewer rounds than REPEATS never decide on pairs
    assert not dropin.beats(replace(fewer, repeats=(1454.0, 2206.0)), replace(user, repeats=(185.0, 1981.0)))


def test_a_cheaper_setting_that_reads_as_fast_as_the_winner_is_recommended_instead():
    """The winner beat yours in every round; a cheaper setting that ranks at least as fast, but whose own runs
    overlap yours in one round, is the better advice (v36's numpy_augment_infer: a thread worker chosen over no
    workers at one torch thread, which ranked faster, and the script ran it 0.90x the no-workers setting)."""
    from dataclasses import replace

    def runs(w, tt, rates, threads=False):
        return replace(trial(w, float(sorted(rates)[1]), tt=tt, threads=threads), repeats=tuple(rates))

    user = runs(0, 2, (560.0, 540.0, 600.0))
    winner = runs(1, 1, (700.0, 690.0, 710.0), threads=True)
    bare = runs(0, 1, (720.0, 530.0, 730.0))  # lost its second round to yours
    assert dropin.beats(winner, user) and not dropin.beats(bare, user)
    best, noise = dropin.decide(user, [user, winner, bare])
    assert best is bare and noise is None
    # slower than the winner: the winner stays
    slower = runs(0, 1, (690.0, 530.0, 695.0))
    assert dropin.decide(user, [user, winner, slower])[0] is winner


def test_the_whole_run_with_a_cache_fills_it_in_the_first_epoch_and_reads_it_after():
    from placer.stream.dataset_cache import CacheAdvice
    from placer.stream.wholerun import cached_run_seconds

    c = RunCosts(start_s=0.1, per_batch_s=0.1, close_s=0.0, refill_s=0.1, persistent=False)
    plain = c.epoch_s(10, True)
    assert cached_run_seconds(c, epochs=3, batches=10, fill=1.1, hit=0.25) == pytest.approx(
        1.1 * plain + 2 * 0.25 * plain)
    with pytest.raises(ValueError, match="fill=0"):
        cached_run_seconds(c, epochs=3, batches=10, fill=0, hit=0.25)
    user = trial(0, 80.0, first=0.1)
    run = dropin.whole_run(user, user, [user], None, epochs=3, batches=10)
    assert run["speedup"] == pytest.approx(1.0)
    cache = CacheAdvice("Audio.decode", uncached_s=[1.0, 1.2, 1.0], fill_s=1.1, cached_s=[0.25], recommended=True)
    cached = dropin.with_cache(run, cache)
    assert cached["cache"] == {"fill": 1.1, "hit": 0.25} and cached["settings_speedup"] == pytest.approx(1.0)
    assert cached["recommended_s"] == pytest.approx(run["user_s"] * (1.1 + 2 * 0.25) / 3, rel=1e-3)
    assert cached["speedup"] == pytest.approx(3 / 1.6, rel=1e-3)
    # a cache not offered leaves the run as it was
    assert dropin.with_cache(run, CacheAdvice("Audio.decode", recommended=False)) is run
    assert dropin.with_cache(run, None) is run


def test_a_setting_slow_in_some_runs_is_ranked_by_its_mean_time():
    from dataclasses import replace

    # the same median, but one run of the user's 10x slower (its threads contended with other work)
    user = replace(trial(0, 2000.0), run_rates=(2000.0, 200.0, 2100.0))
    steady = replace(trial(0, 1900.0, tt=1), run_rates=(1900.0, 1950.0, 1880.0))
    assert user.score == pytest.approx(3 / (1 / 2000 + 1 / 200 + 1 / 2100))
    assert steady.score > 2 * user.score
    assert dropin.choose(user, [user, steady], waits=True) is steady
    # without the run's shape: the steady state's median, as before
    assert replace(user, run_rates=()).score == 2000.0


def test_a_cache_that_would_not_make_the_users_run_faster_is_not_offered():
    from placer.stream.dataset_cache import CacheAdvice

    user = trial(0, 80.0, first=0.1)
    cache = CacheAdvice("Arrays.load", uncached_s=[1.0], fill_s=1.2, cached_s=[0.3], recommended=True)
    # one epoch: it only fills the cache (1.2x the time), and nothing reads it
    one = dropin.whole_run(user, user, [user], None, epochs=1, batches=10)
    run, kept = dropin.whole.cache_over_the_run(one, cache)
    assert run is one and not kept.recommended and "1 epoch x 10 batches" in kept.reason
    assert cache.recommended  # the search's own finding is left as it was
    # three epochs: 1.2 + 2 x 0.3 of 3: offered, and in the claim
    three = dropin.whole_run(user, user, [user], None, epochs=3, batches=10)
    run, kept = dropin.whole.cache_over_the_run(three, cache)
    assert kept is cache and kept.recommended and run["speedup"] == pytest.approx(3 / 1.8, rel=1e-3)


def test_filling_a_cache_is_never_counted_faster_than_not_caching():
    from placer.stream.dataset_cache import CacheAdvice

    user = trial(0, 80.0, first=0.1)
    # the filling pass happened to measure faster than the uncached ones (noise): one epoch gains nothing
    cache = CacheAdvice("Arrays.load", uncached_s=[1.0, 1.1], fill_s=0.4, cached_s=[0.3], recommended=True)
    one = dropin.whole_run(user, user, [user], None, epochs=1, batches=10)
    assert dropin.with_cache(one, cache)["cache"]["fill"] == 1.0
    run, kept = dropin.whole.cache_over_the_run(one, cache)
    assert run is one and not kept.recommended


class Numbered(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([i])


@pytest.mark.parametrize("generator", [True, False])
def test_persistent_workers_from_the_advice_read_the_users_batches_in_every_epoch(generator):
    """torch draws each iterator's worker seed from the loader's generator (or the global one): persistent
    workers start one iterator, so later epochs would shuffle differently; advice.loader() must not."""
    def loader(**kw):
        g = torch.Generator().manual_seed(5) if generator else None
        return DataLoader(Numbered(), batch_size=4, shuffle=True, generator=g, **kw)

    def epochs(dl, n=3):
        torch.manual_seed(11)
        out = []
        for _ in range(n):
            out.append([b.flatten().tolist() for b in dl])
            out.append(torch.rand(1).item())  # the script's own draw from the global generator
        return out

    yours = epochs(loader())
    plain_persistent = epochs(loader(num_workers=1, persistent_workers=True))
    assert plain_persistent != yours  # torch's own: why the advice rebuilds it
    settings = LoaderSettings(num_workers=1, prefetch_factor=2, persistent_workers=True, torch_threads=1)
    assert epochs(rebuild(loader(), settings)) == yours
    assert epochs(rebuild(loader(), settings.model_copy(update={"persistent_workers": False}))) == yours


def test_advice_that_keeps_workers_between_epochs_says_what_that_does_to_the_random_draws(monkeypatch):
    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 200.0}, {0: 100.0, 2: 190.0}, first={2: 0.5})
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=3)
    assert advice.change and advice.recommended.settings.persistent_workers
    note = next(n for n in advice.notes if n.startswith("persistent_workers=True"))
    assert "one random number fewer per epoch" in note and "advice.loader()" in note
    assert type(advice.loader()).__name__ == "SameDrawsDataLoader"


def advised_at_two_step_threads(monkeypatch, rate):
    """Advice on 2 cores for a step at 2 torch threads; each run with the step measures ``rate(loader)``
    (the step's threads are torch's at the time), the loader alone 520 samples/s, the step alone 1,000."""
    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        r = rate(loader) if step is not None else 520.0
        return Trial(settings=settings_of(loader), samples_per_s=r, first_batch_s=0.01, fetch_fraction=0.1,
                     batches=10, samples=80, seconds=80 / r)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: 1000.0)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return advise_loader(DataLoader(Records(), batch_size=4), lambda b: None, budget_s=30, cache_bytes=0)
    finally:
        torch.set_num_threads(torch_threads)


def test_the_users_loader_at_one_step_thread_is_tried_first_and_not_run_twice(monkeypatch):
    """On 2 cores a numpy-decoding inference script ran 1.24x faster at one torch thread, and its
    search once spent its budget on two worker processes (6 s to their first batch) before it tried
    that: the user's own loader at one step thread is the first setting tried, and the step-threads
    search reuses that run instead of measuring it again."""
    user = LoaderSettings(num_workers=0, torch_threads=2)
    first = dropin.candidates(user, cores=2, gpu=False, iterable=False)[0]
    assert (first.num_workers, first.torch_threads) == (0, 1)
    assert all(s.torch_threads == 2 for s in dropin.candidates(user, cores=2, gpu=True, iterable=False))
    assert dropin.candidates(user.model_copy(update={"torch_threads": 1}), cores=2, gpu=False,
                             iterable=False)[0].torch_threads == 1  # nothing to cut: no extra run
    order = []

    def rate(loader):
        key = (loader.num_workers, torch.get_num_threads())
        order.append(key)
        return {(0, 1): 650.0}.get(key, 500.0)

    advice = advised_at_two_step_threads(monkeypatch, rate)
    assert order[:2] == [(0, 2), (0, 1)]  # the user's run, then theirs at one step thread
    chosen = advice.recommended.settings
    assert (chosen.num_workers, chosen.torch_threads) == (0, 1)
    rows = [t for t in advice.trials if (t.settings.num_workers, t.settings.torch_threads) == (0, 1)]
    assert len(rows) == 1 and len(rows[0].rates) == dropin.REPEATS  # one setting, its runs merged


def test_one_thread_worker_is_in_the_first_round_and_is_recommended_where_it_wins(monkeypatch):
    """On 2 cores a numpy-augmenting inference script of 12 batches ran fastest with one thread worker
    at one torch thread (1.44x as written); its search had tried thread workers only at two."""
    user = LoaderSettings(num_workers=0, torch_threads=2)
    first = dropin.candidates(user, cores=2, gpu=False, iterable=False)
    assert {(1, 1), (1, 2)} <= {(s.num_workers, s.torch_threads) for s in first if s.worker_threads}

    def rate(loader):
        key = (loader.num_workers, bool(getattr(loader, "worker_threads", False)), torch.get_num_threads())
        return {(1, True, 1): 700.0}.get(key, 500.0)

    advice = advised_at_two_step_threads(monkeypatch, rate)
    chosen = advice.recommended.settings
    assert advice.change and (chosen.num_workers, chosen.worker_threads, chosen.torch_threads) == (1, True, 1)
    assert "ThreadLoader" in str(advice)


@pytest.mark.slow
def test_settings_slow_to_start_leave_the_budget_room_to_repeat_yours_and_a_finalist(monkeypatch):
    """Worker processes that take seconds to their first batch (numpy's BLAS threads in each) must not
    spend the budget on single runs: a recommendation needs repeated runs of yours and of it."""
    rates = {0: 100.0, 1: 150.0, 2: 20.0, -1: 20.0}
    walls = {0: 0.05, 1: 0.05, 2: 0.5, -1: 0.5}  # 2 processes and the thread pool: slow to their first batch

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        w = -1 if getattr(loader, "worker_threads", False) else loader.num_workers
        time.sleep(walls[w])
        rate = 5000.0 if step is None else rates[w]
        return Trial(settings=settings_of(loader), samples_per_s=rate, first_batch_s=0.01, fetch_fraction=0.5,
                     batches=10, samples=80, seconds=walls[w])

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: 10_000.0)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    monkeypatch.setattr(dropin.space, "thread_counts", lambda *a: [])
    monkeypatch.setattr(dropin.caching, "find_cache", lambda *a, **k: None)
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, budget_s=2.5)
    first = dropin.candidates(advice.user.settings, cores=2, gpu=False, iterable=False)
    slow = [s for s in first if s.worker_threads or s.num_workers == 2]
    measured = [t for t in advice.trials if t.settings.worker_threads or t.settings.num_workers == 2]
    assert len(measured) < len(slow)  # the first round stopped before running every slow setting once
    assert len(advice.user.rates) >= 2  # yours, repeated
    assert advice.change and advice.recommended.settings.num_workers == 1


def _rounds_of(monkeypatch, seq: dict, then: dict):
    """The drop-in on scripted runs at the step's 2 threads: a key ``(workers, prefetch, step threads)`` in
    ``seq`` reads its values in its first runs of the search, then its value in ``then`` (in the confirming
    runs too); other keys 50 samples/s."""
    calls: dict = {}

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        w = -1 if getattr(loader, "worker_threads", False) else loader.num_workers
        key = (w, loader.prefetch_factor if w > 0 else None, torch.get_num_threads())
        rate = 5000.0 if step is None else then.get(key, 50.0)
        if step is not None and batches <= 20 and key in seq:  # the search's runs (the confirming ones are longer)
            n = calls[key] = calls.get(key, 0) + 1
            rate = seq[key][n - 1] if n <= len(seq[key]) else rate
        return Trial(settings=settings_of(loader), samples_per_s=rate, first_batch_s=0.01, fetch_fraction=0.5,
                     batches=10, samples=80, seconds=80 / rate)

    _patched(monkeypatch, run)
    with torch_threads(2):  # the user's step threads, whatever this machine's cores
        return advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)


#: yours and 2 workers at prefetch 2, each at the step's 2 threads
YOURS, TWO = (0, None, 2), (2, 2, 2)


def test_a_gain_left_within_noise_gets_more_interleaved_rounds_while_the_budget_has_room(monkeypatch):
    """2 workers measure 15 % faster in every round but one: after REPEATS rounds (2 of 3 won) the gain
    is within noise; more rounds of the two (6 of 7 won) decide it, as a sign test would."""
    runs = ({YOURS: [100.0, 120.0], TWO: [115.0, 110.0, 115.0]}, {YOURS: 100.0, TWO: 115.0})
    advice = _rounds_of(monkeypatch, *runs)
    assert advice.change and advice.recommended.settings.num_workers == 2 and advice.within_noise is None
    assert len(advice.user.rates) == dropin.REPEATS + dropin.SETTLE_ROUNDS
    # without the extra rounds the same runs keep your settings, within noise
    monkeypatch.setattr("placer.stream.rounds.SETTLE_ROUNDS", 0)
    kept = _rounds_of(monkeypatch, *runs)
    assert not kept.change and "within noise" in kept.within_noise
    assert len(kept.user.rates) == dropin.REPEATS


def test_a_gain_the_spread_of_its_runs_may_hide_gets_more_rounds_before_yours_are_kept(monkeypatch):
    """2 workers read 112, 101 and 100 samples/s against your 100s (v29's text_infer: 2 worker processes
    0.99-1.03x yours over 3 runs spread by 14-37 %, the script 1.31x): their median is not 5 % faster,
    their fastest run is. More interleaved rounds (115 each) decide it, as a sign test would (6 of 7)."""
    runs = ({TWO: [112.0, 101.0, 100.0]}, {YOURS: 100.0, TWO: 115.0})
    advice = _rounds_of(monkeypatch, *runs)
    assert advice.change and advice.recommended.settings.num_workers == 2 and advice.within_noise is None
    assert len(advice.user.rates) == dropin.REPEATS + dropin.SETTLE_ROUNDS
    # without the more rounds the same runs keep your settings
    monkeypatch.setattr(dropin.deciding, "within_reach", lambda *a, **k: None)
    kept = _rounds_of(monkeypatch, *runs)
    assert not kept.change and len(kept.user.rates) == dropin.REPEATS


def test_settings_whose_every_run_is_within_noise_of_yours_get_no_more_rounds(monkeypatch):
    """No run of 2 workers was 5 % faster than yours (103, 102, 101): your settings are kept after
    REPEATS rounds, the budget not spent on more."""
    kept = _rounds_of(monkeypatch, {TWO: [103.0, 102.0, 101.0]}, {YOURS: 100.0, TWO: 104.0})
    assert not kept.change and len(kept.user.rates) == dropin.REPEATS
    assert dropin.within_reach(kept.user, kept.trials) is None


def test_the_rounds_a_gain_must_win_follow_a_sign_test():
    from dataclasses import replace

    def runs(w, rates):
        return replace(trial(w, float(sorted(rates)[len(rates) // 2])), repeats=tuple(rates))

    user = runs(0, (100.0, 120.0, 100.0, 100.0, 100.0, 100.0, 100.0))
    assert dropin.beats(runs(2, (115.0, 110.0, 115.0, 115.0, 115.0, 115.0, 115.0)), user)  # 6 of 7
    assert not dropin.beats(runs(2, (115.0, 110.0, 115.0, 99.0, 115.0, 115.0, 115.0)), user)  # 5 of 7
    assert not dropin.beats(runs(2, (115.0, 110.0, 115.0)), runs(0, (100.0, 120.0, 100.0)))  # 2 of 3
    assert sign_tail(3, 3) == sign_tail(6, 7) * 2 == 0.125 and sign_tail(3, 5) == 0.5


@pytest.mark.parametrize("per_batch_s, expected", [(0.005, 100), (0.05, 10)])
def test_runs_too_short_to_measure_read_more_batches_up_to_an_epoch(monkeypatch, per_batch_s, expected):
    """A run of 10 batches at 5 ms is 50 ms: runs read up to MIN_RUN_S' worth (here the epoch's 100
    batches caps it), the user's first run is only a probe and runs again at that length; batches of
    50 ms already make a 0.5 s run and keep the length asked for."""
    asked = []

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        asked.append((loader.num_workers, getattr(loader, "worker_threads", False), batches, step is None))
        return Trial(settings=settings_of(loader), samples_per_s=8 / per_batch_s, first_batch_s=0.01,
                     fetch_fraction=0.5, batches=10, samples=80, seconds=10 * per_batch_s)

    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: 1e6)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    monkeypatch.setattr(dropin.space, "thread_counts", lambda *a: [])
    monkeypatch.setattr(dropin.caching, "find_cache", lambda *a, **k: None)
    advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert asked[0][2] == 10  # the first run of yours
    later = [b for w, threads, b, alone in asked[1:] if w == 0 and not threads and not alone]
    assert later and all(b == expected for b in later)  # yours again (and every run after) at the length
    if expected > 10:
        assert asked[1][:2] == (0, False) and asked[1][2] == expected  # the probe, repeated at once


def _patched(monkeypatch, run):
    """The drop-in with ``run`` for run_loader on 2 cores: the step alone at 10,000 samples/s, no step-thread
    trials, no cache search."""
    monkeypatch.setattr(dropin.measuring, "run_loader", run)
    monkeypatch.setattr(dropin.measuring, "step_alone", lambda *a, **k: 10_000.0)
    monkeypatch.setattr(dropin.measuring, "cores", lambda: 2)
    monkeypatch.setattr(dropin.space, "thread_counts", lambda *a: [])
    monkeypatch.setattr(dropin.caching, "find_cache", lambda *a, **k: None)


def _fake_runs(monkeypatch, rate_of):
    """run_loader replaced: ``rate_of(key, n, confirming)`` gives a run's samples/s from its settings'
    key ``(workers, thread workers, prefetch)``, how many runs of that key came before, and whether
    it is one of the longer confirming runs."""
    calls: dict = {}

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        threads = bool(getattr(loader, "worker_threads", False))
        w = loader.num_workers
        key = (w, threads, loader.prefetch_factor if w else None)
        if step is None:
            rate = 5000.0
        else:
            n = calls[key] = calls.get(key, 0) + 1
            rate = rate_of(key, n - 1, batches > 20)
        return Trial(settings=settings_of(loader), samples_per_s=rate, first_batch_s=0.01, fetch_fraction=0.5,
                     batches=10, samples=80, seconds=80 / rate)

    _patched(monkeypatch, run)
    return calls


def test_a_setting_run_once_faster_than_every_repeated_one_is_raced_before_yours_are_kept(monkeypatch):
    """The first round's two fastest (2 processes at prefetch 2 and 4) were lucky once and fall back
    below yours when repeated; one thread worker, run once at 1.5x yours, must be repeated too (and
    wins) before the advice keeps your settings."""
    def rate(key, n, confirming):
        if key == (0, False, None):
            return 100.0
        if key in ((2, False, 2), (2, False, 4)):
            return (200.0 if key[2] == 2 else 190.0) if n == 0 else 90.0
        return {(1, True, 2): 150.0, (2, True, 2): 140.0}.get(key, 90.0 if key[0] != 1 else 100.0)

    calls = _fake_runs(monkeypatch, rate)
    with torch_threads(1):
        advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    chosen = advice.recommended.settings
    assert advice.change and (chosen.num_workers, chosen.worker_threads) == (1, True)
    assert len(advice.recommended.rates) == dropin.REPEATS and advice.confirmed["held"]
    assert calls[(2, True, 2)] >= dropin.REPEATS  # the second rival raced too
    # without the race, the same runs keep your settings
    monkeypatch.setattr(dropin.repeats, "RACES", 0)
    calls.clear()
    with torch_threads(1):
        kept = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert not kept.change and calls[(1, True, 2)] == 1


def test_a_recommendation_overturned_by_longer_runs_hands_them_to_the_next_setting_that_beat_yours(monkeypatch):
    """2 processes beat yours in the search (1.6x) but read slower than yours in the longer runs; one
    thread worker, which also beat yours in repeated runs (1.5x), holds in its own longer runs."""
    def rate(key, n, confirming):
        if key == (2, False, 2):
            return 95.0 if confirming else 160.0
        return {(0, False, None): 100.0, (1, True, 2): 150.0}.get(key, 90.0)

    _fake_runs(monkeypatch, rate)
    with torch_threads(1):
        advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    chosen = advice.recommended.settings
    assert advice.change and (chosen.num_workers, chosen.worker_threads) == (1, True)
    assert advice.confirmed["held"] and advice.confirmed["steady_speedup"] == pytest.approx(1.5, rel=0.01)
    assert any("num_workers=2 (processes)" in n and "did not confirm" in n for n in advice.notes)
    # with no next setting to confirm, the overturned one leaves your settings kept
    monkeypatch.setattr(dropin.deciding, "runner_up", lambda *a, **k: None)
    kept = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert not kept.change and "not confirmed by longer runs" in kept.within_noise


def test_a_setting_s_runs_pair_with_your_runs_of_the_same_round():
    """Raced later than the first rounds, a setting's runs are compared with your runs of their own
    rounds (your last run before each), not with your first runs in order."""
    from dataclasses import replace

    def runs(w, rates, at):
        return replace(trial(w, float(sorted(rates)[len(rates) // 2])), repeats=tuple(rates), started=tuple(at))

    user = runs(0, (100.0, 200.0, 200.0, 100.0, 100.0), (0.0, 10.0, 20.0, 30.0, 40.0))
    raced = runs(1, (150.0, 150.0, 150.0), (5.0, 35.0, 45.0))
    assert dropin.paired(raced, user) == [(150.0, 100.0)] * 3 and dropin.beats(raced, user)
    # the same runs without start times pair in order: 1 of 3 won, within noise
    assert not dropin.beats(replace(raced, started=()), user)


def test_your_runs_at_two_speeds_are_told_with_the_gain_over_each(monkeypatch):
    """A 2-core Xeon ran text_infer as written at 4,900 or 8,000 samples/s, nothing between: a speed-up over
    the median of such runs depends on the mix. The advice says the user's runs split in two, gives the
    recommendation's gain over each and claims the one over the faster; runs at one speed get no such note.
    A change that does not clear 5 % over the faster runs is not recommended, whatever it gains over the mix."""
    def rate(key, n, confirming, recommended=115.0):
        if key == (0, False, None):
            return (50.0, 100.0, 52.0, 98.0, 51.0)[n % 5]
        return recommended if key == (2, False, 2) else 60.0

    _fake_runs(monkeypatch, rate)
    with torch_threads(1):
        advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    speeds = advice.user_speeds
    assert speeds is not None and max(speeds["slow"]) < 60 and min(speeds["fast"]) > 90
    assert speeds["over_slow"] > 1.8 and speeds["over_fast"] == pytest.approx(115 / 99, rel=0.03)
    note = next(n for n in advice.notes if n.startswith("your settings ran at two speeds"))
    assert f"{speeds['over_fast']:.2f}x your faster ones" in note and note in str(advice), note
    assert json.loads(advice.to_json())["user_speeds"]["fast"] == speeds["fast"]
    # the speed-up claimed is the one over the faster runs: the one a run of the script meets at worst
    assert advice.speedup == speeds["speedup"] == pytest.approx(115 / 100, rel=0.05)
    assert advice.confirmed["held"] and advice.confirmed["over_faster"] == speeds["speedup"]
    assert speeds["over_the_mix"] == advice.whole_run["speedup"] > 1.8
    assert json.loads(advice.to_json())["speedup"] == speeds["speedup"]
    assert f"{speeds['speedup']:.2f}x yours over your whole run at your faster runs' speed" in str(advice)

    # faster than every run of yours, 1.9x over the mix, but 1.03x over the faster runs: within the 5 % a
    # change must clear whichever speed a run meets, so no change
    _fake_runs(monkeypatch, lambda key, n, confirming: rate(key, n, confirming, recommended=102.0))
    with torch_threads(1):
        kept = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert not kept.change and kept.recommended.settings.num_workers == 0
    assert not kept.confirmed["held"] and kept.confirmed["over_faster"] == pytest.approx(102 / 100, rel=0.03)
    assert f"over your faster runs it would be {kept.confirmed['over_faster']:.2f}x yours" in kept.within_noise
    assert "over the mix of both" in kept.within_noise
    text = str(kept)
    assert "Recommended:   keep your settings" in text and "worker start-up and epoch ends take back" not in text
    faster = kept.confirmed["over_faster"]
    assert f"not enough over your faster runs ({faster:.2f}x; your runs ran at two speeds)" in text

    _fake_runs(monkeypatch, lambda key, n, confirming: 100.0 + n if key == (0, False, None) else 60.0)
    with torch_threads(1):
        steady = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert steady.user_speeds is None and not any("two speeds" in n for n in steady.notes)
    assert steady.speedup == steady.mixed_speedup


def test_the_advices_own_runs_past_the_cores_keep_torchs_worker_warning_off_the_users_screen():
    """The search runs more worker processes than the cores on purpose (while the rate rises): torch's
    "This DataLoader will create N worker processes ... might get DataLoader running slow or even
    freeze" warning, printed twice a run, is not the user's to read there."""
    import os
    import warnings

    cores = len(os.sched_getaffinity(0))
    past = LoaderSettings(num_workers=cores + 1, prefetch_factor=2, torch_threads=1)
    budget = dropin.runs.Budget(30.0, runs=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ran = dropin.runs.run_trial(DataLoader(Records(), batch_size=4), past, None, 4, dropin.measuring.step_device("cpu"), budget)
        assert ran is not None and ran.settings.num_workers == cores + 1
        assert not [w for w in seen if "This DataLoader will create" in str(w.message)]
        DataLoader(Records(), batch_size=4, num_workers=cores + 1)  # the same loader outside the advice's runs
    assert [w for w in seen if "This DataLoader will create" in str(w.message)]



def test_the_caches_passes_at_the_recommended_workers_keep_torchs_worker_warning_off_too(monkeypatch):
    """The cache found in the dataset is measured again at the recommended settings, which may start more
    worker processes than the cores: those passes are the advice's own runs as well."""
    import os
    import warnings

    cores = len(os.sched_getaffinity(0))
    built = []

    def measure_at(cache, loader, step, *, loader_kwargs, **kw):
        built.append(DataLoader(Records(), batch_size=4, **loader_kwargs))  # torch warns here past the cores
        return cache

    monkeypatch.setattr(dropin.caching.dataset_cache, "measure_at", measure_at)
    past = LoaderSettings(num_workers=cores + 1, prefetch_factor=2, torch_threads=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = dropin.caching.cache_at("the cache", DataLoader(Records(), batch_size=4), None, past, 4, 1.0,
                               dropin.measuring.step_device("cpu"))
    assert out == "the cache" and built and built[0].num_workers == cores + 1
    assert not [w for w in seen if "This DataLoader will create" in str(w.message)]

def test_a_recommendation_of_more_workers_than_cores_says_so(monkeypatch):
    """On 2 cores 3 worker processes measure fastest: the advice says torch will warn, and why it holds."""
    _fake_runs(monkeypatch, lambda key, n, confirming: {0: 100.0, 1: 150.0, 2: 200.0, 3: 300.0}.get(key[0], 250.0)
               if not key[1] else 50.0)
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert advice.change and advice.recommended.settings.num_workers == 3
    assert "num_workers=3 starts more worker processes than this machine's 2 cores: torch warns" in str(advice)
    _fake_runs(monkeypatch, lambda key, n, confirming: {0: 100.0, 1: 150.0, 2: 300.0}.get(key[0], 250.0)
               if not key[1] else 50.0)
    two = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert two.change and two.recommended.settings.num_workers == 2 and "more worker processes" not in str(two)


def _slow_start(worker_id: int) -> None:
    time.sleep(1.0)


@pytest.mark.slow
def test_a_run_still_in_its_warm_up_after_your_whole_run_stops_there():
    """2 worker processes that take a second to start (their worker_init_fn sleeps) against a whole run
    of yours of 0.2 s: the run stops after its first batch, its rate that batch over the time taken,
    and its row says so; with no limit the same loader reads its warm-up and counts batches."""
    from placer.timing import Deadline

    loader = DataLoader(Records(), batch_size=4, num_workers=2, worker_init_fn=_slow_start)
    kw = dict(batches=6, warmup=2, device=dropin.measuring.step_device("cpu"), deadline=Deadline(None))
    cut = run_loader(loader, None, give_up_s=0.2, **kw)
    assert cut.cut and cut.read == 1 and cut.first_batch_s >= 1.0
    assert cut.samples == 4 and cut.samples_per_s == pytest.approx(4 / cut.seconds)
    assert "stopped in its warm-up" in dropin.words.row(cut, False) and cut.as_dict()["cut"]
    whole = run_loader(loader, None, **kw)
    assert not whole.cut and whole.read == 6 and whole.batches == 4
    assert "stopped" not in dropin.words.row(whole, False) and "cut" not in whole.as_dict()


def test_other_settings_stay_in_their_warm_up_no_longer_than_your_whole_run(monkeypatch):
    """Every run but yours gets your whole run's seconds as its limit in the warm-up (100 batches of 8
    at 100 samples/s, 0.01 s to the first: 7.93 s); yours (with the step or alone) none."""
    seen: dict = {}

    def run(loader, step, *, batches, warmup, device, deadline, keep=None, count=None, drain=0, give_up_s=None):
        if keep is not None:
            keep.append(next(iter(loader)))
        key = (loader.num_workers, bool(getattr(loader, "worker_threads", False)), torch.get_num_threads())
        seen.setdefault(key, set()).add(give_up_s)
        return Trial(settings=settings_of(loader), samples_per_s=100.0, first_batch_s=0.01, fetch_fraction=0.5,
                     batches=10, samples=80, seconds=0.8)

    _patched(monkeypatch, run)
    with torch_threads(2):
        advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10)
    assert seen.pop((0, False, 2)) == {None}
    limits = set().union(*seen.values())
    assert len(seen) >= 4 and limits and all(g == pytest.approx(7.93, rel=0.01) for g in limits)


def test_with_a_cache_the_workers_that_overlapped_its_work_give_way_to_none_when_they_no_longer_pay(monkeypatch):
    """Without the cache one worker reads 1.5x yours (confirmed by longer runs); with it, your epochs 2+
    read the cache at 0.2x an uncached epoch's time, the worker's at 0.75x (its batches still cross to
    the main process): over 4 epochs no workers with the cache is the faster run, and it is what the
    advice recommends and claims. Where the worker still wins with the cache, it stays."""
    from dataclasses import replace

    from placer.stream.dataset_cache import CacheAdvice

    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 110.0}, {0: 100.0, 1: 150.0})
    found = CacheAdvice("Many.decode", share=0.9, bytes=1 << 20, uncached_s=[1.0, 1.0], fill_s=1.1,
                        cached_s=[0.2, 0.2], recommended=True, reason="found")
    hit = {1: 0.75}
    measured_at = []

    def at(cache, loader, step, settings, batches, budget_s, dev):  # the worker's passes 1.5x as fast as yours
        measured_at.append(settings.num_workers)
        h, u = hit.get(settings.num_workers, 0.2), 1 / 1.5 if settings.num_workers else 1.0
        return replace(cache, uncached_s=[u, u], fill_s=1.05 * u, cached_s=[h * u, h * u])

    monkeypatch.setattr(dropin.caching, "find_cache", lambda *a, **k: found)
    monkeypatch.setattr(dropin.caching, "cache_at", at)
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=4)
    assert measured_at == [1]  # the worker's passes; yours are the cache search's own
    assert not advice.change and advice.cache.recommended and advice.cache is found
    w = advice.whole_run
    mine = 4 * (0.01 + 99 * 0.08)
    assert w["user_s"] == pytest.approx(mine, rel=1e-3)
    assert w["recommended_s"] == pytest.approx(mine * (1.1 + 3 * 0.2) / 4, rel=1e-3)
    assert advice.speedup == pytest.approx(4 / 1.7, rel=1e-3) and advice.confirmed is None
    why = re.fullmatch(r"with the cache, your settings would take ([\d.]+) s over your whole run and "
                       r"num_workers=1 \(processes\).*, the fastest without it, ([\d.]+) s: .*", advice.within_noise)
    assert why and float(why[1]) == pytest.approx(w["recommended_s"], abs=0.005)
    assert float(why[2]) > float(why[1]) * (1 + dropin.MIN_GAIN)
    text = str(advice)
    assert "keep your settings (with the cache" in text and "with the cache (advice.loader())" in text
    # the worker keeps its place where its cached epochs are as quick as yours
    hit[1] = 0.2
    measured_at.clear()
    kept = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=4)
    assert kept.change and kept.recommended.settings.num_workers == 1 and kept.confirmed["held"]
    assert kept.cache.recommended and kept.whole_run["cache"]["hit"] == pytest.approx(0.2 / 1.0)


def test_with_a_cache_its_passes_at_both_settings_decide_where_the_search_runs_overstate_the_worker(monkeypatch):
    """The search reads one worker 1.5x as fast as yours, but over the cache's own passes (the same
    batches) it ran an uncached epoch only 1.11x as fast, filled the cache in 0.95 s against your 1.1 s
    and read it in 0.27 s against your 0.2 s: over 4 epochs 1.76 s against your 1.70 s. Scaled by the
    search's rates, the worker's run with the cache would still read 1.3x yours, so the passes decide:
    with the cache, your settings, which need no workers, are as fast, and the advice keeps them."""
    from dataclasses import replace

    from placer.stream.dataset_cache import CacheAdvice

    scripted(monkeypatch, {0: 100.0, 1: 150.0, 2: 110.0}, {0: 100.0, 1: 150.0})
    found = CacheAdvice("Many.decode", share=0.9, bytes=1 << 20, uncached_s=[1.0, 1.0], fill_s=1.1,
                        cached_s=[0.2, 0.2], recommended=True, reason="found", batches=10)
    monkeypatch.setattr(dropin.caching, "find_cache", lambda *a, **k: found)
    monkeypatch.setattr(dropin.caching, "cache_at", lambda cache, loader, step, settings, *a: replace(
        cache, uncached_s=[0.9, 0.9], fill_s=0.95, cached_s=[0.27, 0.27]) if settings.num_workers else cache)
    advice = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=4)
    assert dropin.cached_passes_s(found, 4) == pytest.approx(1.7)
    assert not advice.change and advice.cache is found and advice.cache.recommended
    mine = 4 * (0.01 + 99 * 0.08)
    assert advice.whole_run["recommended_s"] == pytest.approx(mine * (1.1 + 3 * 0.2) / 4, rel=1e-3)
    assert re.fullmatch(r"with the cache, your settings ran the cache's passes over the same 10 batches \(filling "
                        r"it, then 3 reads, as your 4 epochs would\) in 1\.70 s and num_workers=1 \(processes\).*, "
                        r"the fastest without it, in 1\.76 s: .*", advice.within_noise)
    # passes that read the worker's epochs with the cache beyond MIN_GAIN faster leave it recommended
    monkeypatch.setattr(dropin.caching, "cache_at", lambda cache, loader, step, settings, *a: replace(
        cache, uncached_s=[0.9, 0.9], fill_s=0.95, cached_s=[0.21, 0.21]) if settings.num_workers else cache)
    kept = advise_loader(DataLoader(Many(), batch_size=8), lambda b: None, batches=10, epochs=4)
    assert kept.change and kept.recommended.settings.num_workers == 1 and kept.cache.recommended
