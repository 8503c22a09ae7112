"""Timing a callable: repeats, median and IQR, and the first call kept apart.

May import: numpy, pydantic, placer.errors, placer.warnings; torch and numba only inside
:func:`torch_threads`. Device synchronisation is passed in as a callable.

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

Work that cannot be called in isolation (a stream's batches, a DataLoader's fetches)
is timed where it runs: :class:`Clock` reads the wall and CPU seconds of a block,
:class:`Timings` keeps every reading under a key, and :func:`per_batch` makes the
readings one :class:`Measurement` (the first batch apart, as a cold call).
:class:`Deadline` is a time budget: when it ends and what is left.
:func:`torch_threads` sets torch's intra-op threads for a block and restores them.

Before the first reading, :func:`settle_allocator` puts glibc's malloc in the state
a long-running process reaches: without it, a stage whose temporaries are a few MB
can page-fault them afresh on every call in one thread and not in another (its
time moved 1.5-1.7x with the process's history alone), so a profile could read one
state and the run meet the other.

Examples
--------
>>> m = measure(lambda: sum(range(1000)), min_reps=5, max_time_s=0.05, warn=False)
>>> m.reps >= 5 and m.median_s > 0
True
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Hashable, Iterator
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
#: a jump between neighbouring sorted rates at least this large splits a setting's runs into two speeds
MODE_GAP = 0.3
#: the lower quartile counts as settled when more repeats move it by less than this
SETTLED = 0.05


def sign_tail(wins: int, rounds: int) -> float:
    """The chance that a setting no faster than another wins at least ``wins`` of ``rounds`` interleaved
    rounds against it (a one-sided sign test): 3 of 3 is 1/8, 6 of 7 1/16, 3 of 5 1/2."""
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2 ** rounds


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
    def lower_quartile_s(self) -> float:
        """The repeat at the lower quartile (nearest rank, rounding down): a time that was measured;
        noise only adds time, so it is the stage's own cost where most repeats were disturbed."""
        xs = sorted(self.raw_times)
        return xs[(len(xs) - 1) // 4]

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


#: glibc's largest dynamic mmap threshold (32 MiB on 64-bit), less room for the block's header
SETTLE_BYTES = 31 << 20
#: what glibc keeps free at the top of each heap once settled: a heap whose blocks were all freed stays
SETTLE_PAD = SETTLE_BYTES
#: mallopt's parameter for the top pad (malloc.h)
M_TOP_PAD = -2
#: the environment variables that set glibc malloc's thresholds when a process starts (the last one
#: where it names a ``glibc.malloc.`` tunable)
MALLOC_BY_HAND = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
_settled_allocator = False


def settle_allocator() -> bool:
    """Put glibc malloc in a long-running process's state once per process; True when it was done now.

    glibc maps every block at or above its mmap threshold fresh and unmaps it when freed; the
    threshold starts at 128 KiB and rises to the size of a mapped block freed later, up to
    32 MiB, which a long-running process reaches sooner or later. Until then a stage that
    allocates temporaries of a few MB pays page faults for all of them on every call in some
    threads and not in others: on a 2-core VM a numpy stage with 10 MB temporaries took 13 ms
    a call in one state and 19-22 ms in the other (1,847 page faults a call), and which state a
    profile met depended on what the process had freed before. Freeing one mapped block of
    :data:`SETTLE_BYTES` puts the process in the settled state up front (blocks up to that size
    are then reused, not mapped afresh), so the profile and the run meet the same allocator.

    A thread's blocks below the threshold come from its arena's heaps, and glibc unmaps a whole
    heap as soon as it is free: a thread whose arena's first heap is filled by long-lived blocks
    (what earlier threads left) puts its temporaries in a second heap, mapped and unmapped on every
    call (thousands of page faults a call, about twice the time). A top pad of
    :data:`SETTLE_PAD` (``mallopt(M_TOP_PAD)``) keeps such a heap, so every thread reuses its
    temporaries as the settled main heap does; an arena keeps up to that much free memory more.

    No-op off glibc, after the first call, or where the process started with the allocator set by
    hand (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` as dask's nanny sets,
    ``MALLOC_TOP_PAD_``, ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``: glibc then keeps its thresholds
    fixed, and they are the user's choice).
    """
    global _settled_allocator
    if _settled_allocator or not sys.platform.startswith("linux"):
        return False
    _settled_allocator = True
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl and others map differently
            return False
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        if _allocator_set_by_hand():
            return False
        block = libc.malloc(SETTLE_BYTES)  # mapped, never touched: costs no memory
        if block:
            libc.free(block)
            libc.mallopt(M_TOP_PAD, SETTLE_PAD)
        return bool(block)
    except (OSError, AttributeError):
        return False


def _allocator_set_by_hand() -> bool:
    """Whether this process started with glibc malloc's thresholds set (the environment it started
    with, not ``os.environ``: dask's nanny sets ``MALLOC_TRIM_THRESHOLD_`` there for its workers)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            env = dict(item.decode(errors="replace").partition("=")[::2] for item in f.read().split(b"\0") if item)
    except OSError:
        return False
    return any(n in env for n in MALLOC_BY_HAND[:-1]) or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")


def leave_allocator() -> None:
    """Keep :func:`settle_allocator` from acting in this process: its runs meet the allocator as a fresh
    script does (the drop-in's runs in fresh processes, :mod:`placer.stream.fresh`)."""
    global _settled_allocator
    _settled_allocator = True


@contextlib.contextmanager
def allocator_as_is() -> Iterator[None]:
    """Keep :func:`settle_allocator` from acting for the block, and only for it.

    For placer's measurements in the user's own process (the drop-in's): the user's script runs on in that
    process after the advice, and settling it would change the script's allocator for good (fixed
    thresholds, up to :data:`SETTLE_PAD` more kept per arena) and measure the in-process work (the step
    alone, a cache's passes) in a state the script's own loop does not start in. A later call outside the
    block settles as before (placer's own executor, profiles). The heap the advice's own work leaves still
    makes the loop after it faster than a fresh script with the same settings (by about a seventh where it
    was measured).
    """
    global _settled_allocator
    before = _settled_allocator
    _settled_allocator = True
    try:
        yield
    finally:
        _settled_allocator = before


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


def two_speeds(rates: list[float], least: int = 2) -> tuple[list[float], list[float]] | None:
    """``rates`` (runs of one setting) split into a slow and a fast group, each sorted, or None.

    Some machines run the same process at two speeds for seconds at a time (rates near two values,
    nothing between): a
    median of such runs depends on the mix. The split is the largest jump between neighbouring
    sorted rates, when the faster side starts :data:`MODE_GAP` above the slower side's fastest and
    each side has at least ``least`` runs.

    >>> two_speeds([4890, 4926, 8082, 7133, 7751, 8219, 4956])
    ([4890.0, 4926.0, 4956.0], [7133.0, 7751.0, 8082.0, 8219.0])
    >>> two_speeds([4890, 5400, 6100, 6800, 7500]) is None
    True
    """
    r = sorted(float(x) for x in rates if x > 0)
    if len(r) < 2 * least:
        return None
    k = max(range(least, len(r) - least + 1), key=lambda i: r[i] / r[i - 1])
    return (r[:k], r[k:]) if r[k] >= r[k - 1] * (1 + MODE_GAP) else None


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
    settle_allocator()
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


class Clock:
    """Wall and process CPU seconds of a ``with`` block (``wall``, ``cpu``: never negative).

    ``cpu_clock=None`` reads the wall clock only: reading the process's CPU time sums over its
    threads, which disturbs a measurement of how threads share the GIL. ``settle=False`` leaves the
    allocator as it is (a clock in the user's own loop: :class:`placer.stream.dropin.MeasuredLoader`).

    >>> with Clock() as c:
    ...     _ = sum(range(1000))
    >>> c.wall > 0 and c.cpu >= 0
    True
    """

    wall: float = 0.0
    cpu: float = 0.0

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] | None = time.process_time, *, settle: bool = True):
        if settle:
            settle_allocator()
        self.clock, self.cpu_clock = clock, cpu_clock

    def __enter__(self) -> Clock:
        self._w = self.clock()
        self._c = self.cpu_clock() if self.cpu_clock is not None else 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = self.clock() - self._w
        if self.cpu_clock is not None:
            self.cpu = max(0.0, self.cpu_clock() - self._c)

    def elapsed(self) -> float:
        """Wall seconds since the block started (inside it)."""
        return self.clock() - self._w


