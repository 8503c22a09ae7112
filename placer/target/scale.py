"""Scaling CPU times measured here to a target's CPU, by ops measured on both.

May import: math, pydantic, placer.target.description. Never torch.

Both CPUs have run the same reference ops (:mod:`placer.target.ops`): this machine
in a short calibration, the target in its description. Each op measured on both
gives a ratio ``target seconds / one core's seconds here``. The ratio depends on
the kind of work, which two measures of it tell apart:

- seconds per operation issued (one core's CPU time over the counted ops): near
  the per-call dispatch cost the work is dispatch-bound and its ratio is the two
  CPUs' per-call costs; far above it, an op's work is split over the target's
  threads and the ratio includes its extra cores;
- bytes per operation: torch splits an op over threads only above a grain of
  elements, and memory-bound and compute-bound ops gain differently from cores.

A stage is scaled by the ratios of the calibration ops closest to it in both
(Gaussian weights in log seconds per op and log bytes per op, their widths those
of :data:`WIDTHS` that best predict each calibration op from the others); without
counted ops, by the ops that took about as long.

Times here are first made one core's work: a stage measured at ``threads`` threads
that kept ``threads_used`` of them busy (its CPU time over its wall time) did
``seconds * threads_used`` of work, of which the part run on one thread is serial.
Serial work gains nothing from the target's extra cores: it is scaled by the
per-core ratio, that of the most dispatch-bound ops (:attr:`CpuScale.dispatch_ratio`).

Examples
--------
>>> from placer.target.description import CpuDescription, OpRow
>>> here = CpuDescription(model="laptop", cores=2, ops=[OpRow(op="a", size=1, seconds=1e-5),
...                                                      OpRow(op="b", size=1, seconds=1e-2)])
>>> there = CpuDescription(model="server", cores=16, ops=[OpRow(op="a", size=1, seconds=8e-6),
...                                                        OpRow(op="b", size=1, seconds=2e-3)])
>>> s = CpuScale.between(here, there)
>>> round(s.ratio(1e-5), 2), round(s.ratio(1e-2), 2)
(0.8, 0.2)
>>> round(s.ratio(1e-2, threads_used=1.0, threads=2), 2)  # serial at two threads: the per-core ratio
0.8
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from placer.target.description import CpuDescription, OpRow

#: width (natural log of seconds per op) of the weight each calibration op gets around a stage,
#: unless chosen from :data:`WIDTHS` by leave-one-out
WIDTH = math.log(3.0)
#: width (natural log of bytes per op) of the same weight, where both sides have counted bytes
BYTES_WIDTH = math.log(2.0)
#: candidate (seconds, bytes) widths: :meth:`CpuScale.between` keeps the pair that predicts each
#: calibration op best from the others (leave-one-out)
WIDTHS = tuple((math.log(a), math.log(b)) for a in (1.5, 2.0, 3.0, 4.0, 8.0) for b in (1.5, 2.0, 3.0, 4.0, 8.0))


class ScalePoint(BaseModel):
    """One op measured on both CPUs.

    Attributes
    ----------
    seconds : float
        One core's seconds of the op here (its time times the threads it kept busy).
    ratio : float
        Target seconds over ``seconds``.
    ops : int or None
        Operations the op issues (None when not counted).
    bytes : float or None
        Bytes it moves (None when not counted).
    """

    seconds: float = Field(gt=0)
    ratio: float = Field(gt=0)
    ops: int | None = Field(None, ge=1)
    bytes: float | None = Field(None, gt=0)


def _work(row: OpRow, threads: int) -> float:
    """One core's seconds of a calibration row (its time times the threads it kept busy)."""
    used = row.threads_used if row.threads_used is not None else 1.0
    return row.seconds * min(max(used, 1.0), float(max(row.threads or threads, 1)))


