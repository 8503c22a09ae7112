"""Slow samples that hold batches back: whether ``DataLoader(in_order=False)`` would gain, and by how much.

May import: itertools, numpy, placer.stream.rounds, placer.executor.stream.source,
placer.stream.dropin.{headtohead,phases,samples,trial}.

The rule
--------
DataLoader hands batches over in the order the sampler made them: batch ``k`` goes to worker
``k mod W`` and at most ``prefetch_factor x W`` batches are outstanding; a new one is sent only when
one is handed over. With ``in_order=True`` the loop waits for batch ``k`` even when later ones are
done, so while one worker reads a slow batch the others finish what they were sent and then sit idle:
nothing new is sent until the slow batch is handed over. With ``in_order=False`` the first finished
batch is handed over and the next one goes to a worker with room.

Each sample's ``dataset[key]`` is timed in this process (the keys of the loader's first batches,
:func:`~placer.stream.dropin.samples.time_samples`); summed into those batches
(repeated to fill several windows), the two ways of handing them over are replayed with the step's
own time per batch (:func:`delivery_s`). Their ratio is the predicted gain: where it reaches
``1 + MIN_GAIN`` and the slowest batch costs :data:`HEAVY` times the median one, the tail holds batches
back, and the recommended settings with ``in_order=False``
are measured against them in interleaved rounds (:mod:`~placer.stream.dropin.headtohead`).

``in_order=False`` is measured and recommended only where the user allows it (``allow_reorder=True``)
and the rounds measure it faster by the drop-in's rule: each epoch's batches are the same (the sampler
still makes them in the main process), but the order they reach the step varies from run to run.
Without the permission the advice says what it would gain, estimated from the replay and labelled so:
the rounds take up to a quarter of the budget more, and their result could not change the advice.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from placer.executor.stream.source import loader_arguments
from placer.stream.dropin.headtohead import adopt, measured, outcome, side_by_side, with_processes
from placer.stream.dropin.phases import Advising
from placer.stream.dropin.samples import Timed
from placer.stream.dropin.trial import label
from placer.stream.rounds import MIN_GAIN

#: a tail holds batches back only where the slowest batch timed costs this many times the median batch: on a
#: machine shared with other work, its load multiplies a sample's time now and then (by up to several times
#: on a loaded 2-core machine, even as the least of three timings), which the replay alone would read as a tail
HEAVY = 4.0
#: the batches replayed: the timed ones repeated to fill this many windows of outstanding batches
WINDOWS = 8

#: what the advice says the user accepts with ``in_order=False``
ORDER_VARIES = ("each epoch still reads the same batches, but the order they reach your step then varies "
                "from run to run (as the workers finish them)")


def delivery_s(costs: Sequence[float], workers: int, depth: int, step_s: float, *, in_order: bool) -> float:
    """Seconds to hand over batches costing ``costs`` seconds each, as DataLoader does, with a step of ``step_s``.

    ``workers`` processes, at most ``depth x workers`` batches outstanding, each worker reading its batches
    one after another. In order, batch ``k`` goes to the next worker in turn and the loop waits for
    batch ``k``; out of order, a batch goes to the next worker in turn with fewer than ``depth``
    outstanding and the loop takes the first finished.

    Examples
    --------
    One batch in 20 at 20x the others, two workers: in order, the other worker idles while the slow one
    is read, once it has finished the batches it was sent; costs that do not vary gain nothing.

    >>> slow = [0.02] + [0.001] * 19
    >>> round(delivery_s(slow * 4, 2, 2, 0.0, in_order=True) / delivery_s(slow * 4, 2, 2, 0.0, in_order=False), 2)
    1.49
    >>> delivery_s([0.01] * 8, 2, 2, 0.0, in_order=True) == delivery_s([0.01] * 8, 2, 2, 0.0, in_order=False)
    True
    """
    window, free, load = depth * workers, [0.0] * workers, [0] * workers
    turn, pending, sent = itertools.cycle(range(workers)), {}, 0

    def send(t: float) -> None:
        nonlocal sent
        if sent >= len(costs):
            return
        for _ in range(workers):
            w = next(turn)
            if in_order or load[w] < depth:
                break
        else:
            return
        free[w] = max(free[w], t) + costs[sent]
        pending[sent], load[w], sent = (free[w], w), load[w] + 1, sent + 1

    for _ in range(window):
        send(0.0)
    t = 0.0
    for k in range(len(costs)):
        idx = k if in_order else min(pending, key=lambda i: pending[i][0])
        finish, w = pending.pop(idx)
        t, load[w] = max(t, finish), load[w] - 1
        send(t)
        t += step_s
    return t


def predicted(costs: Sequence[Sequence[float]], workers: int, depth: int, step_s: float) -> dict[str, Any]:
    """The timed samples in numbers, and the gain the replay of both ways of handing batches over predicts."""
    flat = np.array([c for b in costs for c in b])
    per_batch = [sum(b) for b in costs]
    replay = per_batch * max(1, -(-WINDOWS * workers * depth // len(per_batch)))
    ordered = delivery_s(replay, workers, depth, step_s, in_order=True)
    free = delivery_s(replay, workers, depth, step_s, in_order=False)
    return {"samples_timed": int(flat.size), "median_ms": round(float(np.median(flat)) * 1e3, 3),
            "p95_ms": round(float(np.percentile(flat, 95)) * 1e3, 3), "max_ms": round(float(flat.max()) * 1e3, 3),
            "slowest_batch_over_median": round(max(per_batch) / max(float(np.median(per_batch)), 1e-12), 2),
            "predicted_gain": round(ordered / max(free, 1e-12), 3)}


def why_not_tried(a: Advising) -> str | None:
    """Why ``in_order`` cannot matter for the recommended settings nor the user's (None: it can)."""
    if "in_order" not in loader_arguments():
        return "the installed torch's DataLoader has no in_order argument"
    if with_processes(a, 2) is None:
        return ("in_order changes nothing without two or more worker processes (DataLoader's, not a pool of "
                "threads), in the recommended settings or yours")
    if not getattr(a.loader, "in_order", True):
        return "your loader already hands batches over out of order (in_order=False)"
    return None


