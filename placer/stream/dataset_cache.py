"""Caching found inside a user's Dataset: the deterministic work of ``__getitem__`` that every epoch repeats.

May import: numpy, placer.executor.stream.{source,store}, placer.timing,
placer.stream.{cache_advice,hits,purity,wrappers}; torch inside functions.

What a cache wraps and the advice about it are :mod:`placer.stream.cache_advice`; whether a method is pure
in its arguments, :mod:`placer.stream.purity`.

:func:`find_cache` answers, for the drop-in (:func:`placer.stream.dropin.advise_loader`):
which part of ``dataset[key]`` could be computed once and kept, what keeping it
costs in memory, and what it gains, measured.

1. **Where the time goes.** ``__getitem__`` runs under ``cProfile`` on the keys of
   the loader's first batches (in this process); the time of each method of the
   dataset's own classes is its share of the item's time. The candidates are
   ``__getitem__`` itself and every method over :data:`MIN_SHARE` of it, the
   largest first. A composed transform the dataset holds (an attribute with a
   ``transforms`` list, as ``torchvision.transforms.Compose``) is one too: its
   deterministic prefix (:func:`check_prefix`), timed against the item.
2. **Whether it is pure in its arguments** (:mod:`placer.stream.purity`: memoisation
   keyed by argument values, as ``functools.lru_cache`` keys them). A candidate's calls
   are recorded on a few items: its arguments must be plain data (numbers, strings,
   paths, tuples of them). Each recorded call runs again under two different states of
   Python's, numpy's and torch's global random generators: the output must equal the
   recorded one both times, and the call must leave those generators as it found them.
   A method that draws random numbers (a random crop, an augmentation drawing from a
   global generator or an unseeded one) fails, and so does the ``__getitem__`` around
   it; a deterministic method called before it is still a candidate: the random draws
   end what can be cached, not what came before them.
3. **Whether it will hit** (:mod:`placer.stream.hits`), measured on the sampler's next
   two epochs whatever its keys look like: the share of the second epoch's calls whose
   arguments the first's had must reach :data:`~placer.stream.hits.MIN_HITS`.
4. **What it costs.** The pickled size of the recorded outputs, times the calls per
   item, times the dataset's length: cached only when that fits the memory budget
   (by default a quarter of the memory available, and half of ``/dev/shm``'s room).
5. **What it gains.** The same first batches run through the user's loader settings
   with the step: uncached, then cached twice (the first pass fills the cache, the
   second reads it), and, budget allowing, more of each, interleaved, up to
   :data:`CACHE_PAIRS` of each. Caching is
   offered when the cached pass beats the uncached one by :data:`CACHE_GAIN` beyond
   their spread, and only when every batch of every cached pass equals the uncached
   pass's batch (checked here, by digest).

The cache is a :class:`~placer.executor.stream.store.SampleStore`: one file per key
in shared memory, so DataLoader worker processes (persistent or not, forked or
spawned) read what any of them wrote; it is bounded by the budget. The cached
dataset is a shallow copy of the user's with the method replaced by
:class:`CachedMethod` (an instance attribute, so ``self.method(...)`` inside
``__getitem__`` reaches it) or a transform attribute replaced by :class:`CachedPrefix`
(its first steps kept by their input), or :class:`CachedItems` around the dataset when
the whole item is cached.

Shapes: automatic batching, ``batch_size=None`` (each item a chunk), datasets inside
``Subset`` splits and ``ConcatDataset`` concatenations, nested either way
(:mod:`placer.stream.wrappers`: searched inside, each key run through the wrappers to the
dataset it reaches; the cache put into copies of the same wrappers around copies of the
datasets), and a dataset with its own batched ``__getitems__`` (fetched a batch at a time, as
the loader fetches it). In a ``ConcatDataset`` the candidates are methods of one class: the
class of the datasets that took the most of the profiled items' time, so that the shards of
one class share the candidate, and where the datasets differ in class, the cache goes into
those of the class that holds most of the time and the others stay as they are (a share is
of the whole item's time, so a class that holds little of it offers little). A
``__getitems__`` is never the cached unit itself: its argument is a batch of keys, which a
reshuffled epoch does not ask for again; the methods it calls are the candidates, and a
method called with the whole batch (a read of many at once) is passed over by its hit rate.

Limits: only methods called as ``self.method(...)`` are reached; a wrapper subclass that
maps keys its own way (overrides ``__getitem__``) is treated as the user's dataset, not
looked into; an ``IterableDataset`` has no key to cache by; a method that reads
state the script changes between epochs other than through ``set_epoch`` or an ``epoch``
attribute looks deterministic here: name the epoch in its arguments to keep it from the cache.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pickle
import pstats
from collections.abc import Callable
from typing import Any

import numpy as np

from placer.executor.stream.source import rebuild_loader
from placer.executor.stream.store import CachedItems, SampleStore
from placer.timing import Clock, Deadline
from placer.stream.cache_advice import CacheAdvice, MethodCandidate, cached, cached_inside
from placer.stream.hits import MIN_HITS, batched, copied, fetches_batches, hit_rate, key_source, units
from placer.stream.purity import (PrefixCandidate, check, check_prefix, composed, digest, equal,
                                  global_random_state_kept, item_seconds)
from placer.stream.wrappers import Batch, fetched, items_in, leaves, locate, wrappers

__all__ = ["CACHE_GAIN", "CACHE_PAIRS", "CacheAdvice", "CachedItems", "cached", "cached_inside", "check", "digest",
           "equal", "find_cache", "hit_rate", "judge", "measure_at"]



#: a method under this share of ``__getitem__``'s time is not worth a cache
MIN_SHARE = 0.2
#: the cached pass must be this much faster than the uncached one: twice the gain a loader setting needs
#: (:data:`placer.stream.rounds.MIN_GAIN`), for a cache also holds memory and fills in the first epoch
CACHE_GAIN = 0.10
#: uncached and cached passes, interleaved, while the budget lasts: the cached epochs' share of an uncached
#: one is their medians' ratio, which two pairs alone can put a third off
CACHE_PAIRS = 4
#: at most this many items are profiled
PROFILED_ITEMS = 64
#: work per item under this (seconds, profiled) costs about what reading it back from the cache does
MIN_ITEM_S = 1e-4


def default_budget() -> int:
    """A quarter of the memory available, and at most half the room left in ``/dev/shm``."""
    avail = None
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    if avail is None:
        avail = 2 << 30
    budget = avail // 4
    with contextlib.suppress(OSError):
        st = os.statvfs("/dev/shm")
        budget = min(budget, st.f_bavail * st.f_frsize // 2)
    return int(budget)


def key_batches(loader: Any, batches: int) -> list[list[Any]] | None:
    """The keys of the loader's first ``batches`` batches, from a copy of its batch sampler; with
    ``batch_size=None`` (each item a chunk), its sampler's first keys, one per batch. None without either."""
    source = key_source(loader)
    if source is None:
        return None
    out = []
    for keys in copied(source, loader):
        out.append(list(keys) if batched(loader) else [keys])
        if len(out) >= batches:
            break
    return out


