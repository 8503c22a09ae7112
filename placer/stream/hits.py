"""Whether a cache keyed by a method's arguments will hit: measured on the sampler's next epochs.

May import: placer.executor.stream.store, placer.timing; torch inside functions.

A method pure in its arguments (:mod:`placer.stream.purity`) may be cached by their
values, as ``functools.lru_cache`` or joblib's ``Memory`` key a call; whether that cache
hits depends on whether the next epoch calls it with arguments it has seen, not on the
layout of the sampler's keys. :func:`hit_rate` measures it: a copy of the sampler is run
for the next two epochs (the epoch advanced between them as a script advances it), and
``dataset[key]`` is run on their keys only up to the method's call (:func:`arguments`).
A key ``(index, epoch)`` or ``(epoch, index)`` whose epoch reaches the argument hits
nothing; a decode by the index alone hits every item, whatever the key looks like.

The loader's shapes: automatic batching (keys from the batch sampler), ``batch_size=None``
(each item a chunk: the sampler's keys one by one, :func:`batched`), and a dataset inside
``Subset`` wrappers (a train/validation split: :func:`unwrapped`, keys through the
subsets' indices with :func:`inner_key`, the cached dataset put back inside copies of the
same wrappers with :func:`rewrapped`).
"""

from __future__ import annotations

import copy
from typing import Any

from placer.executor.stream.store import is_plain, plain_key
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


def next_epochs(loader: Any, limit: int = HIT_KEYS) -> tuple[list[Any], int, list[Any]]:
    """Keys of the loader's next two epochs: the first epoch's first ``limit`` keys, its length, and the
    second's first ``limit`` keys. Drawn from a copy of the sampler (:func:`copied`), the epoch advanced
    between them (:func:`advance_epoch`); where the sampler cannot be copied, its ``epoch`` is put back."""
    source = copied(key_source(loader), loader)
    saved = getattr(source, "epoch", None)
    epochs = []
    for e in range(2):
        if e:
            advance_epoch(source)
            advance_epoch(getattr(source, "sampler", None))
        keys: list[Any] = []
        total = 0
        for b in source:
            for k in (b if batched(loader) else [b]):
                total += 1
                if len(keys) < limit:
                    keys.append(k)
        epochs.append((keys, total))
    if source is key_source(loader) and isinstance(saved, int):
        source.epoch = saved
    return epochs[0][0], epochs[0][1], epochs[1][0]


def unwrapped(dataset: Any) -> tuple[Any, list[Any]]:
    """The dataset inside ``Subset`` wrappers (a train/validation split), and the wrappers, outermost first."""
    from torch.utils.data import Subset

    wrappers = []
    while isinstance(dataset, Subset):
        wrappers.append(dataset)
        dataset = dataset.dataset
    return dataset, wrappers


def inner_key(wrappers: list[Any], key: Any) -> Any:
    """A key of the outermost wrapper as the inner dataset's key (through each subset's indices)."""
    for w in wrappers:
        key = w.indices[key]
    return key


def rewrapped(wrappers: list[Any], inner: Any) -> Any:
    """Copies of ``wrappers`` around ``inner`` instead of the dataset they wrapped."""
    for w in reversed(wrappers):
        outer = copy.copy(w)
        outer.dataset = inner
        inner = outer
    return inner


class _Reached(Exception):
    """Raised by a probe at the call it waits for: the rest of ``__getitem__`` is not run."""


def arguments(dataset: Any, name: str, keys: list[Any], *, later: bool = False) -> list[Any]:
    """The arguments ``name`` (a method, ``__getitem__`` or a transform prefix ``attr[:k]``) is first
    called with for each key, as plain data (None where it is not called or its arguments are not
    plain), running ``dataset[key]`` only up to that call. ``later``: with the dataset's epoch advanced
    (:func:`advance_epoch`), as in the epoch after."""
    if name == "__getitem__":
        return [plain_key((k,)) if is_plain((k,)) else None for k in keys]
    probe = copy.copy(dataset)
    if later:
        advance_epoch(probe)
    seen: list[Any] = []

    def reached(*args: Any, **kwargs: Any) -> Any:
        call = (args, sorted(kwargs.items()))
        seen.append(plain_key(call) if is_plain(call) else None)
        raise _Reached

    setattr(probe, name.split("[", 1)[0], reached)
    out = []
    for key in keys:
        seen.clear()
        try:
            probe[key]
        except _Reached:
            pass
        out.append(seen[0] if seen else None)
    return out


def hit_rate(dataset: Any, name: str, loader: Any, wrappers: list[Any], deadline: Deadline) -> tuple[float, int]:
    """The share of the next-but-one epoch's calls of ``name`` whose arguments the next epoch's calls had,
    and the number of keys it was measured on. Where the first epoch is longer than what was computed
    (``HIT_KEYS``, or less when ``deadline`` passes), the share found is scaled by the part computed: a
    shuffled epoch's sample hits what that part held. The caller keeps the global random generators
    (``dataset[key]`` runs up to the call, and an unseeded sampler draws from torch's)."""
    first, total, second = next_epochs(loader)
    sample = second[:: max(1, len(second) // HIT_SAMPLE)][:HIT_SAMPLE]
    seen = set()
    done = 0
    while done < len(first) and not (done and deadline.passed()):
        chunk = first[done:done + HIT_SAMPLE]
        seen.update(a for a in arguments(dataset, name, [inner_key(wrappers, k) for k in chunk]) if a is not None)
        done += len(chunk)
    later = arguments(dataset, name, [inner_key(wrappers, k) for k in sample], later=True)
    if not sample:
        return 0.0, done
    hits = sum(a is not None and a in seen for a in later)
    part = done / max(total, 1)
    return min(1.0, hits / len(sample) / max(part, 1e-12)), done + len(sample)
