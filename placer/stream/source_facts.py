"""What a stream's source is (a DataLoader, a Dataset, an iterable), how long an epoch is, and what reading
it again from a cache would cost.

May import: placer.data.stream, placer.log, placer.pipeline, placer.timing, placer.executor.stream.*,
placer.stream.sweep;
placer.stream.purity inside functions.
"""

from __future__ import annotations

import math
import sys
from typing import Any


from placer.data.stream import LoaderSettings
from placer.log import get_logger
from placer.timing import Clock, Deadline
from placer.pipeline import BATCH_INFO
from placer.executor.stream.nodes import takes
from placer.executor.stream.source import call_source, describe_source
from placer.stream.sweep import Profiler

log = get_logger(__name__)


def source_facts(prof: Profiler, spb: float) -> tuple[str, LoaderSettings | None, int | None, Any]:
    """What the source returns, a DataLoader's own settings, the batches of one epoch, and the
    source's first epoch's object."""
    p = prof.pipeline
    src = p.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    obj = call_source(src, consts, 0)
    kind = describe_source(obj)
    loader = None
    if kind == "loader":
        loader = LoaderSettings.of(obj).model_copy(update={"batch_size": obj.batch_size})
    per_epoch = None
    if kind == "dataset":
        per_epoch = math.ceil(len(obj) / (src.batch_size or 1))
    elif hasattr(obj, "__len__"):
        per_epoch = len(obj)
    else:
        per_epoch = _count(obj)
    if per_epoch is None and p.size and src.batch_size:
        per_epoch = math.ceil(p.size / src.batch_size)
        prof.notes.append(f"batches per epoch taken from the size: {p.size} / {src.batch_size}")
    return kind, loader, per_epoch, obj


def _count(obj: Any, limit_s: float = 1.0) -> int | None:
    """Batches of an iterable, counted within ``limit_s`` (None when it takes longer)."""
    deadline = Deadline(limit_s)
    n = 0
    for _ in obj:
        n += 1
        if deadline.passed():
            return None
    return n


def called_again(prof: Profiler) -> Any:
    """What the source function returns for the second epoch (None when calling it fails)."""
    src = prof.pipeline.stages[prof.source]
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    try:
        return call_source(src, consts, 1)
    except Exception:  # noqa: BLE001 - the run calls it again and names what fails
        return None


#: reads of one batch's samples from a by-sample cache timed (the least kept)
CACHED_READS = 3


def cached_read(prof: Profiler, obj: Any, kind: str, loader: LoaderSettings | None) -> float | None:
    """Seconds to read one batch's samples back from a cache kept by sample, for a source that
    reshuffles (takes ``batch_info``) and returns a Dataset or DataLoader; None where such a cache
    would not serve (with a note where the reason is the dataset's).

    Its items must be kept by the keys its sampler draws: the keys of the second epoch must be
    keys of the first (a sampler that draws ``(index, epoch)`` would never read a kept item back),
    and the item of a key read twice the same (the first and last keys, compared element by element;
    a random draw per read cannot be kept). The first batch's items are then kept in a
    :class:`~placer.executor.stream.store.SampleStore` (as a cache at the source keeps them) and
    read back and collated (the DataLoader's own ``collate_fn``) :data:`CACHED_READS` times: what
    each epoch after the first costs there. A probe that fails leaves the source uncached.
    """
    src = prof.pipeline.stages[prof.source]
    if kind == "iterable" or src.cache_key is not None or not takes(src.impl_for("cpu").fn, BATCH_INFO):
        return None
    try:
        return _time_cached_read(prof, src, obj, kind, loader)
    except Exception as exc:  # noqa: BLE001 - a probe of the user's dataset must not fail the profile
        prof.notes.append(f"source {prof.source!r}: its samples could not be probed for a cache by sample "
                          f"({type(exc).__name__}: {exc}); not cached")
        return None


def _sample_keys(obj: Any, kind: str) -> tuple[Any, list] | None:
    """The dataset a Dataset or DataLoader source reads and the keys it reads in one epoch, in order."""
    if kind == "loader":
        ds = obj.dataset
        if getattr(obj, "batch_sampler", None) is not None:
            return ds, [k for batch in obj.batch_sampler for k in batch]
        return ds, list(obj.sampler)
    return obj, list(range(len(obj)))


def _time_cached_read(prof: Profiler, src: Any, obj: Any, kind: str, loader: LoaderSettings | None) -> float | None:
    from placer.executor.stream.store import SampleStore
    from placer.stream.purity import equal

    found = _sample_keys(obj, kind)
    if found is None or not found[1]:
        return None
    ds, keys = found
    consts = {a: prof.consts[s] for a, s in src.inputs.items() if s in prof.consts}
    again = _sample_keys(call_source(src, consts, 1), kind)
    seen = {repr(k) for k in keys}
    if again is None or any(repr(k) not in seen for k in again[1]):
        prof.notes.append(f"source {prof.source!r}: its second epoch reads samples its first did not (keys such "
                          f"as {again[1][0]!r} if any): a cache by sample would not be read back; not cached"
                          if again is not None and again[1] else
                          f"source {prof.source!r}: its epochs' samples could not be listed; not cached")
        return None
    for k in (keys[0], keys[-1]):
        if not equal(ds[k], ds[k]):
            prof.notes.append(f"source {prof.source!r}: its item {k!r} read twice differs (random per read): "
                              "its samples cannot be cached by index")
            return None
    collate = getattr(obj, "collate_fn", None) if kind == "loader" else None
    size = (loader.batch_size if loader is not None and loader.batch_size else src.batch_size) or 1
    first = keys[: int(size)]
    store = SampleStore(1 << 40)
    try:
        for k in first:
            store.put(("__getitem__", k), ds[k])
        best = float("inf")
        for _ in range(CACHED_READS):
            with Clock() as c:
                (collate or sys.modules["torch.utils.data"].default_collate)(
                    [store.get(("__getitem__", k))[1] for k in first])
            best = min(best, c.wall)
        return best
    finally:
        store.close()
