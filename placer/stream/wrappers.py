"""Where a loader's keys land: the user's datasets inside torch's ``Subset`` and ``ConcatDataset`` wrappers.

May import: torch inside functions.

A split (``Subset``) maps a key through its ``indices``; a concatenation (``ConcatDataset``)
maps it to one of its ``datasets`` and an index inside that one through its
``cumulative_sizes``, as torch's own ``ConcatDataset.__getitem__`` does with ``bisect``. The
datasets at the ends, the *leaves*, hold the user's code: the cache search profiles, checks
and probes them through the wrappers (:func:`locate`, :func:`probed`), and the cache is put
back into copies of the same wrappers around copies of the leaves (:func:`rebuilt`), so
that the user's objects never change. A wrapper is walked into only where its class keeps
torch's ``__getitem__`` (a subclass that maps keys its own way is a leaf).

A loader whose dataset defines ``__getitems__`` is handed each batch's keys at once
(torch's ``_MapDatasetFetcher`` calls ``dataset.__getitems__(indices)`` under automatic
batching, a ``Subset`` passing them on to its dataset's): such a batch is a :class:`Batch`
of keys, and :func:`fetched` fetches an item or a batch as the loader would.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable
from typing import Any


class Batch(tuple):
    """The keys of one batch, which the loader fetches at once with ``dataset.__getitems__``."""


def fetched(dataset: Any, key: Any) -> Any:
    """``dataset[key]``, or ``dataset.__getitems__(list(key))`` for a :class:`Batch`, as the loader fetches it."""
    return dataset.__getitems__(list(key)) if isinstance(key, Batch) else dataset[key]


def items_in(keys: list[Any]) -> int:
    """How many items ``keys`` fetch (a :class:`Batch` counts its keys)."""
    return sum(len(k) if isinstance(k, Batch) else 1 for k in keys)


def kind(dataset: Any) -> str | None:
    """``"Subset"`` or ``"ConcatDataset"`` for a wrapper walked into (one keeping torch's ``__getitem__``,
    and a ``Subset`` its ``__getitems__``), else None (a leaf)."""
    from torch.utils.data import ConcatDataset, Subset

    t = type(dataset)
    if isinstance(dataset, Subset) and t.__getitem__ is Subset.__getitem__ and t.__getitems__ is Subset.__getitems__:
        return "Subset"
    if isinstance(dataset, ConcatDataset) and t.__getitem__ is ConcatDataset.__getitem__:
        return "ConcatDataset"
    return None


def children(dataset: Any) -> list[Any]:
    """The datasets a wrapper holds (none for a leaf)."""
    k = kind(dataset)
    return [dataset.dataset] if k == "Subset" else list(dataset.datasets) if k == "ConcatDataset" else []


def _walk(dataset: Any, seen: set[int]) -> list[Any]:
    """Every dataset under ``dataset`` (itself first, depth first), each once."""
    if id(dataset) in seen:
        return []
    seen.add(id(dataset))
    out = [dataset]
    for child in children(dataset):
        out += _walk(child, seen)
    return out


def leaves(dataset: Any) -> list[Any]:
    """The datasets at the ends of the wrappers, each once, in the order keys reach them (depth first);
    ``[dataset]`` for a dataset that is no wrapper."""
    return [d for d in _walk(dataset, set()) if kind(d) is None]


def wrappers(dataset: Any) -> list[Any]:
    """The wrappers walked into, outermost first (depth first)."""
    return [d for d in _walk(dataset, set()) if kind(d) is not None]


def leaf_class(dataset: Any) -> type:
    """The class of the first leaf."""
    return type(leaves(dataset)[0])


def locate(dataset: Any, key: Any) -> tuple[int, Any]:
    """The leaf a key of ``dataset`` reaches (its number in :func:`leaves`) and the key inside it."""
    numbers = {id(leaf): n for n, leaf in enumerate(leaves(dataset))}
    while kind(dataset) is not None:
        if kind(dataset) == "Subset":
            key, dataset = dataset.indices[key], dataset.dataset
            continue
        sizes = dataset.cumulative_sizes
        if key < 0:
            key += sizes[-1]
        at = bisect.bisect_right(sizes, key)
        key, dataset = (key - sizes[at - 1] if at else key), dataset.datasets[at]
    return numbers[id(dataset)], key


def rebuilt(dataset: Any, replace: Callable[[Any, int], Any]) -> Any:
    """Copies of the wrappers around ``replace(leaf, number)`` for each leaf (one call per leaf, however
    often the wrappers hold it); the user's wrappers and leaves are not changed."""
    numbers = {id(leaf): n for n, leaf in enumerate(leaves(dataset))}
    memo: dict[int, Any] = {}

    def walk(ds: Any) -> Any:
        if id(ds) not in memo:
            k = kind(ds)
            if k is None:
                memo[id(ds)] = replace(ds, numbers[id(ds)])
            else:
                out = copy.copy(ds)
                if k == "Subset":
                    out.dataset = walk(ds.dataset)
                else:
                    out.datasets = [walk(d) for d in ds.datasets]
                memo[id(ds)] = out
        return memo[id(ds)]

    return walk(dataset)


def probed(dataset: Any, cls: type, name: str, make: Callable[[Any, int], Any]) -> Any:
    """``dataset`` rebuilt (:func:`rebuilt`) with each leaf of class ``cls`` a shallow copy whose attribute
    ``name`` is ``make(copy, number)`` (``make`` sees the copy before the attribute is set); other leaves
    are kept as they are."""

    def replace(leaf: Any, number: int) -> Any:
        if type(leaf) is not cls:
            return leaf
        probe = copy.copy(leaf)
        setattr(probe, name, make(probe, number))
        return probe

    return rebuilt(dataset, replace)