def settle(max_s: float = 0.5, window_s: float = 0.01, busy: float = 0.2) -> float:
    """Wait while this process burns CPU with the caller asleep; the seconds waited.

    After a parallel region its threads spin-wait for a while (OpenBLAS, OpenMP): the process's
    CPU clock then counts their spinning into whatever is timed next, and a one-thread Python
    stage timed just after a matrix product read 2.3 CPU seconds per wall second. Windows of
    ``window_s`` are slept until the process used less than ``busy`` of a core in one, at most
    ``max_s`` in all.
    """
    t0 = time.perf_counter()
    while True:
        c, w = time.process_time(), time.perf_counter()
        time.sleep(window_s)
        used = (time.process_time() - c) / max(time.perf_counter() - w, 1e-9)
        if used < busy or time.perf_counter() - t0 >= max_s:
            return time.perf_counter() - t0


class Deadline:
    """Where a time budget started and ends: ``passed()``, ``left()``, ``spent()``. No budget (None)
    never passes.

    >>> d = Deadline(None)
    >>> d.passed(), d.left()
    (False, inf)
    >>> Deadline(10.0).left() > 9.0
    True
    """

    def __init__(self, budget_s: float | None, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.end = float("inf") if budget_s is None else self.start + budget_s

    def passed(self) -> bool:
        return self.clock() > self.end

    def left(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.end - self.clock())

    def spent(self) -> float:
        """Seconds since the budget started."""
        return self.clock() - self.start


def per_batch(samples: list[float], label: str = "") -> Measurement:
    """Per-batch seconds as one :class:`Measurement`: with three or more batches the first (warm-up)
    is its ``first_call_s`` and the rest its repeats; with fewer, the last batch alone.

    >>> m = per_batch([0.5, 0.1, 0.12, 0.11, 0.3])
    >>> m.first_call_s, m.reps, m.lower_quartile_s
    (0.5, 4, 0.1)
    """
    if not samples:
        raise ValueError(f"{label or 'per_batch'}: no batch was timed")
    if len(samples) >= 3:
        return Measurement(raw_times=list(samples[1:]), first_call_s=samples[0], label=label)
    return Measurement(raw_times=[samples[-1]], label=label)


class Timings:
    """Readings of :class:`Clock` kept under keys (a stage, a copy and its way): every repeat kept.

    >>> t = Timings()
    >>> for _ in range(3):
    ...     with Clock() as c:
    ...         pass
    ...     t.add("a", c)
    >>> "a" in t, t.wall("a").reps, len(t.cpu_s["a"])
    (True, 2, 3)
    """

    def __init__(self) -> None:
        self.wall_s: dict[Hashable, list[float]] = {}
        self.cpu_s: dict[Hashable, list[float]] = {}

    def add(self, key: Hashable, clock: Clock) -> None:
        self.add_seconds(key, clock.wall, clock.cpu)

    def add_seconds(self, key: Hashable, wall: float, cpu: float | None = None) -> None:
        self.wall_s.setdefault(key, []).append(wall)
        if cpu is not None:
            self.cpu_s.setdefault(key, []).append(max(0.0, cpu))

    def __contains__(self, key: Hashable) -> bool:
        return key in self.wall_s

    def keys(self) -> list[Hashable]:
        return list(self.wall_s)

    def wall(self, key: Hashable) -> Measurement:
        """The wall seconds of ``key`` per batch (:func:`per_batch`)."""
        return per_batch(self.wall_s[key], label=f"{key} (wall)")

    def cpu(self, key: Hashable) -> Measurement:
        """The CPU seconds of ``key`` per batch (:func:`per_batch`)."""
        return per_batch(self.cpu_s[key], label=f"{key} (CPU)")


@contextlib.contextmanager
def torch_threads(n: int | None, *, numba: bool = False) -> Iterator[int | None]:
    """torch's intra-op threads set to ``n`` for the block and restored after it (and numba's, capped
    at its maximum, with ``numba=True`` where numba is installed). ``n=None`` leaves them as they are;
    without torch loaded (and ``n`` given) torch is imported. Yields the count in force.

    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with torch_threads(1) as n:
    ...     n, torch.get_num_threads()
    (1, 1)
    >>> torch.get_num_threads() == before
    True
    """
    if n is None:
        torch = sys.modules.get("torch")
        yield torch.get_num_threads() if torch is not None else None
        return
    if n < 1:
        raise ValueError(f"torch threads must be at least 1, got {n}")
    import torch

    before = torch.get_num_threads()
    nb_before = None
    if numba:
        try:
            import numba as nb

            nb_before = nb.get_num_threads()
            nb.set_num_threads(min(n, nb.config.NUMBA_NUM_THREADS))
        except Exception:  # noqa: BLE001 - numba is optional
            nb_before = None
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
        if nb_before is not None:
            import numba as nb

            nb.set_num_threads(nb_before)
