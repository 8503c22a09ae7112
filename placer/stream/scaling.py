"""How a stage's rate scales with workers (threads, processes) and whether it holds the GIL, measured here.

May import: placer.data.stream, placer.executor.stream.{nodes,workers}, placer.log, placer.timing.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Any


from placer.data.stream import ScalingRow
from placer.log import get_logger
from placer.timing import Clock, Deadline, torch_threads
from placer.executor.stream.nodes import Bundle, Node, takes


log = get_logger(__name__)


#: thread counts tried for CPU stages (up to the cores' double, at least four)
THREADS = (1, 2, 4, 8)
#: further rounds of one and two workers in turn, after the counts' sweep (see :func:`_scaling`)
PAIR_ROUNDS = 2


def thread_scaling(node: Node, inputs: list[Bundle], *, max_threads: int, budget_s: float | None,
                   kind: str = "thread") -> list[ScalingRow]:
    """Batches per second of ``node`` on 1, 2, 4, ... threads at once, over the batches it saw.

    Each count runs for a slice of the budget (at least six batches' time of one
    worker); counts stop rising once doubling the threads adds under 10 %. One worker
    runs first and again after the others, and one and two in turn (:func:`_scaling`); the
    fastest reading of one worker is the base of the speed-ups.
    """
    counts = [n for n in THREADS if n <= max_threads]
    return _scaling([node.process] * counts[-1], inputs, counts, budget_s, kind)


def _scaling(calls: list, inputs: list[Bundle], counts: list[int], budget_s: float | None,
             kind: str) -> list[ScalingRow]:
    """Rows of batches per second with the first ``n`` of ``calls`` running at once, ``n`` in ``counts``.

    Each count's rate is the fastest of its readings (noise only slows). One worker runs again after
    the others, and one and two workers :data:`PAIR_ROUNDS` more times in turn: the two decide whether
    a stage holds the GIL (:data:`~placer.data.stream.GIL_SPEEDUP`), and a reading of one worker slowed
    by load that came and went would read a pure-Python stage 1.32x faster at two.
    """
    one = _rate(calls[:1], inputs, 0.05)
    per = max(6.0 / one if one else 0.05, 0.05)
    if budget_s is not None:
        per = min(per, max(0.05, budget_s / (len(counts) + 1 + 2 * PAIR_ROUNDS)))
    best: dict[int, float] = {}
    for prev, n in zip([None, *counts], counts):
        best[n] = _rate(calls[:n], inputs, per)
        if prev is not None and best[n] < 1.1 * best[prev]:  # doubling the workers added under 10 %
            break
    again = [1, *[n for r in range(PAIR_ROUNDS) for n in ((2, 1) if r % 2 == 0 else (1, 2))]] if 2 in best else [1]
    for n in again:
        best[n] = max(best[n], _rate(calls[:n], inputs, per))
    base = best[1]
    return [ScalingRow(kind=kind, workers=n, batches_per_s=rate, speedup=rate / base if base else 0.0)
            for n, rate in best.items()]


def process_scaling(node: Node, inputs: list[Bundle], *, count: int, budget_s: float | None) -> list[ScalingRow]:
    """Batches per second of ``node`` run by 1 .. ``count`` worker processes (the stream's own
    :class:`~placer.executor.stream.workers.ProcessPool`), each called from a thread of its own as the runner
    does: the rates include moving every batch to a child and back."""
    from placer.executor.stream.workers import ProcessPool, StageCall

    stop = threading.Event()
    pool = ProcessPool(node.name, StageCall(node.stage, node.device, node.consts, node.takes_info), count, stop)
    budget = Deadline(budget_s)
    pool.start()
    try:
        left = None if budget_s is None else max(0.1, budget.left())

        def caller(child):
            def call(b: Bundle):
                return child.call({a: b.values[src][node.location] for a, src in node.reads.items()}, b.info,
                                  stop)[0]
            return call

        counts = sorted({1, *[n for n in THREADS if n < count], count})
        return _scaling([caller(c) for c in pool.children], inputs, counts, left, "process")
    finally:
        pool.close()


def _rate(calls: list, inputs: list[Bundle], seconds: float) -> float:
    """Batches per second of one thread per callable of ``calls``, each calling it on ``inputs`` for
    about ``seconds``."""
    threads = len(calls)
    done = [0] * threads
    start = threading.Barrier(threads + 1)
    deadline: list[Deadline] = []

    def loop(i: int) -> None:
        start.wait()
        k = i
        while not deadline[0].passed() or done[i] == 0:
            calls[i](inputs[k % len(inputs)])
            done[i] += 1
            k += threads

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    deadline.append(Deadline(seconds))
    start.wait()
    for w in workers:
        w.join()
    elapsed = deadline[0].spent()
    return sum(done) / elapsed if elapsed > 0 else 0.0


class SideThread:
    """A daemon thread running :meth:`_loop` (until ``running`` is cleared) for a ``with`` block."""

    def __init__(self, name: str):
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True, name=name)

    def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.running = False
        self.thread.join()


class _Probe(SideThread):
    """A thread counting in pure Python: how little it counts while another call runs shows how much
    of that call's time the call held the GIL."""

    def __init__(self):
        self.count = 0
        super().__init__("placer-gil-probe")

    def _loop(self) -> None:
        while self.running:
            self.count += 1


