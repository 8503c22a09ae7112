"""Caching found inside a user's Dataset: the deterministic work of ``__getitem__`` that every epoch repeats.

May import: numpy, placer.executor.stream.{source,store}, placer.timing; torch inside functions.

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
2. **Whether it depends only on the index.** A candidate's calls are recorded on a
   few items: its arguments must be plain data (numbers, strings, paths) and must
   recur across epochs: they hold nothing of the sampler's key but the sample's
   index (a key ``(index, epoch)`` passed whole, or its epoch passed along, changes
   every epoch). Then each recorded call runs again under two different states of
   Python's, numpy's and torch's global random generators: the output must equal
   the recorded one both times, and the call must leave those generators as it
   found them. A method that draws random numbers (a random crop, an augmentation
   drawing from a global generator or an unseeded one) fails, and so does the
   ``__getitem__`` around it; a deterministic method called before it is still a
   candidate: the random draws end what can be cached, not what came before them.
3. **What it costs.** The pickled size of the recorded outputs, times the calls per
   item, times the dataset's length: cached only when that fits the memory budget
   (by default a quarter of the memory available, and half of ``/dev/shm``'s room).
4. **What it gains.** The same first batches run through the user's loader settings
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

Limits: only methods called as ``self.method(...)`` are reached; a dataset wrapped
in another (``Subset``, ``ConcatDataset``) is looked into no further; a method that
reads state the script changes between epochs (an ``epoch`` attribute) looks
deterministic here: name the epoch in its arguments to keep it from the cache.
"""

from __future__ import annotations

import contextlib
import copy
import cProfile
import hashlib
import inspect
import logging
import os
import pickle
import pstats
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placer.executor.stream.source import rebuild_loader
from placer.executor.stream.store import CachedItems, SampleStore, is_plain, plain_key
from placer.timing import Clock, Deadline

log = logging.getLogger(__name__)

#: a method under this share of ``__getitem__``'s time is not worth a cache
MIN_SHARE = 0.2
#: the cached pass must be this much faster than the uncached one: twice the gain a loader setting needs
#: (:data:`placer.stream.rounds.MIN_GAIN`), for a cache also holds memory and fills in the first epoch
CACHE_GAIN = 0.10
#: uncached and cached passes, interleaved, while the budget lasts: the cached epochs' share of an uncached
#: one is their medians' ratio, which two pairs alone can put a third off
CACHE_PAIRS = 4
#: items whose calls are recorded to check determinism and arguments
CHECKED_ITEMS = 3
#: at most this many items are profiled
PROFILED_ITEMS = 64
#: work per item under this (seconds, profiled) costs about what reading it back from the cache does
MIN_ITEM_S = 1e-4


# -- the cache ----------------------------------------------------------------------------------
class CachedMethod:
    """``owner.name(...)`` through a store: computed once per argument tuple, then read back.

    Set as an instance attribute of (a copy of) the dataset, it shadows the class's
    method, so ``self.name(...)`` in ``__getitem__`` reaches it. A value read back is
    a fresh copy each time (unpickled), so code that changes it in place changes no
    other item.
    """

    def __init__(self, owner: Any, name: str, store: SampleStore):
        self.owner, self.name, self.store = owner, name, store

    def original(self) -> Callable[..., Any]:
        cls = type(self.owner)
        return inspect.getattr_static(cls, self.name).__get__(self.owner, cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (self.name, args, sorted(kwargs.items()))
        if not is_plain(key):  # a call unlike the ones checked: computed, not kept
            return self.original()(*args, **kwargs)
        found, value = self.store.get(key)
        if found:
            return value
        value = self.original()(*args, **kwargs)
        self.store.put(key, value)
        return value


class CachedPrefix:
    """A composed transform (an object with a ``transforms`` list) whose first ``k`` steps are kept in a store.

    The key is the transform's input (plain data: a path, an index), so the prefix
    must depend on it alone; the steps after the prefix (the random ones) run every time.
    """

    def __init__(self, compose: Any, k: int, store: SampleStore, name: str):
        self.compose, self.k, self.store, self.name = compose, k, store, name

    def __call__(self, x: Any) -> Any:
        key = (self.name, self.k, x)
        found, y = self.store.get(key) if is_plain(key) else (False, None)
        if not found:
            y = x
            for t in self.compose.transforms[: self.k]:
                y = t(y)
            if is_plain(key):
                self.store.put(key, y)
        for t in self.compose.transforms[self.k:]:
            y = t(y)
        return y

    def __getattr__(self, name: str) -> Any:
        if name in ("compose", "k", "store", "name") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.compose, name)


