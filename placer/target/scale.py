"""Scaling CPU times measured here to a target's CPU, by ops measured on both.

May import: math, pydantic, placer.target.description. Never torch.

Both CPUs have run the same reference ops (:mod:`placer.target.ops`): this machine
in a short calibration, the target in its description. Each op measured on both
gives a ratio ``target seconds / seconds here`` at the time it took here. A small op
is dispatch-bound (the ratio is the two CPUs' per-call costs); a large one is
throughput-bound, and its ratio includes the target's extra cores. A stage that
took ``t`` seconds here is scaled by the ratios of ops that took about as long here
(a Gaussian weight in log time, :data:`WIDTH` wide): its ratio follows the ops of
its own kind of cost.

A stage measured to use one core (``threads_used``, from its CPU time over wall
time) gains nothing from the target's extra cores: its ratio is the per-core one,
the ratio of the dispatch-bound ops.

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
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from placer.target.description import CpuDescription

#: width (natural log of seconds) of the weight each calibration op gets around a stage's time
WIDTH = math.log(4.0)


class CpuScale(BaseModel):
    """Per-time ratios of a target CPU to this machine's, from ops measured on both.

    Attributes
    ----------
    pairs : list of [seconds here, ratio]
        Each op measured on both CPUs: its time here, and target / here.
    here, target : str
        The two CPUs' names (with cores), for notes.
    dispatch_ratio : float
        The ratio of the most dispatch-bound ops (the per-call, per-core ratio).
    """

    pairs: list[tuple[float, float]] = Field(min_length=1)
    here: str = ""
    target: str = ""
    target_cores: int = 1
    dispatch_ratio: float = 1.0

    @classmethod
    def between(cls, here: CpuDescription, target: CpuDescription) -> CpuScale | None:
        """The scale from ``here`` to ``target``; None when they share no op row."""
        mine = {(r.op, r.size): r.seconds for r in here.ops}
        pairs = sorted((mine[(r.op, r.size)], r.seconds / mine[(r.op, r.size)]) for r in target.ops
                       if (r.op, r.size) in mine)
        if not pairs:
            return None
        fastest = pairs[: max(1, len(pairs) // 4)]
        dispatch = math.exp(sum(math.log(r) for _, r in fastest) / len(fastest))
        return cls(pairs=pairs, here=f"{here.model} ({here.cores} cores)",
                   target=f"{target.model} ({target.cores} cores)", target_cores=target.cores,
                   dispatch_ratio=dispatch)

    def ratio(self, seconds_here: float, *, threads_used: float | None = None) -> float:
        """Target seconds per second here, for work that took ``seconds_here`` here.

        ``threads_used`` (CPU time over wall time here): near 1, the work is serial,
        and the per-core (dispatch) ratio applies at any size.
        """
        if threads_used is not None and threads_used < 1.5:
            return self.dispatch_ratio
        t = math.log(max(seconds_here, 1e-9))
        ws = [math.exp(-0.5 * ((t - math.log(h)) / WIDTH) ** 2) for h, _ in self.pairs]
        if sum(ws) < 1e-12:  # far outside the calibrated times: the nearest op's ratio
            near = min(self.pairs, key=lambda p: abs(math.log(p[0]) - t))
            return near[1]
        return math.exp(sum(w * math.log(r) for w, (_, r) in zip(ws, self.pairs)) / sum(ws))

    def seconds(self, seconds_here: float, *, threads_used: float | None = None) -> float:
        """``seconds_here`` on the target's CPU."""
        return seconds_here * self.ratio(seconds_here, threads_used=threads_used)

    def describe(self) -> str:
        """One line for notes: the two CPUs and the ratio range."""
        rs = [r for _, r in self.pairs]
        return (f"CPU times scaled from {self.here} to {self.target} by {len(rs)} ops measured on both "
                f"(ratio {min(rs):.2g}-{max(rs):.2g}; dispatch-bound {self.dispatch_ratio:.2g})")