def own_methods(cls: type) -> dict[tuple[str, int, str], str]:
    """The functions of a dataset class and its bases (not torch's), by their profile key, as ``name``."""
    out: dict[tuple[str, int, str], str] = {}
    for c in cls.__mro__:
        if c is object or c.__module__.startswith(("torch.", "builtins")):
            continue
        for name, attr in vars(c).items():
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            code = getattr(fn, "__code__", None)
            if code is not None:
                out.setdefault((code.co_filename, code.co_firstlineno, code.co_name), name)
    return out


def profile_items(dataset: Any, keys: list[Any],
                  deadline: Deadline) -> tuple[list[MethodCandidate], int, type | None]:
    """The class of the leaves (:mod:`placer.stream.wrappers`) whose ``__getitem__`` took the most of the
    items' time, and its ``__getitem__`` and methods by their share of the time of the leaves' own
    code (largest first), with the items profiled. The keys are fetched as the loader fetches them: for
    a :class:`~placer.stream.wrappers.Batch`, ``__getitems__`` is the entry and no whole-item candidate is
    offered (a batch of keys is no key to cache by). None for the class where no leaf's entry is its own
    code."""
    entry = "__getitems__" if any(isinstance(k, Batch) for k in keys) else "__getitem__"
    own = {cls: own_methods(cls) for cls in dict.fromkeys(type(leaf) for leaf in leaves(dataset))}
    prof = cProfile.Profile()
    items = 0
    for key in keys[:PROFILED_ITEMS]:
        prof.enable()
        try:
            fetched(dataset, key)
        finally:
            prof.disable()
        items += items_in([key])
        if deadline.passed():
            break
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, ncalls, tottime, cumtime, callers)
    cums = {cls: {names[k]: (v[3], v[1]) for k, v in stats.items() if k in names} for cls, names in own.items()}
    entries = {k: stats[k][3] for names in own.values() for k, name in names.items() if name == entry and k in stats}
    total = sum(entries.values())  # each entry once: classes that share one count it once
    if total <= 0:
        return [], items, None
    cls = max(cums, key=lambda c: cums[c].get(entry, (0.0, 0))[0])
    cum, n = cums[cls], max(items, 1)
    out = []
    if entry == "__getitem__":
        out.append(MethodCandidate("__getitem__", cum[entry][0] / total, cum[entry][1] / n, cum[entry][0] / n))
    for name, (ct, calls) in sorted(cum.items(), key=lambda kv: -kv[1][0]):
        if not name.startswith("__") and ct / total >= MIN_SHARE:
            out.append(MethodCandidate(name, ct / total, calls / n, ct / n))
    return out, items, cls


