"""A bounded cache of values by key that every process holding it shares: one file per key.

May import: placer.digest (inside a function); the standard library otherwise.

:class:`SampleStore` keeps each value as a pickle in a folder of its own, in shared
memory (``/dev/shm``) where the machine has it, else in the temporary folder. The
store itself is that folder's path, its bound and a counter file: it pickles as
such, so a Dataset that holds one can go to DataLoader worker processes (forked or
spawned, persistent or not) and each of them reads what any other wrote. A value is
written once, atomically (a temporary file renamed into place), so a reader sees a
whole value or none; two processes that compute the same key both write it, and
the last rename wins (equal values: the code cached is deterministic). The bytes
written are counted in a file under a lock (``fcntl.flock``); past ``limit_bytes``
nothing more is written and later reads of unwritten keys compute again. The
folder is removed when the store that made it is collected or the process exits.

Keys are plain data only (``None``, booleans, numbers, strings, bytes, paths and
tuples or lists of them), so that two keys are the same exactly when their text
is: a key whose ``repr`` could hide its content is refused (``TypeError``).

:class:`CachedItems` is a map-style dataset read through a store, by index;
:func:`cached_items` puts one under a ``Subset`` (a source that reshuffles by taking
a new permutation of a dataset each epoch), keyed by the index in the dataset beneath.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pickle
import shutil
import tempfile
import weakref
from pathlib import PurePath
from typing import Any

log = logging.getLogger(__name__)

_PLAIN = (type(None), bool, int, float, str, bytes)


def plain_key(key: Any) -> Any:
    """``key`` as plain data (numpy scalars as numbers, lists as tuples); ``TypeError`` if it is not plain."""
    if isinstance(key, _PLAIN):
        return key
    if isinstance(key, PurePath):
        return str(key)
    if isinstance(key, (tuple, list)):
        return tuple(plain_key(k) for k in key)
    item = getattr(key, "item", None)  # a numpy or torch scalar
    if callable(item) and getattr(key, "ndim", None) == 0:
        return plain_key(item())
    raise TypeError(f"a cache key must be plain data (numbers, strings, paths, tuples of them), not "
                    f"{type(key).__name__}")


def is_plain(key: Any) -> bool:
    try:
        plain_key(key)
    except TypeError:
        return False
    return True


def _shared_folder() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _remove(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child that inherited the store leaves it to its owner
        shutil.rmtree(folder, ignore_errors=True)


class SampleStore:
    """Values by plain key, shared by every process that holds this store; at most ``limit_bytes`` kept.

    Parameters
    ----------
    limit_bytes : int
        The most bytes of pickled values the store writes.
    folder : str, optional
        Where the folder of files is made; default ``/dev/shm`` (the temporary folder without it).

    Examples
    --------
    >>> s = SampleStore(1 << 20)
    >>> s.get(("features", 3))
    (False, None)
    >>> s.put(("features", 3), [1.0, 2.0])
    True
    >>> s.get(("features", 3))
    (True, [1.0, 2.0])
    >>> s.close()
    """

    def __init__(self, limit_bytes: int, folder: str | None = None):
        self.limit_bytes = int(limit_bytes)
        self.folder = tempfile.mkdtemp(prefix="placer-cache-", dir=folder or _shared_folder())
        self.counter = os.path.join(self.folder, ".bytes")
        with open(self.counter, "w") as f:
            f.write("0")
        self._finalizer = weakref.finalize(self, _remove, self.folder, os.getpid())

    def __getstate__(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit_bytes, "folder": self.folder, "counter": self.counter}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._finalizer = None  # a copy in another process: the owner removes the folder

    def path(self, key: Any) -> str:
        name = hashlib.blake2b(repr(plain_key(key)).encode(), digest_size=16).hexdigest()
        return os.path.join(self.folder, name)

    def get(self, key: Any) -> tuple[bool, Any]:
        """``(True, value)`` when ``key`` was written (by any process), else ``(False, None)``."""
        try:
            with open(self.path(key), "rb") as f:
                return True, pickle.load(f)
        except FileNotFoundError:
            return False, None

    def put(self, key: Any, value: Any) -> bool:
        """Write ``value`` under ``key`` unless the bound would be passed; return whether it was written."""
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._reserve(len(data)):
            return False
        path = self.path(key)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def _reserve(self, size: int) -> bool:
        try:
            with open(self.counter, "r+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                used = int(f.read() or 0)
                if used + size > self.limit_bytes:
                    return False
                f.seek(0)
                f.write(str(used + size))
                f.truncate()
                return True
        except FileNotFoundError:  # the store was closed
            return False

    @property
    def bytes(self) -> int:
        """Bytes written so far (by every process)."""
        try:
            with open(self.counter) as f:
                return int(f.read() or 0)
        except FileNotFoundError:
            return 0

    def __len__(self) -> int:
        try:
            return sum(1 for n in os.listdir(self.folder) if not n.startswith("."))
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        """Remove the folder now (in the process that made the store)."""
        if self._finalizer is not None:
            self._finalizer()



class CachedItems:
    """A dataset whose items are kept in a store after their first read (the key is the item's index).

    Other attributes are the wrapped dataset's. With ``verify``, the first ``verify``
    items read back from the store (in each process) are also read from the dataset
    and compared (:func:`placer.digest.compare_outputs`): a dataset whose item ``i``
    is not the same as when it was kept (a source that reshuffles by re-indexing
    rather than by its sampler) fails with ``ValueError`` instead of feeding stale items.
    """

    def __init__(self, dataset: Any, store: SampleStore, verify: int = 0, name: str = "the dataset"):
        self.dataset, self.store, self.verify, self.name = dataset, store, verify, name

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        found, value = self.store.get(("__getitem__", index))
        if found:
            if self.verify > 0:
                self.verify -= 1
                self._check(index, value)
            return value
        value = self.dataset[index]
        self.store.put(("__getitem__", index), value)
        return value

    def _check(self, index: Any, kept: Any) -> None:
        from placer.digest import compare_outputs

        diff = compare_outputs({"item": kept}, {"item": self.dataset[index]})
        if diff is not None:
            raise ValueError(f"{self.name}'s item {index!r} differs from the one cached in an earlier epoch "
                             f"({diff}): a cache keyed by index needs item i to be the same sample in every "
                             "epoch (reshuffle with the sampler, not by re-indexing), or drop the cache point")

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "store", "verify", "name") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def cached_items(dataset: Any, store: SampleStore, verify: int = 0, name: str = "the dataset") -> Any:
    """``dataset`` read through ``store``; a ``torch.utils.data.Subset`` keeps its indices over the cached dataset."""
    cls = type(dataset)
    if cls.__name__ == "Subset" and cls.__module__.startswith("torch.utils.data"):
        return cls(cached_items(dataset.dataset, store, verify, name), dataset.indices)
    return CachedItems(dataset, store, verify=verify, name=name)
