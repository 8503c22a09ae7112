"""Whether a cache keyed by a method's arguments will hit: measured on the sampler's next epochs.

May import: placer.executor.stream.store, placer.stream.wrappers, placer.timing; torch inside functions.

A method pure in its arguments (:mod:`placer.stream.purity`) may be cached by their
values, as ``functools.lru_cache`` or joblib's ``Memory`` key a call; whether that cache
hits depends on whether the next epoch calls it with arguments it has seen, not on the
layout of the sampler's keys. :func:`hit_rate` measures it: a copy of the sampler is run
for the next two epochs (the epoch advanced between them as a script advances it), and
``dataset[key]`` is run on their keys only up to the method's call (:func:`arguments`).
A key ``(index, epoch)`` or ``(epoch, index)`` whose epoch reaches the argument hits
nothing; a decode by the index alone hits every item, whatever the key looks like.

The loader's shapes: automatic batching (keys from the batch sampler), ``batch_size=None``
(each item a chunk: the sampler's keys one by one, :func:`batched`), datasets inside
``Subset`` and ``ConcatDataset`` wrappers (the keys of the loader's dataset run through the
wrappers to the leaf they reach, :mod:`placer.stream.wrappers`; a call's arguments are
counted with the leaf that made it, as two shards' ``decode(3)`` are two items), and a
dataset with its own ``__getitems__`` (the loader hands it each batch's keys at once,
:func:`fetches_batches`): there a batch runs whole, its calls of the method computed rather
than cut short at the first, since the rest of the batch's calls come after it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from placer.executor.stream.store import is_plain, plain_key
from placer.stream.wrappers import Batch, fetched, items_in, kind, leaf_class, leaves, locate, probed
from placer.timing import Deadline

#: a cache is offered only where at least this share of the next epoch's calls repeat the arguments of the
#: epoch before: below it, most of every epoch still computes (and fills a cache it seldom reads)
MIN_HITS = 0.5
#: keys of the first of the two epochs whose arguments are computed, and keys of the second checked against them
HIT_KEYS, HIT_SAMPLE = 4096, 256


def batched(loader: Any) -> bool:
    """Whether the loader batches items itself (automatic batching): else each item is a batch."""
    return getattr(loader, "batch_sampler", None) is not None


def key_source(loader: Any) -> Any:
    """What the loader draws its keys from: its batch sampler, or its sampler with ``batch_size=None``."""
    return loader.batch_sampler if batched(loader) else getattr(loader, "sampler", None)


def copied(source: Any, loader: Any) -> Any:
    """A copy of a sampler to draw keys from, so the user's (its generator, its epoch) moves not at all;
    the datasets it refers to (a ``RandomSampler``'s ``data_source``) are shared, not copied. The sampler
    itself where it cannot be copied."""
    shared = {}
    ds = getattr(loader, "dataset", None)
    while ds is not None and id(ds) not in shared:
        shared[id(ds)] = ds
        ds = getattr(ds, "dataset", None)
    try:
        return copy.deepcopy(source, memo=shared)
    except Exception:  # noqa: BLE001 - a sampler holding an open file or the like
        return source


def advance_epoch(obj: Any) -> None:
    """One epoch on, as a script moves a sampler or dataset between epochs: ``set_epoch(epoch + 1)``, or
    ``epoch += 1`` for an integer ``epoch`` attribute (nothing for objects with neither)."""
    if obj is None:
        return
    epoch = getattr(obj, "epoch", None)
    if callable(getattr(obj, "set_epoch", None)):
        obj.set_epoch((epoch if isinstance(epoch, int) else 0) + 1)
    elif isinstance(epoch, int) and not isinstance(epoch, bool):
        obj.epoch = epoch + 1


def fetches_batches(loader: Any) -> bool:
    """Whether the loader hands each batch's keys to its dataset at once (``dataset.__getitems__``, as
    torch's ``_MapDatasetFetcher`` does under automatic batching) to a method of the user's: the dataset,
    or the one under its ``Subset`` wrappers (which pass the keys on), defines ``__getitems__``."""
    ds = getattr(loader, "dataset", None)
    if not batched(loader) or not getattr(ds, "__getitems__", None):
        return False
    while kind(ds) == "Subset":
        ds = ds.dataset
    return kind(ds) is None and callable(getattr(ds, "__getitems__", None))


def units(loader: Any, batches: list[list[Any]]) -> list[Any]:
    """What the loader fetches at a time from its batches' keys: each key, or each batch as a
    :class:`~placer.stream.wrappers.Batch` where the dataset takes them at once (:func:`fetches_batches`)."""
    if fetches_batches(loader):
        return [Batch(b) for b in batches]
    return [k for b in batches for k in b]


def next_epochs(loader: Any, limit: int = HIT_KEYS,
                keep: Callable[[Any], bool] | None = None) -> tuple[list[Any], int, list[Any]]:
    """Keys of the loader's next two epochs, as it fetches them (:func:`units`), those ``keep`` keeps (all
    by default): the first epoch's first ones up to ``limit`` items, its length in items, and the second's
    first ones up to ``limit`` items.
    Drawn from a copy of the sampler (:func:`copied`), the epoch advanced between them
    (:func:`advance_epoch`); where the sampler cannot be copied, its ``epoch`` is put back."""
    source = copied(key_source(loader), loader)
    saved = getattr(source, "epoch", None)
    epochs = []
    for e in range(2):
        if e:
            advance_epoch(source)
            advance_epoch(getattr(source, "sampler", None))
        keys: list[Any] = []
        total = taken = 0
        for b in source:
            unit = [u for u in units(loader, [list(b) if batched(loader) else [b]]) if keep is None or keep(u)]
            total += items_in(unit)
            if taken < limit:
                keys += unit
                taken += items_in(unit)
        epochs.append((keys, total))
    if source is key_source(loader) and isinstance(saved, int):
        source.epoch = saved
    return epochs[0][0], epochs[0][1], epochs[1][0]


class _Reached(Exception):
    """Raised by a probe at the call it waits for: the rest of ``__getitem__`` is not run."""


def arguments(dataset: Any, name: str, keys: list[Any], *, later: bool = False, cls: type | None = None) -> list[Any]:
    """The arguments ``name`` (a method, ``__getitem__`` or a transform prefix ``attr[:k]``) of the leaves of
    class ``cls`` (default: the first leaf's) is called with, as ``(leaf number, plain data)`` (None where it
    is not called or its arguments are not plain): for a key, its first call, running ``dataset[key]`` only
    up to it; for a :class:`~placer.stream.wrappers.Batch`, every call the batch makes (the whole batch
    runs, the method computed), or one None where it makes none. ``later``: with the leaves' epoch
    advanced (:func:`advance_epoch`), as in the epoch after."""
    if name == "__getitem__":
        return [plain_key(locate(dataset, k)) if is_plain((k,)) else None for k in keys]
    cls = leaf_class(dataset) if cls is None else cls
    seen: list[Any] = []

    def make(leaf: Any, number: int) -> Any:
        original = getattr(leaf, name.split("[", 1)[0])
        if later:
            advance_epoch(leaf)

        def reached(*args: Any, **kwargs: Any) -> Any:
            call = (args, sorted(kwargs.items()))
            seen.append((number, plain_key(call)) if is_plain(call) else None)
            if whole:
                return original(*args, **kwargs)
            raise _Reached

        return reached

    probe = probed(dataset, cls, name.split("[", 1)[0], make)
    out = []
    for key in keys:
        seen.clear()
        whole = isinstance(key, Batch)
        try:
            fetched(probe, key)
        except _Reached:
            pass
        out += (seen if whole else seen[:1]) or [None]
    return out


def hit_rate(dataset: Any, name: str, loader: Any, deadline: Deadline, *, cls: type | None = None) -> tuple[float, int]:
    """The share of the next-but-one epoch's calls of ``name`` (on the leaves of ``cls``, inside ``dataset``,
    the loader's dataset) whose arguments the next epoch's calls had, and the number of items it was
    measured on. Where the first epoch is longer than what was computed (``HIT_KEYS`` items, or less when
    ``deadline`` passes), the share found is scaled by the part computed: a shuffled epoch's sample hits
    what that part held. The caller keeps the global random generators (``dataset[key]`` runs up to the
    call, and an unseeded sampler draws from torch's). Keys that reach leaves of other classes are left out:
    they make no call of ``name``."""
    cls = leaf_class(dataset) if cls is None else cls
    ends = leaves(dataset)
    first, total, second = next_epochs(
        loader, keep=lambda k: isinstance(k, Batch) or type(ends[locate(dataset, k)[0]]) is cls)
    per = max(1, items_in(second) // max(len(second), 1))  # items a unit fetches
    n = max(1, HIT_SAMPLE // per)
    sample = second[:: max(1, len(second) // n)][:n]
    whole = any(isinstance(u, Batch) for u in first)  # batches compute their calls: half the time for each epoch
    until = Deadline(deadline.left() / 2) if whole else deadline
    seen = set()
    done = taken = 0
    while taken < len(first) and not (done and until.passed()):
        chunk = first[taken:taken + n]
        seen.update(a for a in arguments(dataset, name, chunk, cls=cls) if a is not None)
        taken += len(chunk)
        done += items_in(chunk)
    later: list[Any] = []
    step = 1 if whole else max(len(sample), 1)
    for i in range(0, len(sample), step):
        if later and deadline.passed():
            sample = sample[:i]
            break
        later += arguments(dataset, name, sample[i:i + step], later=True, cls=cls)
    if not later:
        return 0.0, done
    hits = sum(a is not None and a in seen for a in later)
    part = done / max(total, 1)
    return min(1.0, hits / len(later) / max(part, 1e-12)), done + items_in(sample)