def _pickled_bytes(values: list[Any]) -> float:
    return float(np.mean([len(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)) for v in values]))


def _passes(make: Callable[[Any], Any], dataset: Any, step: Callable[[Any], Any] | None, sync: Callable[[], None],
            deadline: Deadline | None = None, count: int = 1) -> list[tuple[float, list[str]]]:
    """Seconds of ``count`` passes over the fixed batches with the step, through one loader (its
    persistent workers, if it has them, started once); each with its batches' digests, taken outside
    the clock.

    With ``deadline``, the first pass stops after the first batch that ends past it, and the later
    ones run the batches it ran (the loader's ``batch_sampler``, a list, is cut to them). Every
    pass starts from the same state of the global random generators (restored afterwards), so
    that passes over the same batches draw the same numbers.
    """
    loader = make(dataset)
    out: list[tuple[float, list[str]]] = []
    it = None
    try:
        for n in range(count):
            digests, outside = [], 0.0
            with global_random_state_kept(), Clock(cpu_clock=None) as run:
                it = iter(loader)
                for batch in it:
                    with Clock(cpu_clock=None) as d:
                        digests.append(digest(batch))
                    outside += d.wall
                    if step is not None:
                        step(batch)
                    if n == 0 and deadline is not None and deadline.passed():
                        break
                sync()
            out.append((run.wall - outside, digests))
            if n == 0 and isinstance(getattr(loader, "batch_sampler", None), list):
                del loader.batch_sampler[len(digests):]
            elif n == 0 and isinstance(getattr(loader, "sampler", None), list):  # one item a batch
                del loader.sampler[len(digests):]
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    return out


def _pass(make: Callable[[Any], Any], dataset: Any, step: Callable[[Any], Any] | None,
          sync: Callable[[], None], deadline: Deadline | None = None) -> tuple[float, list[str]]:
    """One pass (:func:`_passes`), its workers stopped at its end."""
    return _passes(make, dataset, step, sync, deadline)[0]