def _prefix(method: str) -> tuple[str, int] | None:
    """``("transform", 2)`` for ``transform[:2]``."""
    if not method.endswith("]") or "[:" not in method:
        return None
    attr, k = method[:-1].split("[:", 1)
    return attr, int(k)


def cached(dataset: Any, method: str, store: SampleStore) -> Any:
    """``dataset`` with ``method``'s outputs kept in ``store`` (``__getitem__``: whole items;
    ``transform[:k]``: the first ``k`` steps of a composed transform)."""
    if method == "__getitem__":
        return CachedItems(dataset, store)
    out = copy.copy(dataset)
    prefix = _prefix(method)
    if prefix is not None:
        attr, k = prefix
        setattr(out, attr, CachedPrefix(getattr(dataset, attr), k, store, attr))
        return out
    setattr(out, method, CachedMethod(out, method, store))
    return out


# -- the advice ---------------------------------------------------------------------------------
@dataclass
class CacheAdvice:
    """What :func:`find_cache` found: the method, its share, its bytes, the measured passes.

    Attributes
    ----------
    method : str or None
        ``Class.method`` cached (None: nothing qualified; ``reason`` says why).
    share : float
        The method's share of ``__getitem__``'s time, profiled.
    bytes : int
        The cache's estimated size for the whole dataset.
    budget_bytes : int
        The memory budget it had to fit.
    uncached_s, cached_s : list of float
        Seconds of each pass over the same batches (with the step): without the cache, and
        reading a full cache. With persistent workers, each is a loader's second pass, on
        workers its first pass started (a script's later epoch).
    uncached_first_s : list of float
        With persistent workers, the first pass of each uncached loader (starting its workers);
        empty without them (every pass starts its workers, and ``uncached_s`` holds them).
    fills_s : list of float
        Seconds of each pass that filled an empty cache (one per uncached pass, interleaved; with
        the workers' start).
    fill_s : float or None
        The filling passes' median: what the first epoch of a run with the cache is priced at.
        One filling pass alone can price a cache out of a short run: filling passes spread as widely
        as uncached ones.
    recommended : bool
        Whether the cache is offered.
    reason : str
        Why (not).
    """

    method: str | None
    share: float = 0.0
    bytes: int = 0
    budget_bytes: int = 0
    uncached_s: list[float] = field(default_factory=list)
    fill_s: float | None = None
    fills_s: list[float] = field(default_factory=list)
    cached_s: list[float] = field(default_factory=list)
    uncached_first_s: list[float] = field(default_factory=list)
    batches: int = 0
    recommended: bool = False
    reason: str = ""
    dataset: Any = field(default=None, repr=False)
    #: a transform prefix's steps, by class name
    steps: list[str] = field(default_factory=list)

    @property
    def attribute(self) -> str | None:
        return None if self.method is None else self.method.rsplit(".", 1)[-1]

    @property
    def epoch_speedup(self) -> float | None:
        """Epochs after the first: uncached seconds over cached (medians)."""
        if not self.uncached_s or not self.cached_s:
            return None
        return float(np.median(self.uncached_s) / max(np.median(self.cached_s), 1e-12))

    @property
    def first_uncached_s(self) -> float | None:
        """An uncached first epoch's seconds (median), which the filling one is set against: with
        persistent workers their first passes, else every uncached pass."""
        first = self.uncached_first_s or self.uncached_s
        return float(np.median(first)) if first else None

    @property
    def two_epoch_speedup(self) -> float | None:
        """Two epochs uncached over the filling epoch and one cached."""
        if not self.uncached_s or not self.cached_s or self.fill_s is None:
            return None
        u = self.first_uncached_s + float(np.median(self.uncached_s))
        return u / max(self.fill_s + float(np.median(self.cached_s)), 1e-12)

    def sentence(self) -> str:
        """The advice in plain words."""
        if self.method is None:
            return f"Caching: nothing to cache ({self.reason})"
        if self.attribute == "__getitem__":
            what = f"`{self.method}` is all of loading and depends only on the index: caching each item"
        elif _prefix(self.attribute) is not None:
            k, all_steps = _prefix(self.attribute)[1], len(getattr(self.dataset, self.attribute.split("[")[0],
                                                                   None).transforms)
            which = f"all {k} steps" if k == all_steps else f"its first {k} steps, before the first random one"
            what = (f"`{self.method}` ({which}: {', '.join(self.steps)}) is {self.share:.0%} of loading and "
                    "depends only on the index: caching its output")
        else:
            what = f"`{self.method}` is {self.share:.0%} of loading and depends only on the index: caching its output"
        if not self.recommended:
            return f"Caching: not offered: {self.reason}"
        return (f"{what} ({_fmt_bytes(self.bytes)}) makes epochs 2+ {self.epoch_speedup:.1f}x faster "
                f"(two epochs {self.two_epoch_speedup:.2f}x; advice.loader() applies it)")

    def apply(self, dataset: Any | None = None) -> Any:
        """The user's dataset with the cache (a new, empty store bounded by the budget)."""
        if self.attribute is None:
            raise ValueError("no cache was found for this dataset")
        return cached(self.dataset if dataset is None else dataset, self.attribute, SampleStore(self.budget_bytes))

    def as_dict(self) -> dict[str, Any]:
        r = (lambda x: None if x is None else round(x, 4))
        return {"method": self.method, "share": round(self.share, 4), "bytes": self.bytes,
                "budget_bytes": self.budget_bytes, "batches": self.batches,
                "uncached_s": [round(x, 4) for x in self.uncached_s], "fill_s": r(self.fill_s),
                "fills_s": [round(x, 4) for x in self.fills_s],
                "cached_s": [round(x, 4) for x in self.cached_s],
                "uncached_first_s": [round(x, 4) for x in self.uncached_first_s],
                "epoch_speedup": r(self.epoch_speedup),
                "two_epoch_speedup": r(self.two_epoch_speedup), "recommended": self.recommended,
                "reason": self.reason, "steps": list(self.steps)}


