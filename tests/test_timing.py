"""Timing: repeats, median/IQR, noise warnings, first call kept apart, blocking of fast calls."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from placer.timing import Measurement, NoisyMeasurementWarning, measure


class FakeClock:
    """A clock that advances only when the measured function says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_median_and_iqr_follow_raw_times():
    m = Measurement(raw_times=[1.0, 2.0, 3.0, 4.0, 100.0])
    assert m.median_s == 3.0
    q1, q3 = np.percentile(m.raw_times, [25, 75])
    assert m.iqr_s == pytest.approx(q3 - q1)
    assert m.reps == 5


def test_noisy_measurement_warns_and_quiet_one_does_not():
    noisy = Measurement(raw_times=[1.0, 1.5, 2.0, 2.5, 3.0], label="stage 'x'")
    with pytest.warns(NoisyMeasurementWarning, match="stage 'x'"):
        assert noisy.warn_if_noisy()
    quiet = Measurement(raw_times=[1.0, 1.01, 1.02, 1.03])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not quiet.warn_if_noisy()


def test_first_call_is_kept_apart_from_steady_state():
    clock = FakeClock()
    calls = []

    def fn():
        calls.append(1)
        clock.t += 0.5 if len(calls) == 1 else 0.01  # compilation on the first call

    m = measure(fn, clock=clock, min_reps=5, max_reps=5, min_time_s=0.0, warn=False)
    assert m.first_call_s == pytest.approx(0.5)
    assert m.median_s == pytest.approx(0.01)
    assert m.reps == 5
    assert len(calls) == 1 + 1 + 5  # cold, one warm-up, five timed


def test_sync_runs_inside_the_timed_region():
    clock = FakeClock()

    def fn():
        clock.t += 0.002

    def sync():  # the device finishes its queued work here
        clock.t += 0.003

    m = measure(fn, sync=sync, clock=clock, min_reps=3, max_reps=3, warn=False)
    assert m.median_s == pytest.approx(0.005)


def test_fast_calls_are_timed_in_blocks():
    clock = FakeClock()

    def fn():
        clock.t += 1e-6

    m = measure(fn, clock=clock, min_reps=3, max_reps=3, warn=False)
    assert m.number_per_run > 1
    assert m.median_s == pytest.approx(1e-6)


def test_a_call_longer_than_the_budget_is_timed_once():
    clock = FakeClock()

    def fn():
        clock.t += 3.0

    m = measure(fn, clock=clock, warmup=1, min_reps=3, max_time_s=1.0, warn=False)
    assert m.reps == 1
    assert m.median_s == pytest.approx(3.0)


def test_real_clock_measurement_warns_only_when_asked():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        measure(lambda: sum(range(100)), min_reps=3, max_time_s=0.01, warn=False)
    assert not [w for w in rec if issubclass(w.category, NoisyMeasurementWarning)]


def test_bad_repeat_bounds_are_rejected():
    with pytest.raises(ValueError, match="min_reps"):
        measure(lambda: None, min_reps=5, max_reps=2)


def test_stalled_repeats_are_detected_as_two_clusters():
    quiet = Measurement(raw_times=[1.00, 1.01, 1.02, 1.00, 1.03])
    stalled = Measurement(raw_times=[1.00, 1.01, 5.0, 1.02, 5.1, 1.00])  # some repeats lost a whole slice
    assert not quiet.stalled and stalled.stalled
    assert stalled.low_s == pytest.approx(1.0025, rel=1e-3)  # the fast cluster's lower quartile
    spread = Measurement(raw_times=list(np.linspace(1.0, 2.0, 12)))  # broad but not split
    assert not spread.stalled


def test_a_stalled_measurement_is_timed_again_until_its_lower_quartile_settles():
    clock = FakeClock()
    n = []

    def fn():  # every third call is delayed by a 4 ms stall
        n.append(1)
        clock.t += 0.001 + (0.004 if len(n) % 3 == 0 else 0.0)

    m = measure(fn, clock=clock, cold=False, warmup=0, min_reps=3, max_reps=40, min_time_s=0.0,
                max_time_s=10.0, warn=False)
    assert m.reps > 3  # three repeats would have stopped at once
    assert m.stalled and m.low_s == pytest.approx(0.001)

    quiet = measure(lambda: setattr(clock, "t", clock.t + 0.001), clock=clock, cold=False, warmup=0,
                    min_reps=3, max_reps=40, min_time_s=0.0, max_time_s=10.0, warn=False)
    assert quiet.reps == 3  # quiet repeats stop at the minimum