def find_cache(loader: Any, step: Callable[[Any], Any] | None, *, loader_kwargs: dict[str, Any],
               batches: int = 20, budget_s: float = 30.0, budget_bytes: int | None = None,
               sync: Callable[[], None] = lambda: None) -> CacheAdvice:
    """Find the deterministic per-index work of the loader's dataset worth caching, and measure the gain.

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        The user's loader (a map-style dataset, automatic batching).
    step : callable or None
        The train step, run on each batch of the measured passes (None: the loader alone).
    loader_kwargs : dict
        The DataLoader settings the passes run with (the user's: ``num_workers``, ...).
    batches : int
        The most batches of the loader's first ones run in a pass.
    budget_s : float
        Seconds for the profile (a sixth) and the passes: the uncached pass stops at a
        third of what is left (after at least one batch), and the cached passes run the
        batches it ran; the repeats run only when the time left covers them.
    budget_bytes : int, optional
        The memory the cache may take (default :func:`default_budget`).
    sync : callable
        Waits for the step's queued work (a GPU's) at the end of each pass.

    Returns
    -------
    CacheAdvice
    """
    from torch.utils.data import IterableDataset

    budget_bytes = default_budget() if budget_bytes is None else int(budget_bytes)
    outer = getattr(loader, "dataset", None)
    if isinstance(outer, IterableDataset):
        return CacheAdvice(None, reason="an IterableDataset yields its items in its own order, with no key to "
                                        "find an item again by: nothing can be cached by its arguments")
    if outer is None or not hasattr(outer, "__len__"):
        return CacheAdvice(None, reason="the dataset is not map-style (no __getitem__ and __len__)")
    deadline = Deadline(budget_s)
    with global_random_state_kept():
        fixed = key_batches(loader, batches)
    if not fixed:
        return CacheAdvice(None, reason="the loader has no sampler to draw its keys from")
    keys = units(loader, fixed)
    with global_random_state_kept():
        cands, items, cls = profile_items(outer, keys, Deadline(budget_s / 6))
        if cls is None:
            entry = "__getitems__" if fetches_batches(loader) else "__getitem__"
            return CacheAdvice(None, reason=f"{type(leaves(outer)[0]).__name__}.{entry} is not the dataset's own code")
        mine = [leaf for leaf in leaves(outer) if type(leaf) is cls]
        keys = [k for k in keys if isinstance(k, Batch) or type(leaves(outer)[locate(outer, k)[0]]) is cls]
        prefixes = _prefixes(outer, cls, mine, keys)
        head = [c for c in cands if c.name == "__getitem__"]  # the whole item first, then by share
        cands = head + sorted(cands[len(head):] + [p.candidate for p in prefixes.values()], key=lambda c: -c.share)
        notes = _shape_notes(outer, keys, cls)
        if not cands:
            return CacheAdvice(None, reason="; ".join(notes + [f"no method of {cls.__name__} takes "
                                                                f"{MIN_SHARE:.0%} of its items' time"]))
        found, why = _first_cacheable(outer, cls, cands, prefixes, keys, loader,
                                      Deadline(max(deadline.left() / 6, 0.5)))
    if found is None:
        return CacheAdvice(None, reason="; ".join(notes + why))
    c, values, hits = found
    size = int(_pickled_bytes(values) * c.calls_per_item * len(outer))
    advice = CacheAdvice(f"{cls.__name__}.{c.name}", share=c.share, bytes=size, budget_bytes=budget_bytes,
                         dataset=mine[0], steps=prefixes[c.name].steps if c.name in prefixes else [],
                         wrappers=wrappers(outer), hit_rate=hits, outer=outer,
                         leaves=(len(mine), len(leaves(outer))) if wrappers(outer) else None)
    if c.seconds_per_item < MIN_ITEM_S:
        advice.reason = (f"its work per item ({c.seconds_per_item * 1e6:,.0f} us) costs about what reading it back "
                         "from a cache does")
        return advice
    if size > budget_bytes:
        advice.reason = f"its output for the whole dataset ({size / 1e6:,.0f} MB) exceeds the memory budget " \
                        f"({budget_bytes / 1e6:,.0f} MB)"
        return advice
    _measure(advice, loader, list(fixed), step, loader_kwargs, deadline, sync)
    return advice


def _prefixes(outer: Any, cls: type, mine: list[Any], keys: list[Any]) -> dict[str, PrefixCandidate]:
    """The composed transforms every leaf of ``cls`` holds, with their deterministic prefixes
    (:func:`check_prefix`): those refused (with a reason) and those over :data:`MIN_SHARE` of an item."""
    out: dict[str, PrefixCandidate] = {}
    for attr in [a for a in composed(mine[0]) if all(a in composed(leaf) for leaf in mine[1:])]:
        pre = check_prefix(outer, attr, keys, item_seconds(outer, keys), cls=cls)
        if pre is not None and (pre.reason is not None or pre.candidate.share >= MIN_SHARE):
            out[pre.candidate.name] = pre
    return out