def _fmt_bytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


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


# -- finding it ---------------------------------------------------------------------------------
def key_batches(loader: Any, batches: int) -> list[list[Any]] | None:
    """The keys of the loader's first ``batches`` batches, from its batch sampler (None without one)."""
    bs = getattr(loader, "batch_sampler", None)
    if bs is None:
        return None
    out = []
    for keys in bs:
        out.append(list(keys))
        if len(out) >= batches:
            break
    return out


def own_methods(dataset: Any) -> dict[tuple[str, int, str], str]:
    """The functions of the dataset's own classes (not torch's), by their profile key, as ``name``."""
    out: dict[tuple[str, int, str], str] = {}
    for cls in type(dataset).__mro__:
        if cls is object or cls.__module__.startswith(("torch.", "builtins")):
            continue
        for name, attr in vars(cls).items():
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            code = getattr(fn, "__code__", None)
            if code is not None:
                out.setdefault((code.co_filename, code.co_firstlineno, code.co_name), name)
    return out


@dataclass
class _Candidate:
    name: str
    share: float
    calls_per_item: float
    seconds_per_item: float


def profile_items(dataset: Any, keys: list[Any], deadline: Deadline) -> tuple[list[_Candidate], int]:
    """``__getitem__`` and the dataset's methods by their share of its time (largest first)."""
    own = own_methods(dataset)
    prof = cProfile.Profile()
    items = 0
    for key in keys[:PROFILED_ITEMS]:
        prof.enable()
        try:
            dataset[key]
        finally:
            prof.disable()
        items += 1
        if deadline.passed():
            break
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, ncalls, tottime, cumtime, callers)
    cum = {own[k]: (v[3], v[1]) for k, v in stats.items() if k in own}
    total = cum.get("__getitem__", (0.0, 0))[0]
    if total <= 0:
        return [], items
    n = max(items, 1)
    out = [_Candidate("__getitem__", 1.0, 1.0, total / n)]
    for name, (ct, calls) in sorted(cum.items(), key=lambda kv: -kv[1][0]):
        if name != "__getitem__" and not name.startswith("__") and ct / total >= MIN_SHARE:
            out.append(_Candidate(name, ct / total, calls / n, ct / n))
    return out, items


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global random generators afterwards."""
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _rng_state() -> tuple:
    import torch

    np_state = np.random.get_state()
    numpy_state = (np_state[0], np_state[1].tobytes(), *np_state[2:])
    return random.getstate(), numpy_state, torch.get_rng_state().numpy().tobytes()


class _Recorder:
    """A method that records its calls: arguments, output, and whether it moved a global generator."""

    def __init__(self, owner: Any, name: str):
        self.owner, self.name = owner, name
        self.calls: list[tuple[tuple, dict, Any, bool]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cls = type(self.owner)
        fn = inspect.getattr_static(cls, self.name).__get__(self.owner, cls)
        before = _rng_state()
        value = fn(*args, **kwargs)
        self.calls.append((args, kwargs, value, _rng_state() != before))
        return value


def index_of(key: Any) -> Any:
    """The sample's index in a sampler's key: the key itself, or a tuple key's first element."""
    if isinstance(key, (tuple, list)) and key:
        return key[0]
    return key


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [y for v in x for y in _flat(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flat(v)]
    return [x]


def recurs(args: tuple, kwargs: dict, key: Any) -> bool:
    """Whether a call's arguments hold nothing of the sampler's key but the sample's index."""
    index = index_of(key)
    others = [c for c in _flat(key[1:] if isinstance(key, (tuple, list)) else ()) if not _same(c, index)]
    flat = _flat(args) + _flat(kwargs)
    return not any(_same(a, o) for a in flat for o in others)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and the like: not a key's component
        return False


def check(dataset: Any, name: str, keys: list[Any]) -> tuple[str | None, list[Any]]:
    """Why ``name``'s output cannot be cached (None when it can), and its recorded outputs."""
    calls: list[tuple[tuple, dict, Any, bool, Any]] = []
    if name == "__getitem__":
        for key in keys[:CHECKED_ITEMS]:
            before = _rng_state()
            value = dataset[key]
            calls.append(((key,), {}, value, _rng_state() != before, key))
    else:
        probe = copy.copy(dataset)
        rec = _Recorder(probe, name)
        setattr(probe, name, rec)
        for key in keys[:CHECKED_ITEMS]:
            start = len(rec.calls)
            probe[key]
            calls += [(*c, key) for c in rec.calls[start:]]
    if not calls:
        return f"{name} was not called as self.{name}(...)", []
    cls = type(dataset)
    fn = (lambda *a, **k: dataset[a[0]]) if name == "__getitem__" else \
        inspect.getattr_static(cls, name).__get__(dataset, cls)
    import torch

    for args, kwargs, value, moved, key in calls:
        if not (is_plain(args) and is_plain(sorted(kwargs.items()))):
            return f"its arguments are not plain data (numbers, strings, paths): {_types(args, kwargs)}", []
        if not recurs(args, kwargs, key):
            return (f"its arguments {_short(args)} change between epochs (they hold more of the sampler's key "
                    f"{_short(key)} than the index)"), []
        if moved:
            return "it draws random numbers (a global random generator moved)", []
        for seed in (12345, 54321):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            if not equal(fn(*args, **kwargs), value):
                return "it draws random numbers (the same arguments gave another output)", []
    return None, [c[2] for c in calls]


def composed(dataset: Any) -> list[str]:
    """Attributes of the dataset that are composed transforms: callables with a list of ``transforms``."""
    out = []
    for name, value in vars(dataset).items() if hasattr(dataset, "__dict__") else ():
        steps = getattr(value, "transforms", None)
        if callable(value) and isinstance(steps, (list, tuple)) and steps and all(callable(t) for t in steps):
            out.append(name)
    return out


@dataclass
class _Prefix:
    candidate: _Candidate
    reason: str | None
    values: list[Any]
    steps: list[str]


def check_prefix(dataset: Any, attr: str, keys: list[Any], item_s: float) -> _Prefix | None:
    """The deterministic prefix of the composed transform ``attr``: its length, share and outputs.

    Its calls on a few items are recorded; the input must be plain data that recurs (as a
    method's arguments); each step then runs twice on the previous steps' output under
    two states of the global random generators: the first step whose outputs differ, or
    that moves a generator, ends the prefix. None when the transform is not called.
    """
    import torch

    compose = getattr(dataset, attr)
    probe = copy.copy(dataset)
    seen: list[tuple[Any, Any]] = []

    def record(x: Any) -> Any:
        seen.append((x, key))
        return compose(x)

    setattr(probe, attr, record)
    for key in keys[:CHECKED_ITEMS]:
        probe[key]
    if not seen:
        return None
    steps = list(compose.transforms)
    k, outputs, prefix_s = len(steps), [], 0.0
    for x, key in seen:
        if not is_plain((x,)):
            return _Prefix(_Candidate(f"{attr}[:0]", 0.0, 0.0, 0.0), f"its input is not plain data "
                           f"({type(x).__name__}): nothing to key a cache by", [], [])
        if not recurs((x,), {}, key):
            return _Prefix(_Candidate(f"{attr}[:0]", 0.0, 0.0, 0.0), f"its input {_short(x)} changes between "
                           f"epochs (it holds more of the sampler's key {_short(key)} than the index)", [], [])
        y = x
        for j, t in enumerate(steps[:k]):
            outs = []
            for seed in (12345, 54321):
                random.seed(seed)
                np.random.seed(seed)
                torch.manual_seed(seed)
                before = _rng_state()
                with Clock(cpu_clock=None) as c:
                    outs.append(t(copy.deepcopy(y)))
                if _rng_state() != before:
                    outs.append(None)
            if len(outs) != 2 or not equal(outs[0], outs[1]):
                k = j
                break
            prefix_s += c.wall
            y = outs[0]
        outputs.append(y)
    names = [type(t).__name__ for t in steps[:k]]
    share = min(1.0, prefix_s / len(seen) / max(item_s, 1e-12))
    cand = _Candidate(f"{attr}[:{k}]", share, len(seen) / len(keys[:CHECKED_ITEMS]), prefix_s / len(seen))
    if k == 0:
        return _Prefix(cand, f"its first step ({type(steps[0]).__name__}) draws random numbers", [], [])
    return _Prefix(cand, None, outputs, names)


def _item_seconds(dataset: Any, keys: list[Any]) -> float:
    with Clock(cpu_clock=None) as c:
        for key in keys[:CHECKED_ITEMS]:
            dataset[key]
    return c.wall / max(1, len(keys[:CHECKED_ITEMS]))


def _types(args: tuple, kwargs: dict) -> str:
    return ", ".join(type(a).__name__ for a in [*args, *kwargs.values()])


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def equal(a: Any, b: Any) -> bool:
    """Whether two items are equal: arrays and tensors element by element, containers recursively."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes") and hasattr(b, "tobytes"):  # PIL images and the like
        try:
            return type(a) is type(b) and a.tobytes() == b.tobytes()
        except Exception:  # noqa: BLE001
            return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def digest(batch: Any) -> str:
    """A digest of a batch's content (tensors and arrays by their bytes, dtype and shape)."""
    h = hashlib.blake2b(digest_size=16)

    def walk(x: Any) -> None:
        if hasattr(x, "detach") and hasattr(x, "numpy"):
            x = x.detach().cpu().numpy()
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (tuple, list)):
            h.update(f"{type(x).__name__}{len(x)}".encode())
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    walk(batch)
    return h.hexdigest()