def test_cpu_time_and_load_are_recorded():
    import time

    def burn():
        t0 = time.process_time()
        while time.process_time() - t0 < 0.002:
            pass

    m = measure(burn, min_reps=3, max_time_s=0.1, warn=False)
    assert m.cpu_s == pytest.approx(0.002, rel=0.5)
    m2 = measure(lambda: time.sleep(0.003), min_reps=3, max_time_s=0.1, warn=False)
    assert m2.cpu_s < 0.3 * m2.median_s  # waiting, not computing
    assert m.load is None or m.load >= 0


def test_setup_gives_every_timed_call_fresh_arguments():
    made, seen = [], []

    def setup():
        made.append(object())
        return made[-1]

    measure(lambda x: seen.append(x), setup=setup, min_reps=3, max_reps=3, warn=False)
    assert len(seen) >= 3 and len({id(x) for x in seen}) == len(seen)  # never the same object twice


def test_single_repeat_is_flagged():
    assert Measurement(raw_times=[1.0]).single_repeat
    assert not Measurement(raw_times=[1.0, 1.1]).single_repeat


# -- timing work where it runs: Clock, Timings, per_batch; torch's threads --------------------------
def test_a_clock_reads_wall_and_cpu_seconds_of_a_block():
    from placer.timing import Clock

    ticks = iter([10.0, 10.5])
    cpu = iter([1.0, 1.25])
    with Clock(clock=lambda: next(ticks), cpu_clock=lambda: next(cpu)) as c:
        pass
    assert (c.wall, c.cpu) == (0.5, 0.25)
    backwards = iter([2.0, 1.0])
    with Clock(clock=iter([0.0, 1.0]).__next__, cpu_clock=lambda: next(backwards)) as c:
        pass
    assert c.cpu == 0.0  # a CPU clock read on another core never gives negative time


def test_per_batch_keeps_the_first_batch_apart_and_every_other_repeat():
    from placer.timing import per_batch

    m = per_batch([0.9, 0.2, 0.4, 0.1, 0.3, 0.5], label="decode")
    assert m.first_call_s == 0.9 and m.raw_times == [0.2, 0.4, 0.1, 0.3, 0.5] and m.label == "decode"
    assert m.lower_quartile_s == 0.2 and m.median_s == 0.3 and m.iqr_s > 0
    two = per_batch([0.9, 0.2])  # too few to set a warm-up batch apart: the last one
    assert two.raw_times == [0.2] and two.first_call_s is None
    with pytest.raises(ValueError, match="decode"):
        per_batch([], label="decode")


def test_timings_keep_every_reading_under_its_key():
    from placer.timing import Clock, Timings

    t = Timings()
    for w in (0.3, 0.1, 0.2):
        c = Clock()
        c.wall, c.cpu = w, w / 2
        t.add(("x", "host", "gpu"), c)
    t.add_seconds("pinned", 0.05)
    assert t.keys() == [("x", "host", "gpu"), "pinned"] and "pinned" in t and "other" not in t
    key = ("x", "host", "gpu")
    assert t.wall(key).raw_times == [0.1, 0.2] and t.cpu(key).median_s == pytest.approx(0.075)
    assert "pinned" not in t.cpu_s  # no CPU reading given: none kept


def test_torch_threads_are_set_for_the_block_and_restored_even_on_error():
    torch = pytest.importorskip("torch")
    from placer.timing import torch_threads

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with torch_threads(1) as n:
            assert n == 1 and torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with torch_threads(None) as n:
        assert n == before == torch.get_num_threads()
    with pytest.raises(ValueError, match="at least 1"):
        with torch_threads(0):
            pass


def test_torch_threads_set_numba_too_when_asked():
    numba = pytest.importorskip("numba")
    pytest.importorskip("torch")
    from placer.timing import torch_threads

    before = numba.get_num_threads()
    with torch_threads(1, numba=True):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before


def test_a_clock_without_a_cpu_clock_reads_wall_time_only():
    from placer.timing import Clock

    with Clock(clock=iter([1.0, 3.0]).__next__, cpu_clock=None) as c:
        pass
    assert (c.wall, c.cpu) == (2.0, 0.0)