def _shape_notes(outer: Any, keys: list[Any], cls: type) -> list[str]:
    """What the dataset's shape left out of the search, in words: a ``__getitems__`` (never the cached unit)
    and, inside wrappers, the leaves of other classes than the one searched."""
    notes = []
    if any(isinstance(k, Batch) for k in keys):
        notes.append(f"{cls.__name__}.__getitems__: it takes a whole batch of keys and returns the batch's items, "
                     "so a cache of it by its argument hits only a batch asked for whole again, which a reshuffled "
                     "epoch does not do: only the methods it calls are candidates")
    names = list(dict.fromkeys(type(leaf).__name__ for leaf in leaves(outer)))
    if len(names) > 1:
        notes.append(f"the {type(wrappers(outer)[0]).__name__} holds datasets of {len(names)} classes "
                     f"({', '.join(names)}): {cls.__name__}, which took the most of the profiled time, was searched")
    return notes


def _first_cacheable(dataset: Any, cls: type, cands: list[MethodCandidate], prefixes: dict[str, PrefixCandidate],
                     keys: list[Any], loader: Any,
                     deadline: Deadline) -> tuple[tuple[MethodCandidate, list[Any], float] | None, list[str]]:
    """The first candidate pure in its arguments (:func:`check`) whose arguments recur
    (:func:`hit_rate` at least ``MIN_HITS``), with its recorded outputs and hit rate; and why
    each one before it was passed over. The candidates are of the leaves of ``cls`` inside ``dataset``,
    the loader's."""
    why = []
    for c in cands:
        pre = prefixes.get(c.name)
        reason, values = (pre.reason, pre.values) if pre is not None else check(dataset, c.name, keys, cls=cls)
        if reason is None:
            hits, seen = hit_rate(dataset, c.name, loader, deadline, cls=cls)
            if hits >= MIN_HITS:
                return (c, values, hits), why
            reason = (f"its arguments change between epochs: {hits:.0%} of the next epoch's calls repeat the "
                      f"arguments of the epoch before (measured on {seen} keys of the sampler's next two epochs)")
        why.append(f"{cls.__name__}.{c.name.split('[')[0]}: {reason}")
    return None, why


def _measure(advice: CacheAdvice, loader: Any, fixed: list[list[Any]], step: Callable[[Any], Any] | None,
             loader_kwargs: dict[str, Any], deadline: Deadline, sync: Callable[[], None]) -> None:
    """The passes: uncached, then a new cache filled and read, interleaved, up to :data:`CACHE_PAIRS` each.

    Where ``loader_kwargs`` keep worker processes between epochs (``persistent_workers``), each
    loader runs two passes on the same workers, as a script's epochs do: the second of the
    uncached loader's is an uncached later epoch (``uncached_s``; its first, which starts the
    workers, ``uncached_first_s``), and the cached loader's first fills the cache and its second
    reads it with the workers that filled it. Elsewhere every pass starts its workers, as every
    epoch of such a script does.
    """
    persist = bool(loader_kwargs.get("num_workers")) and bool(loader_kwargs.get("persistent_workers"))

    def make(ds: Any) -> Any:
        order = dict(batch_sampler=fixed) if batched(loader) else dict(sampler=[k for b in fixed for k in b])
        return rebuild_loader(loader, {**loader_kwargs, "persistent_workers": persist}, dataset=ds, **order)

    outer = advice.outer if advice.outer is not None else advice.dataset

    stores: list[SampleStore] = []

    def uncached(limit: Deadline | None = None) -> tuple[float, list[list[str]]]:
        runs = _passes(make, outer, step, sync, limit, 2) if persist else \
            [_pass(make, outer, step, sync, limit)]
        if persist:
            advice.uncached_first_s.append(runs[0][0])
        advice.uncached_s.append(runs[-1][0])
        return sum(r[0] for r in runs), [r[1] for r in runs]

    def fill_and_read() -> tuple[float, bool]:  # an empty cache filled by one pass, read by the next
        stores.append(SampleStore(advice.budget_bytes))
        ds = cached_inside(outer, advice.method, stores[-1])
        if persist:  # filled and read by the same workers
            (f, got), (h, again) = _passes(make, ds, step, sync, count=2)
        else:
            (f, got), (h, again) = _pass(make, ds, step, sync), _pass(make, ds, step, sync)
        advice.fills_s.append(f)
        advice.cached_s.append(h)
        return f + h, [got, again] == (ref if persist else [ref[0], ref[0]])

    try:
        u, ref = uncached(Deadline(deadline.left() / 3))
        del fixed[len(ref[0]):]  # the cached passes run the batches the uncached one ran
        advice.batches = len(fixed)
        c, same = fill_and_read()
        # more, interleaved: each round fills a new cache, as one slow fill must not price the whole run
        while same and len(advice.cached_s) < CACHE_PAIRS and deadline.left() > u + c:
            uncached()
            c, kept = fill_and_read()
            same = same and kept
            stores.pop(0).close()
    finally:
        for store in stores:
            store.close()
    advice.fill_s = float(np.median(advice.fills_s))
    judge(advice, same)