#: least time the probe runs alone after each call: a call of microseconds (a tiny step) would
#: otherwise leave the probe no time slice on a loaded machine, and no rate to compare with
_PROBE_ALONE_S = 0.002


def gil_held(call, inputs: list, *, rounds: int = 1) -> float | None:
    """Seconds per call that ``call`` held the GIL, on each of ``inputs`` ``rounds`` times, as
    :class:`_Probe` saw it: after each call the probe runs alone for as long as the call took, so
    that on a machine whose cores other work shares, the probe's rate alone is measured under the
    same load as beside the calls. None when the probe did not run."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # the probe and the call take turns finely
    during = alone = counted = counted_alone = 0.0
    n = 0
    try:
        with _Probe() as probe:
            for _ in range(rounds):
                for x in inputs:
                    c = probe.count
                    with Clock(cpu_clock=None) as beside:
                        call(x)
                    counted += probe.count - c
                    during += beside.wall
                    c = probe.count
                    with Clock(cpu_clock=None) as rest:  # long enough for a busy scheduler to run the probe
                        time.sleep(max(beside.wall, _PROBE_ALONE_S))
                    counted_alone += probe.count - c
                    alone += rest.wall
                    n += 1
    finally:
        sys.setswitchinterval(interval)
    if counted_alone <= 0 or alone <= 0 or n == 0:
        return None
    rate_alone = counted_alone / alone
    return max(0.0, 1.0 - counted / (rate_alone * during)) * during / n


class Busy(SideThread):
    """A thread that keeps one core busy (numpy, the GIL released) while ``work`` is set: the share
    of the cores a stream's worker takes from the step."""

    def __init__(self):
        import numpy as np

        self.data = np.random.default_rng(0).random(1 << 17)
        self.work = threading.Event()
        super().__init__("placer-busy-core")

    def _loop(self) -> None:
        import numpy as np

        out = np.empty_like(self.data)
        while self.running:
            if not self.work.wait(0.05):
                continue
            np.multiply(self.data, self.data, out=out)
            np.sqrt(out, out=out)


def busy_ratios(torch: Any, call, kept: list[Bundle], counts: list[int], batches: int = 4) -> dict[int, float]:
    """Per intra-op thread count: the step's wall seconds beside one busy core over its seconds alone
    (medians over up to ``batches`` batches, each timed alone and beside it in turn)."""
    import statistics

    ratios: dict[int, list[float]] = {n: [] for n in counts}
    with Busy() as busy:
        for b in kept[-batches:]:
            for n in counts:
                with torch_threads(n if torch is not None else None):
                    with Clock(cpu_clock=None) as alone:
                        call(b)
                    busy.work.set()
                    time.sleep(0.001)  # the busy thread is running before the call starts
                    with Clock(cpu_clock=None) as beside:
                        call(b)
                    busy.work.clear()
                if alone.wall > 0:
                    ratios[n].append(beside.wall / alone.wall)
    return {n: max(1.0, statistics.median(rs)) for n, rs in ratios.items() if rs}
