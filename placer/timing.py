"""Timing a callable: repeats, median and IQR, and the first call kept apart.

May import: numpy, pydantic, placer.errors, placer.warnings. Device synchronisation is passed in as a
callable, so this module never imports torch or numba itself.

A measurement is a set of repeats, never one number. :func:`measure` runs the
callable once cold (its time is :attr:`Measurement.first_call_s`: JIT compilation,
CUDA context creation, cuDNN autotuning land there), warms it up, then times
repeats until it has enough for a stable median or its time budget is spent.
Calls much shorter than a millisecond are timed in blocks of several calls (as
``torch.utils.benchmark`` does), so that the clock's own cost does not dominate;
each raw time is then the block's time divided by its number of calls. The device
is synchronised inside the timed region.

Examples
--------
>>> m = measure(lambda: sum(range(1000)), min_reps=5, max_time_s=0.05, warn=False)
>>> m.reps >= 5 and m.median_s > 0
True
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from placer.warnings import NoisyMeasurementWarning

#: IQR/median above which a measurement is called noisy (as torch.utils.benchmark)
NOISE_THRESHOLD = 0.1
#: calls faster than this are timed in blocks of several calls
BLOCK_TARGET_S = 1e-3


class Measurement(BaseModel):
    """The repeated timings of one callable.

    Attributes
    ----------
    raw_times : list of float
        Seconds per call, one entry per timed block (see ``number_per_run``).
    number_per_run : int
        Calls per timed block; each raw time is already divided by it.
    first_call_s : float or None
        The first (cold) call, measured apart from the steady state.
    label : str
        What was measured, for messages.
    """

    raw_times: list[float] = Field(min_length=1)
    number_per_run: int = 1
    first_call_s: float | None = None
    label: str = ""

    @property
    def reps(self) -> int:
        """Number of timed blocks."""
        return len(self.raw_times)

    @property
    def median_s(self) -> float:
        return float(np.median(self.raw_times))

    @property
    def iqr_s(self) -> float:
        q1, q3 = np.percentile(self.raw_times, [25, 75])
        return float(q3 - q1)

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.raw_times))

    @property
    def noisy(self) -> bool:
        """IQR/median above :data:`NOISE_THRESHOLD`."""
        med = self.median_s
        return med > 0 and self.iqr_s / med > NOISE_THRESHOLD

    def warn_if_noisy(self) -> bool:
        """Issue a :class:`NoisyMeasurementWarning` when noisy; return whether it was."""
        if self.noisy:
            warnings.warn(
                f"{self.label or 'measurement'}: IQR is {self.iqr_s / self.median_s:.0%} of the "
                f"median ({self.median_s:.3g} s over {self.reps} repeats); close other work on "
                "this machine or give it a larger time budget",
                NoisyMeasurementWarning,
                stacklevel=3,
            )
            return True
        return False

    def __str__(self) -> str:
        return (
            f"{self.label or 'measurement'}: median {self.median_s:.4g} s, "
            f"IQR {self.iqr_s:.2g} s, {self.reps} x {self.number_per_run} calls"
            + (f", first call {self.first_call_s:.4g} s" if self.first_call_s is not None else "")
        )


def _noop() -> None:
    return None


def measure(
    fn: Callable[[], Any],
    *,
    sync: Callable[[], Any] | None = None,
    warmup: int = 1,
    min_reps: int = 3,
    max_reps: int = 50,
    min_time_s: float = 0.05,
    max_time_s: float = 1.0,
    cold: bool = True,
    label: str = "",
    warn: bool = True,
    after_warmup: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Time ``fn`` repeatedly.

    Parameters
    ----------
    fn : callable
        Called with no arguments. Its result is discarded.
    sync : callable, optional
        Waits for the device to finish; called inside the timed region after each
        timed block (and after the cold call).
    warmup : int
        Untimed calls after the cold one.
    min_reps, max_reps : int
        Bounds on the number of timed blocks.
    min_time_s : float
        Keep timing until this much timed work has accumulated (and ``min_reps``).
    max_time_s : float
        Stop once this much time was spent in timed blocks, after at least ``min_reps``
        blocks, or after one block when a single call exceeds it.
    cold : bool
        Time the first call separately as ``first_call_s``.
    label : str
        Names the measurement in warnings.
    warn : bool
        Warn when the result is noisy (IQR/median > 0.1).
    after_warmup : callable, optional
        Called once after warm-up, outside any timed region (for example to reset
        peak-memory counters).
    clock : callable
        Seconds, monotonic.

    Returns
    -------
    Measurement
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")
    sync = sync or _noop
    first = None
    one = None
    if cold:
        t0 = clock()
        fn()
        sync()
        first = clock() - t0
        one = first
    for _ in range(warmup if (one is None or one < max_time_s) else 0):
        t0 = clock()
        fn()
        sync()
        one = clock() - t0
    if after_warmup is not None:
        after_warmup()
    if one is None:  # neither cold nor warm-up: time one call to size the blocks
        t0 = clock()
        fn()
        sync()
        one = clock() - t0
    number = max(1, min(1000, int(BLOCK_TARGET_S / max(one, 1e-9)))) if one < BLOCK_TARGET_S else 1
    raw: list[float] = []
    spent = 0.0
    while len(raw) < max_reps:
        t0 = clock()
        for _ in range(number):
            fn()
        sync()
        dt = clock() - t0
        raw.append(dt / number)
        spent += dt
        if len(raw) >= min_reps and spent >= min_time_s:
            break
        if spent >= max_time_s and (len(raw) >= min_reps or dt >= max_time_s):
            break
    m = Measurement(raw_times=raw, number_per_run=number, first_call_s=first, label=label)
    if warn:
        m.warn_if_noisy()
    return m
