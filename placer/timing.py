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

On a busy machine repeats come in stall-sized steps: most at the stage's own cost,
some delayed by a whole scheduler slice or more. :attr:`Measurement.stalled` spots
such a split (a gap in the sorted repeats that parts them into two clusters), and
:func:`measure` keeps timing a noisy or stalled measurement until its lower quartile
stops moving or the budget ends. Each measurement records the CPU time of the timed
calls (:attr:`Measurement.cpu_s`) and the load average seen (:attr:`Measurement.load`).
A ``setup`` callable gives each timed call fresh arguments, made outside the timed
region.

Examples
--------
>>> m = measure(lambda: sum(range(1000)), min_reps=5, max_time_s=0.05, warn=False)
>>> m.reps >= 5 and m.median_s > 0
True
"""

from __future__ import annotations

import os
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
#: a gap in the sorted repeats wider than this fraction of the fastest one splits them
STALL_GAP = 0.25
#: the lower quartile counts as settled when more repeats move it by less than this
SETTLED = 0.05


def load_average() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


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
    #: process CPU seconds per call over the timed blocks (all threads)
    cpu_s: float | None = None
    #: the 1-minute load average when timing ended
    load: float | None = None

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

    @property
    def stalled(self) -> bool:
        """The repeats split into two clusters: some were delayed by whole stalls."""
        return stall_split(self.raw_times) is not None

    @property
    def single_repeat(self) -> bool:
        """Timed once: its spread, and so its error, is unknown."""
        return self.reps == 1

    @property
    def low_s(self) -> float:
        """The lower quartile of the repeats (the stage's own cost on a busy machine)."""
        if len(self.raw_times) < 3:
            return self.median_s
        return float(min(np.percentile(self.raw_times, 25), self.median_s))

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


def stall_split(times: list[float]) -> int | None:
    """Where sorted ``times`` split into a fast cluster and a stalled one, or None.

    A split is a gap between consecutive sorted repeats wider than :data:`STALL_GAP`
    of the fastest repeat and than three times the spread inside the fast cluster,
    with at least two repeats below it. Returns the number of repeats in the fast
    cluster.

    >>> stall_split([1.0, 1.01, 1.02, 1.0, 5.0, 5.1])
    4
    >>> stall_split([1.0, 1.01, 1.02, 1.03]) is None
    True
    """
    t = np.sort(np.asarray(times, dtype=float))
    if len(t) < 3 or t[0] <= 0:
        return None
    gaps = np.diff(t)
    for i in np.argsort(gaps)[::-1][:3]:
        k = int(i) + 1  # repeats below the gap
        if k < 2:
            continue
        inside = t[k - 1] - t[0]
        if gaps[i] > STALL_GAP * t[0] and gaps[i] > 3.0 * inside:
            return k
    return None


def _settled(raw: list[float], min_reps: int) -> bool:
    """Quiet repeats, or a lower quartile that more repeats no longer move."""
    if len(raw) < min_reps:
        return False
    arr = np.asarray(raw)
    med = float(np.median(arr))
    q1, q3 = np.percentile(arr, [25, 75])
    if (med <= 0 or (q3 - q1) / med <= NOISE_THRESHOLD) and stall_split(raw) is None:
        return True
    if len(raw) < max(6, min_reps):
        return False
    early = float(np.percentile(arr[: len(arr) * 2 // 3], 25))
    return abs(q1 - early) <= SETTLED * max(q1, 1e-12)


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
    setup: Callable[[], Any] | None = None,
    cpu_clock: Callable[[], float] = time.process_time,
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
    setup : callable, optional
        Makes fresh arguments for one call, outside the timed region: ``fn`` is then
        called as ``fn(setup())`` (for stages that mutate or consume their inputs).
    cpu_clock : callable
        Process CPU seconds (all threads), read around the timed blocks.

    A measurement that is noisy or stalled (see :attr:`Measurement.stalled`) keeps
    being timed, within ``max_reps`` and ``max_time_s``, until its lower quartile
    settles.

    Returns
    -------
    Measurement
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")
    sync = sync or _noop
    call = fn if setup is None else (lambda: fn(setup()))
    first = None
    one = None
    if cold:
        t0 = clock()
        call()
        sync()
        first = clock() - t0
        one = first
    for _ in range(warmup if (one is None or one < max_time_s) else 0):
        t0 = clock()
        call()
        sync()
        one = clock() - t0
    if after_warmup is not None:
        after_warmup()
    if one is None:  # neither cold nor warm-up: time one call to size the blocks
        t0 = clock()
        call()
        sync()
        one = clock() - t0
    number = max(1, min(1000, int(BLOCK_TARGET_S / max(one, 1e-9)))) if one < BLOCK_TARGET_S else 1
    raw: list[float] = []
    spent = cpu = 0.0
    while len(raw) < max_reps:
        args = None if setup is None else [setup() for _ in range(number)]
        c0 = cpu_clock()
        t0 = clock()
        if args is None:
            for _ in range(number):
                fn()
        else:
            for a in args:
                fn(a)
        sync()
        dt = clock() - t0
        cpu += cpu_clock() - c0
        raw.append(dt / number)
        spent += dt
        if spent >= max_time_s and (len(raw) >= min_reps or dt >= max_time_s):
            break
        if len(raw) >= min_reps and spent >= min_time_s and _settled(raw, min_reps):
            break
    m = Measurement(raw_times=raw, number_per_run=number, first_call_s=first, label=label,
                    cpu_s=max(cpu, 0.0) / (len(raw) * number), load=load_average())
    if warn:
        m.warn_if_noisy()
    return m
