"""Timing: repeats, median/IQR, noise warnings, first call kept apart, blocking of fast calls."""

from __future__ import annotations

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