class CpuScale(BaseModel):
    """Ratios of a target CPU's times to this machine's, from ops measured on both.

    Attributes
    ----------
    points : list of ScalePoint
        Each op measured on both CPUs, sorted by one core's seconds here.
    here, target : str
        The two CPUs' names (with cores), for notes.
    target_cores : int
    here_threads : int
        Intra-op threads of this machine's measurements (by default).
    dispatch_ratio : float
        The ratio of the most dispatch-bound ops (the per-call, per-core ratio): serial work's.
    target_dispatch_s : float or None
        The target's own cost of one tiny op, where its description measured it: what a
        GPU run there pays per op issued (:meth:`host_seconds`).
    python_ratio : float
        The target's Python over this machine's (both CPUs' ``python_s``), 1.0 where
        either was not measured.
    width, bytes_width : float
        The weights' widths (natural log of seconds per op, of bytes per op).
    """

    points: list[ScalePoint] = Field(min_length=1)
    here: str = ""
    target: str = ""
    target_cores: int = 1
    here_threads: int = 1
    dispatch_ratio: float = 1.0
    target_dispatch_s: float | None = None
    python_ratio: float = 1.0
    width: float = WIDTH
    bytes_width: float = BYTES_WIDTH

    @classmethod
    def between(cls, here: CpuDescription, target: CpuDescription) -> CpuScale | None:
        """The scale from ``here`` to ``target``; None when they share no op row."""
        threads = here.threads or here.cores
        mine = {(r.op, r.size): r for r in here.ops}
        points = []
        for r in target.ops:
            h = mine.get((r.op, r.size))
            if h is None:
                continue
            w = _work(h, threads)
            points.append(ScalePoint(seconds=w, ratio=r.seconds / w, ops=h.ops, bytes=h.bytes))
        if not points:
            return None
        points.sort(key=lambda p: p.seconds / (p.ops or 1))
        fastest = points[: max(1, len(points) // 4)]
        dispatch = math.exp(sum(math.log(p.ratio) for p in fastest) / len(fastest))
        python = target.python_s / here.python_s if target.python_s and here.python_s else 1.0
        scale = cls(points=points, here=f"{here.model} ({here.cores} cores)",
                    target=f"{target.model} ({target.cores} cores)", target_cores=target.cores,
                    here_threads=threads, dispatch_ratio=dispatch, target_dispatch_s=target.dispatch_s,
                    python_ratio=python)
        return scale.with_widths_chosen()

    def loo_error(self) -> float:
        """Sum over the calibration ops of the squared log error of each one's ratio
        predicted from the others (0 with fewer than three ops)."""
        return _loo(self._coords(), self.width, self.bytes_width)

    def with_widths_chosen(self) -> CpuScale:
        """This scale with the widths of :data:`WIDTHS` that predict its calibration ops best
        from each other (itself when there are too few ops to tell)."""
        if len(self.points) < 6:
            return self
        coords = self._coords()
        a, b = min(WIDTHS, key=lambda w: _loo(coords, *w))
        return self.model_copy(update={"width": a, "bytes_width": b})

    def work_ratio(self, work_s: float, *, ops: int | None = None, bytes: float | None = None) -> float:
        """Target seconds per second of one core's work here, for parallelisable work.

        ``ops`` (operations issued) and ``bytes`` (moved), when counted, place the
        work among the calibration ops by seconds per op and bytes per op; without
        them (or when a calibration op was not counted), by its total seconds.
        """
        return _weighted(self._coords(), _query(work_s, ops, bytes, self._counted()), self.width,
                         self.bytes_width)

    def _counted(self) -> bool:
        return all(p.ops is not None for p in self.points)

    def _coords(self) -> list[tuple[float, float | None, float]]:
        """Each calibration op as (log seconds [per op], log bytes per op or None, log ratio)."""
        per = self._counted()
        return [(math.log(p.seconds / (p.ops if per else 1)),
                 math.log(p.bytes / p.ops) if per and p.bytes is not None else None, math.log(p.ratio))
                for p in self.points]

    def ratio(self, seconds_here: float, *, threads_used: float | None = None, threads: int | None = None,
              ops: int | None = None, bytes: float | None = None, work_share: float | None = None) -> float:
        """Target seconds per second here, for work that took ``seconds_here`` (wall) here.

        Parameters
        ----------
        seconds_here : float
            The wall time here.
        threads_used : float, optional
            CPU time over wall time of that measurement. Without it the time is taken
            as one core's work.
        threads : int, optional
            Intra-op threads it was measured with (default :attr:`here_threads`): of
            the wall time, the fraction ``(threads_used - 1) / (threads - 1)`` ran on
            every thread, the rest on one (serial: scaled by :attr:`dispatch_ratio`).
        ops, bytes : optional
            The work's counted operations and bytes (see :meth:`work_ratio`).
        work_share : float, optional
            The share of the measurement's thread-seconds (the wall time times the threads
            it kept busy, one without ``threads_used``) that was work: one core's CPU time
            at one thread over them, at most 1 with ``threads_used``. Below 1 the threads
            waited for cores or spun at a pool's barrier; the work, serial and parallel
            parts alike, is then that share of it. Without ``threads_used`` it may exceed 1:
            one core's work over the wall time of a measurement whose threads worked in
            parallel.

        Examples
        --------
        A measurement whose wall time was four times one core's work scales as that work:

        >>> from placer.target.scale import CpuScale, ScalePoint
        >>> s = CpuScale(points=[ScalePoint(seconds=1.0, ratio=0.5)], dispatch_ratio=0.5)
        >>> s.ratio(4.0), s.ratio(4.0, work_share=0.25)
        (0.5, 0.125)
        """
        t = max(seconds_here, 1e-12)
        share = max(work_share, 1e-9) if work_share is not None else 1.0
        if threads_used is None:
            return self.work_ratio(t * share, ops=ops, bytes=bytes) * share
        share = min(share, 1.0)
        n = max(threads or self.here_threads, 1)
        used = min(max(threads_used, 1.0), float(n))
        par = (used - 1.0) / (n - 1.0) if n > 1 else 1.0  # fraction of the wall time on every thread
        work = t * used * share
        if par <= 0.0:  # one thread busy at several: serial work
            return self.dispatch_ratio * share
        parallel = self.work_ratio(work, ops=ops, bytes=bytes) * t * par * n * share
        return (self.dispatch_ratio * t * (1.0 - par) * share + parallel) / t

    def seconds(self, seconds_here: float, **kw) -> float:
        """``seconds_here`` on the target's CPU (keywords as :meth:`ratio`)."""
        return seconds_here * self.ratio(seconds_here, **kw)

    def host_seconds(self, dispatches: float, outside_s: float, here_dispatch_s: float | None) -> float:
        """The host time a GPU run on the target pays for ``dispatches`` ops issued and
        ``outside_s`` of this machine's time outside torch ops.

        Each op costs the target's own tiny-op cost where its description measured it
        (else this machine's, ``here_dispatch_s``, times :attr:`dispatch_ratio`); the
        Python between ops is scaled by :attr:`python_ratio`. The two are priced apart
        because they do not move together from one CPU to another: two 2-core VMs whose
        tiny ops cost 5.1 and 1.9 us read the same 0.57-0.58 ms outside ops for the
        reference's CIFAR train step at batch 4-8, where a per-op ratio scaled that time
        by 1.3x on one and 2.2x on the other.

        >>> s = CpuScale(points=[ScalePoint(seconds=1.0, ratio=2.0)], dispatch_ratio=2.0, target_dispatch_s=5e-6)
        >>> round(s.host_seconds(100, 1e-3, here_dispatch_s=2e-6) * 1e3, 3)  # 100 x 5 us + 1 ms
        1.5
        """
        per_op = self.target_dispatch_s or (here_dispatch_s or 0.0) * self.dispatch_ratio
        return dispatches * per_op + outside_s * self.python_ratio

    def describe(self) -> str:
        """One line for notes: the two CPUs and the ratio range."""
        rs = [p.ratio for p in self.points]
        return (f"CPU times scaled from {self.here} to {self.target} by {len(rs)} ops measured on both "
                f"(ratio {min(rs):.2g}-{max(rs):.2g} per core-second; serial {self.dispatch_ratio:.2g}; ops of "
                f"similar cost within {math.exp(self.width):.3g}x seconds and {math.exp(self.bytes_width):.3g}x bytes "
                "per op)")


def _query(work_s: float, ops: int | None, bytes: float | None, counted: bool) -> tuple[float, float | None]:
    """A stage's coordinates: log seconds (per op, when both sides count ops), log bytes per op."""
    if ops is None or not counted:
        return math.log(max(work_s, 1e-12)), None
    per_b = math.log(bytes / max(ops, 1)) if bytes is not None and bytes > 0 else None
    return math.log(max(work_s / max(ops, 1), 1e-12)), per_b


def _weighted(coords, q, width: float, bytes_width: float) -> float:
    """The Gaussian-weighted geometric mean ratio of ``coords`` around ``q`` (nearest op's when far)."""
    z2 = []
    for t, b, _ in coords:
        z = ((q[0] - t) / width) ** 2
        if q[1] is not None and b is not None:
            z += ((q[1] - b) / bytes_width) ** 2
        z2.append(z)
    ws = [math.exp(-0.5 * z) for z in z2]
    if sum(ws) < 1e-12:  # far outside the calibrated ops: the nearest op's ratio
        return math.exp(coords[min(range(len(z2)), key=z2.__getitem__)][2])
    return math.exp(sum(w * c[2] for w, c in zip(ws, coords)) / sum(ws))


def _loo(coords, width: float, bytes_width: float) -> float:
    """Sum of squared log errors of each op's ratio predicted from the others."""
    if len(coords) < 3:
        return 0.0
    return sum((math.log(_weighted(coords[:i] + coords[i + 1:], c[:2], width, bytes_width)) - c[2]) ** 2
               for i, c in enumerate(coords))