def consider(a: Advising, timed: Timed | None, allow: bool) -> dict[str, Any]:
    """From the ``timed`` samples, predict the gain of ``in_order=False``; where the prediction clears
    ``MIN_GAIN``, measure it where ``allow`` and recommend it where the rounds say it is faster, else say
    what it would gain (estimated). Returns what the advice reports (``advice.reorder``)."""
    out: dict[str, Any] = {"allowed": bool(allow), "recommended": False}
    why = why_not_tried(a)
    if why or timed is None:
        out["why_not"] = why or "the loader has no keys to time its samples by (an iterable dataset)"
        return out
    s, base = with_processes(a, 2), a.best.settings
    per_batch_s = (a.best.samples / max(a.best.batches, 1)) / max(a.step_rate, 1e-12) if a.step_rate else 0.0
    out.update(predicted(timed.costs, s.num_workers, s.prefetch_factor or 2, per_batch_s))
    if out["predicted_gain"] < 1 + MIN_GAIN or out["slowest_batch_over_median"] < HEAVY:
        return out
    if not allow:  # the rounds could not change the advice: the gain is the replay's, and said to be
        a.notes.append(f"slow samples hold batches back (the slowest {out['max_ms']:.1f} ms, the median "
                       f"{out['median_ms']:.1f} ms): in_order=False would be {_gain(out)} with {label(s)}; pass "
                       f"allow_reorder=True to have it measured and, where faster, recommended: {ORDER_VARIES}")
        return out
    reordered = s.model_copy(update={"in_order": False})
    pair = side_by_side(a, base, reordered)
    out.update(outcome(pair))
    if out["faster"]:
        adopt(a, pair)
        out["recommended"] = True
        a.notes.append(f"in_order=False: {label(reordered)} measured {out['measured_gain']:.2f}x {label(base)} in "
                       f"{out['rounds']} interleaved rounds (a sample {out['max_ms']:.1f} ms where the median is "
                       f"{out['median_ms']:.1f} ms held batches back); " + ORDER_VARIES)
    else:
        a.notes.append(f"in_order=False ({label(reordered)}) was measured against {label(base)}: {measured(out)}; "
                       "it is not recommended")
    return out


def _gain(out: dict[str, Any]) -> str:
    return f"{out['predicted_gain']:.2f}x (estimated from the timed samples, not measured)"