def test_settle_waits_out_threads_that_spin_after_their_work_and_returns_at_once_when_quiet():
    """Threads spinning after a parallel region count in the process's CPU clock: a one-thread stage
    timed just after a matrix product read 2.3 CPU seconds per wall second."""
    import threading
    import time

    from placer.timing import settle

    quiet = settle()
    assert quiet < 0.1
    stop = time.perf_counter() + 0.25

    def spin():
        while time.perf_counter() < stop:
            pass

    t = threading.Thread(target=spin)
    t.start()
    waited = settle(max_s=1.0)
    t.join()
    assert 0.15 <= waited < 0.6, waited


# The probe runs in a fresh interpreter: glibc's thresholds only ever rise, so this process's
# history (earlier tests) would decide the outcome. A thread repeats a numpy call with 10 MB
# temporaries and prints the page faults of its later calls; with a fill, the thread first leaves
# that many MB of long-lived 100 kB blocks (every other one of twice as many) in its arena's heap.
_FAULT_PROBE = """
import resource, sys, threading
import numpy as np
if sys.argv[1] == "measured":
    from placer.timing import measure
    measure(lambda: None, min_reps=1, max_time_s=0.001, warn=False)
faults = []
def crunch(x):
    for _ in range(6):
        x = np.sqrt(x * x + 1.0)
    return x
kept = []
def work():
    blocks = [np.ones(100_000 // 8) for _ in range(int(sys.argv[2]) * 20)]
    kept.extend(blocks[::2])
    del blocks
    x = np.random.default_rng(0).standard_normal((20_000, 64))
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        y = crunch(x)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        del y
t = threading.Thread(target=work)
t.start()
t.join()
print(max(faults[2:]))
"""


def _later_faults(mode: str, fill_mb: int = 0) -> int:
    # glibc's own defaults: dask's nanny puts MALLOC_TRIM_THRESHOLD_ in the environment of the process that runs
    # it (an earlier test), and a threshold set by hand turns the dynamic one off (nothing to settle then)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _FAULT_PROBE, mode, str(fill_mb)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def _glibc() -> bool:
    try:
        return "glibc" in (os.confstr("CS_GNU_LIBC_VERSION") or "")
    except (AttributeError, ValueError, OSError):
        return False


@pytest.mark.skipif(not _glibc(), reason="the mmap threshold settled here is glibc malloc's")
@pytest.mark.slow
def test_a_measurement_settles_the_allocator_so_repeated_temporaries_stop_page_faulting():
    cold = _later_faults("plain")
    if cold < 1000:
        pytest.skip(f"this allocator already reuses 10 MB blocks in a fresh process ({cold} faults a call)")
    settled = _later_faults("measured")
    assert settled < 0.05 * cold, (settled, cold)


@pytest.mark.skipif(not _glibc(), reason="the heaps kept here are glibc malloc's")
@pytest.mark.slow
def test_a_settled_thread_whose_heap_earlier_blocks_fill_still_reuses_its_temporaries():
    # 20 MB of long-lived blocks with holes: the temporaries go to a second heap, which glibc unmaps when
    # it is free, so without the top pad every call maps it again (4,272 faults a call where written)
    cold = _later_faults("plain", fill_mb=20)
    if cold < 1000:
        pytest.skip(f"this allocator already reuses 10 MB blocks in a fresh process ({cold} faults a call)")
    settled = _later_faults("measured", fill_mb=20)
    assert settled < 0.05 * cold, (settled, cold)


@pytest.mark.skipif(not _glibc(), reason="the thresholds set by hand are glibc malloc's")
@pytest.mark.parametrize("env, settles", [({"MALLOC_TOP_PAD_": "0"}, False),
                                          ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}, False),
                                          ({"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=off"}, True),
                                          ({}, True)])
@pytest.mark.slow
def test_an_allocator_set_when_the_process_started_is_left_as_it_was(env, settles):
    # dask's nanny sets MALLOC_TRIM_THRESHOLD_ in os.environ after its process started: glibc never saw it
    code = ("import os; os.environ['MALLOC_TRIM_THRESHOLD_'] = '65536'\n"
            "from placer.timing import settle_allocator; print(settle_allocator())")
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**base, **env})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == str(settles), out.stdout
