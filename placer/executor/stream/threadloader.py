"""A DataLoader whose workers are threads: a drop-in replacement where threads beat processes.

May import: placer.data.stream; torch inside functions.

:class:`ThreadLoader` reads a map-style dataset with a pool of threads in the main
process. It keeps a DataLoader's attributes (``dataset``, ``batch_size``,
``sampler``, ``batch_sampler``, ``collate_fn``, ``generator``, ``drop_last``,
``num_workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``) and
yields the batches a ``DataLoader(num_workers=0)`` with the same arguments yields,
in the same order: its indices come from that loader's own iterator (the same
sampler, the same draw of the base seed from the same generator), and every batch
is fetched by that iterator's fetcher (``dataset[i]`` for each index, then the
collate function). Threads win where ``__getitem__`` releases the GIL (numpy,
PIL, file reads, torch ops) or waits, and where starting worker processes and
copying their batches back costs more than it saves. The dataset is read from
several threads at once: a dataset whose ``__getitem__`` changes shared state
must guard it.
"""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from placer.data.stream import LoaderSettings


class ThreadLoader:
    """Batches of a map-style dataset built by ``num_workers`` threads, ``prefetch_factor`` each in flight.

    Parameters
    ----------
    dataset, batch_size, shuffle, sampler, batch_sampler, collate_fn, drop_last, generator, pin_memory
        As :class:`torch.utils.data.DataLoader` takes them.
    num_workers : int
        Threads fetching batches (at least 1).
    prefetch_factor : int
        Batches in flight per thread (default 2).

    Examples
    --------
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> data = [torch.tensor([i]) for i in range(10)]
    >>> a = [b.tolist() for b in DataLoader(data, batch_size=4)]
    >>> b = [b.tolist() for b in ThreadLoader(data, batch_size=4, num_workers=2)]
    >>> a == b
    True
    """

    #: what :meth:`placer.data.stream.LoaderSettings.of` reads: the workers are threads
    worker_threads = True
    #: worker threads live as long as one pass; there is nothing to keep between epochs
    persistent_workers = False
    timeout = 0
    multiprocessing_context = None
    worker_init_fn = None
    in_order = True

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int = 1, collate_fn: Any = None, pin_memory: bool = False,
                 drop_last: bool = False, prefetch_factor: int | None = 2, generator: Any = None):
        from torch.utils.data import DataLoader, IterableDataset

        if isinstance(dataset, IterableDataset):
            raise ValueError("ThreadLoader reads map-style datasets (with __getitem__ and __len__); an "
                             "IterableDataset keeps its DataLoader with worker processes")
        if num_workers < 1:
            raise ValueError(f"ThreadLoader needs num_workers >= 1 (got {num_workers}): with none, use the "
                             "DataLoader itself")
        if prefetch_factor is not None and prefetch_factor < 1:
            raise ValueError(f"ThreadLoader needs prefetch_factor >= 1 (got {prefetch_factor})")
        # the indices, the seed draw and the fetching are those of a loader without workers
        self._base = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                                batch_sampler=batch_sampler, num_workers=0, collate_fn=collate_fn,
                                pin_memory=False, drop_last=drop_last, generator=generator)
        self.num_workers = int(num_workers)
        self.prefetch_factor = int(prefetch_factor or 2)
        self.pin_memory = bool(pin_memory)

    # the DataLoader's attributes, as rebuilding and measuring read them
    dataset = property(lambda self: self._base.dataset)
    batch_size = property(lambda self: self._base.batch_size)
    sampler = property(lambda self: self._base.sampler)
    batch_sampler = property(lambda self: self._base.batch_sampler)
    collate_fn = property(lambda self: self._base.collate_fn)
    drop_last = property(lambda self: self._base.drop_last)
    generator = property(lambda self: self._base.generator)

    def __len__(self) -> int:
        return len(self._base)

    def __iter__(self):
        it = iter(self._base)  # draws the base seed and starts the sampler, as a DataLoader's pass does
        fetch = it._dataset_fetcher.fetch

        def batch(index: Any) -> Any:
            data = fetch(index)
            if self.pin_memory:
                from torch.utils.data._utils.pin_memory import pin_memory
                data = pin_memory(data)
            return data

        depth = self.num_workers * self.prefetch_factor
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="ThreadLoader")
        pending: collections.deque = collections.deque()
        try:
            for index in iter(it._next_index, None):
                pending.append(pool.submit(batch, index))
                if len(pending) >= depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def settings(self) -> LoaderSettings:
        """These settings in the drop-in's terms (thread workers)."""
        return LoaderSettings(num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                              pin_memory=self.pin_memory, worker_threads=True)
