"""A cache inside a user's Dataset: the wrappers that memoise a method or a transform prefix by its
arguments, and :class:`CacheAdvice`, what the drop-in found and measured (plain data and words).

May import: numpy, placer.executor.stream.store, placer.stream.wrappers, placer.timing.

The cache goes into copies of the leaves of the class it was found in, inside copies of the loader's
``Subset`` and ``ConcatDataset`` wrappers (:func:`cached_inside`); leaves of other classes are kept as
they are. Where the wrappers hold several leaves, each reads and writes the one store under keys of
its own (:class:`Scoped`): two shards' ``decode(3)`` are two items.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placer.executor.stream.store import CachedItems, SampleStore, is_plain
from placer.stream.wrappers import kind, leaves, rebuilt




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


class Scoped:
    """A view of a store whose keys are prefixed by ``tag`` (a leaf's number): leaves that share the store
    keep their keys apart. It pickles with its store, to worker processes too."""

    def __init__(self, store: SampleStore, tag: Any):
        self.store, self.tag = store, tag

    def get(self, key: Any) -> tuple[bool, Any]:
        return self.store.get((self.tag, key))

    def put(self, key: Any, value: Any) -> bool:
        return self.store.put((self.tag, key), value)


def cached_inside(dataset: Any, method: str, store: SampleStore) -> Any:
    """``dataset`` (a loader's, wrappers and all) with ``method`` (``Class.attribute``) cached in each leaf of
    that class (:func:`cached`), inside copies of its wrappers; the user's objects are not changed."""
    cls, attribute = method.rsplit(".", 1)
    many = len(leaves(dataset)) > 1

    def replace(leaf: Any, number: int) -> Any:
        if type(leaf).__name__ != cls:
            return leaf
        return cached(leaf, attribute, Scoped(store, number) if many else store)

    return rebuilt(dataset, replace)


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
    #: the ``Subset`` and ``ConcatDataset`` wrappers in the loader's dataset (outermost first): the cache goes
    #: inside copies of them, in the leaves of ``dataset``'s class
    wrappers: list[Any] = field(default_factory=list, repr=False)
    #: the share of the next epoch's calls that repeat the arguments of the epoch before (measured)
    hit_rate: float | None = None
    #: the loader's own dataset (``dataset`` inside its wrappers; ``dataset`` is its first leaf of the class)
    outer: Any = field(default=None, repr=False)
    #: where the run it is weighed over does not pay for it: the fewest epochs that do (None: none within
    #: a thousand), and the run's speed-up with it over some epoch counts
    pays_from_epochs: int | None = None
    by_epochs: dict[int, float] = field(default_factory=dict)
    #: inside wrappers: the leaves that hold the cache (of ``dataset``'s class) and all the leaves
    leaves: tuple[int, int] | None = None

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
        if self.leaves is not None and self.leaves[1] > 1:  # several datasets: inside a concatenation
            where = next((type(w).__name__ for w in self.wrappers if kind(w) == "ConcatDataset"), "ConcatDataset")
            which = "each" if self.leaves[0] == self.leaves[1] else f"{self.leaves[0]}"
            what += f" in {which} of the {self.leaves[1]} datasets inside the {where}"
        if not self.recommended:
            return f"Caching: not offered: {self.reason}"
        if self.pays_from_epochs is not None and self.by_epochs:
            over = "; ".join(f"over {k} epoch{'s' if k != 1 else ''} {v:.2f}x" for k, v in self.by_epochs.items())
            return (f"{what} ({fmt_bytes(self.bytes)}) makes epochs 2+ {self.epoch_speedup:.1f}x faster; your run, "
                    f"as one epoch, fills it and gains nothing; it pays from {self.pays_from_epochs} epochs ({over}; "
                    "advice.loader() applies it: pass epochs= to have it weighed over your run)")
        return (f"{what} ({fmt_bytes(self.bytes)}) makes epochs 2+ {self.epoch_speedup:.1f}x faster "
                f"(two epochs {self.two_epoch_speedup:.2f}x; advice.loader() applies it)")

    def apply(self, dataset: Any | None = None, store: SampleStore | None = None) -> Any:
        """The loader's dataset (or ``dataset``, one of the same shape) with the cache inside, in the leaves of
        the class it was found in and copies of the same ``Subset`` and ``ConcatDataset`` wrappers
        (:func:`cached_inside`): in ``store``, or a new, empty store bounded by the budget (the caller
        that passes ``store`` closes it)."""
        if self.attribute is None:
            raise ValueError("no cache was found for this dataset")
        if dataset is None:
            dataset = self.outer if self.outer is not None else self.dataset
        store = SampleStore(self.budget_bytes) if store is None else store
        return cached_inside(dataset, self.method, store)

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
                "reason": self.reason, "steps": list(self.steps),
                "hit_rate": None if self.hit_rate is None else round(self.hit_rate, 4),
                "inside": [type(w).__name__ for w in self.wrappers],
                "leaves": self.leaves,
                "pays_from_epochs": self.pays_from_epochs,
                "by_epochs": {str(k): v for k, v in self.by_epochs.items()}}


def fmt_bytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


@dataclass
class MethodCandidate:
    name: str
    share: float
    calls_per_item: float
    seconds_per_item: float