def _pickled_bytes(values: list[Any]) -> float:
    return float(np.mean([len(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)) for v in values]))


# -- measuring it -------------------------------------------------------------------------------
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
            with random_state_kept(), Clock(cpu_clock=None) as run:
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
    dataset = getattr(loader, "dataset", None)
    if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return CacheAdvice(None, reason="the dataset is not map-style (no __getitem__ and __len__)")
    deadline = Deadline(budget_s)
    with random_state_kept():
        fixed = key_batches(loader, batches)
    if not fixed:
        return CacheAdvice(None, reason="the loader has no batch sampler (automatic batching is off)")
    keys = [k for b in fixed for k in b]
    cls = type(dataset).__name__
    with random_state_kept():
        cands, items = profile_items(dataset, keys, Deadline(budget_s / 6))
        prefixes: dict[str, _Prefix] = {}
        for attr in composed(dataset):
            pre = check_prefix(dataset, attr, keys, _item_seconds(dataset, keys))
            if pre is not None and (pre.reason is not None or pre.candidate.share >= MIN_SHARE):
                prefixes[pre.candidate.name] = pre
                cands.append(pre.candidate)
        if not cands:
            return CacheAdvice(None, reason=f"{cls}.__getitem__ is not the dataset's own code")
        cands[1:] = sorted(cands[1:], key=lambda c: -c.share)
        found, why = None, []
        for c in cands:
            pre = prefixes.get(c.name)
            reason, values = (pre.reason, pre.values) if pre is not None else check(dataset, c.name, keys)
            if reason is None:
                found = (c, values)
                break
            why.append(f"{cls}.{c.name.split('[')[0]}: {reason}")
    if found is None:
        return CacheAdvice(None, reason="; ".join(why))
    c, values = found
    size = int(_pickled_bytes(values) * c.calls_per_item * len(dataset))
    advice = CacheAdvice(f"{cls}.{c.name}", share=c.share, bytes=size, budget_bytes=budget_bytes, dataset=dataset,
                         steps=prefixes[c.name].steps if c.name in prefixes else [])
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
        return rebuild_loader(loader, {**loader_kwargs, "persistent_workers": persist}, dataset=ds,
                              batch_sampler=fixed)

    stores: list[SampleStore] = []

    def uncached(limit: Deadline | None = None) -> tuple[float, list[list[str]]]:
        runs = _passes(make, advice.dataset, step, sync, limit, 2) if persist else \
            [_pass(make, advice.dataset, step, sync, limit)]
        if persist:
            advice.uncached_first_s.append(runs[0][0])
        advice.uncached_s.append(runs[-1][0])
        return sum(r[0] for r in runs), [r[1] for r in runs]

    def fill_and_read() -> tuple[float, bool]:  # an empty cache filled by one pass, read by the next
        stores.append(SampleStore(advice.budget_bytes))
        ds = cached(advice.dataset, advice.attribute, stores[-1])
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
    with random_state_kept():
        fixed = key_batches(loader, batches)
    if not fixed:
        return advice
    again = CacheAdvice(advice.method, share=advice.share, bytes=advice.bytes, budget_bytes=advice.budget_bytes,
                        dataset=advice.dataset, steps=list(advice.steps))
    _measure(again, loader, fixed, step, loader_kwargs, Deadline(budget_s), sync)
    if not again.recommended or not again.uncached_s or not again.cached_s:
        return advice
    again.reason = advice.reason + f"; with the recommended settings: {again.reason}"
    return again


def _secs(xs: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in xs) + " s"