def judge(advice: CacheAdvice, same: bool = True) -> None:
    """Recommend ``advice``'s cache, or say why not, from its measured passes.

    The cache is recommended where its batches equal the uncached loader's, the cached epochs are
    more than ``1 + CACHE_GAIN`` faster (medians), and the cached passes are apart from the uncached
    ones: every cached pass faster than the fastest uncached pass, but for one where there are
    three or more pairs. A single slow pass (a machine's hiccup) must not decide over four.
    """
    gain = advice.epoch_speedup or 0.0
    fastest = min(advice.uncached_s, default=0.0)
    slow = sum(c >= fastest for c in advice.cached_s)
    if not same:
        advice.reason = "the cached loader's batches differ from the uncached loader's"
    elif gain < 1:
        advice.reason = (f"reading `{advice.method}`'s output back from the cache is slower than computing it "
                         f"(uncached {_secs(advice.uncached_s)}, cached {_secs(advice.cached_s)})")
    elif gain <= 1 + CACHE_GAIN or slow > (1 if len(advice.cached_s) >= 3 else 0):
        advice.reason = (f"caching `{advice.method}` measured {gain:.2f}x on epochs 2+ "
                         f"(uncached {_secs(advice.uncached_s)}, cached {_secs(advice.cached_s)}): within noise "
                         f"or too little to matter")
    else:
        advice.recommended = True
        advice.reason = (f"uncached {_secs(advice.uncached_s)}, cached {_secs(advice.cached_s)} "
                         f"over {advice.batches} batches")


def measure_at(advice: CacheAdvice, loader: Any, step: Callable[[Any], Any] | None, *, loader_kwargs: dict[str, Any],
               batches: int, budget_s: float, sync: Callable[[], None] = lambda: None) -> CacheAdvice:
    """``advice``'s cache measured again with other DataLoader settings (the recommended ones).

    The cache search measured its passes with the user's settings; the settings recommended
    beside it (fewer step threads, workers) change the uncached and the cached pass alike but
    not by the same factor: on 2 cores an audio script's cached epochs took 0.16x an uncached
    one at torch's two threads and 0.31x at one. Returns a copy with the passes measured over
    the same first batches under ``loader_kwargs`` (the caller sets the step's threads), or
    ``advice`` itself where it offers no cache, the batches differ, or ``budget_s`` ends first.
    """
    if not advice.recommended or advice.method is None or advice.dataset is None:
        return advice
    with global_random_state_kept():
        fixed = key_batches(loader, batches)
    if not fixed:
        return advice
    again = CacheAdvice(advice.method, share=advice.share, bytes=advice.bytes, budget_bytes=advice.budget_bytes,
                        dataset=advice.dataset, steps=list(advice.steps), wrappers=advice.wrappers,
                        hit_rate=advice.hit_rate, outer=advice.outer, leaves=advice.leaves)
    _measure(again, loader, fixed, step, loader_kwargs, Deadline(budget_s), sync)
    if not again.recommended or not again.uncached_s or not again.cached_s:
        return advice
    again.reason = advice.reason + f"; with the recommended settings: {again.reason}"
    return again


def _secs(xs: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in xs) + " s"
