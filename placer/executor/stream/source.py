"""A stream's source: what its function returns, turned into batches for each epoch.

May import: placer.pipeline, placer.errors, placer.data.stream, placer.executor.stream.{config,nodes,worker_init};
placer.attrs, placer.executor.stream.threadloader and torch inside functions (only when the source returns a
``Dataset`` or a ``DataLoader``).

A source function returns an iterable of batches (a generator, a list), a
``torch.utils.data.Dataset`` (batched here by a ``DataLoader`` with the stage's
``batch_size`` and the configured workers: worker *processes*, as DataLoader runs
them, or threads where the source's worker kind is ``thread``: a
:class:`~placer.executor.stream.threadloader.ThreadLoader`), or a ``DataLoader``
(every argument but its worker settings is kept, :func:`rebuild_loader`; with
configured workers its worker settings are replaced, else used as given: the user's
own settings are the baseline). :func:`rebuild_loader` is the one place a DataLoader
is rebuilt with other settings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from placer.pipeline import BATCH_INFO, Stage
from placer.data.stream import LoaderSettings
from placer.executor.stream.config import BatchInfo, StreamConfig
from placer.executor.stream.nodes import takes
from placer.executor.stream.worker_init import WorkerThreads


def call_source(stage: Stage, inputs: dict[str, Any], epoch: int) -> Any:
    """Call the source function for ``epoch`` (with ``batch_info`` when it takes it)."""
    impl = stage.impl_for("cpu")
    kwargs = {**inputs, **stage.params}
    if takes(impl.fn, BATCH_INFO):
        kwargs[BATCH_INFO] = BatchInfo(epoch=epoch, index=-1, seq=-1)
    return impl.fn(**kwargs)


def describe_source(obj: Any) -> str:
    """``iterable``, ``dataset`` or ``loader``: what a source function returned."""
    if _is_loader(obj):
        return "loader"
    if _is_dataset(obj):
        return "dataset"
    return "iterable"


def batches(stage: Stage, obj: Any, config: StreamConfig, wrap: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """Iterate one epoch of what the source function returned.

    ``wrap`` replaces a Dataset or DataLoader source's dataset (with a cache of its items).
    """
    kind = describe_source(obj)
    if wrap is not None and kind == "iterable":
        from placer.errors import PipelineError

        raise PipelineError(
            f"cannot cache source {stage.name!r} by sample: it returned {type(obj).__name__}, not a Dataset or "
            "DataLoader; return one, or declare cache_key= on the source and cache after a stage",
            stage=stage.name)
    if kind == "iterable":
        if not hasattr(obj, "__iter__"):
            from placer.errors import PipelineError

            raise PipelineError(
                f"source {stage.name!r} returned {type(obj).__name__}, which is not iterable; return "
                "batches (a generator or list), a torch Dataset or a DataLoader", stage=stage.name)
        return iter(obj)
    return iter(loader_for(stage, obj, config, wrap))


def loader_for(stage: Stage, obj: Any, config: StreamConfig, wrap: Callable[[Any], Any] | None = None) -> Any:
    """The DataLoader a Dataset or DataLoader source runs with under ``config`` (its dataset through ``wrap``)."""
    given = stage.name in config.stage_workers or config.sequential
    data = None if wrap is None else wrap(obj.dataset if _is_loader(obj) else obj)
    if _is_loader(obj) and not given:  # the user's own worker settings (on the wrapped dataset)
        return obj if wrap is None else rebuild_loader(obj, LoaderSettings.of(obj).kwargs(), dataset=data)
    # in a stream the copy node pins batches for a GPU, not the loader; a loader made for one epoch keeps
    # no workers (only :func:`kept_loader`'s do, and the runner stops them)
    settings = LoaderSettings.from_stream(config, stage.name).model_copy(
        update={"pin_memory": False, "persistent_workers": False})
    if _is_loader(obj):
        return rebuild_loader(obj, settings.kwargs(), threads=settings.worker_threads, dataset=data)
    kw = dict(dataset=obj if wrap is None else data, batch_size=stage.batch_size or 1, shuffle=False)
    if settings.worker_threads:  # the same batches, in the same order, read by a pool of threads
        from placer.executor.stream.threadloader import ThreadLoader

        return ThreadLoader(**kw, num_workers=settings.num_workers, prefetch_factor=settings.prefetch_factor)
    from torch.utils.data import DataLoader

    return DataLoader(**kw, **settings.kwargs())


def loader_workers(stage: Stage, obj: Any, config: StreamConfig) -> int:
    """The worker processes of the DataLoader :func:`loader_for` reads ``obj`` with (0 for an iterable, one
    batch at a time, or thread workers): the stream's for the source where it sets them, else the user's
    DataLoader's own."""
    if not (_is_loader(obj) or _is_dataset(obj)):
        return 0
    if stage.name in config.stage_workers or config.sequential:
        settings = LoaderSettings.from_stream(config, stage.name)
        return 0 if settings.worker_threads else settings.num_workers
    return int(obj.num_workers) if _is_loader(obj) else 0


def loader_threads(stage: Stage, obj: Any, config: StreamConfig) -> int:
    """The threads of the thread-pool loader :func:`loader_for` reads ``obj`` with (0 where it reads it with
    a DataLoader, or ``obj`` is an iterable)."""
    if not (_is_loader(obj) or _is_dataset(obj)) or not config.loader_threads(stage.name):
        return 0
    return config.stage_workers[stage.name]


def keeps_workers(stage: Stage, obj: Any, config: StreamConfig) -> bool:
    """Whether the loader for ``obj`` keeps its worker processes between epochs: the settings say so
    (``persistent_workers``), the source has workers, and ``obj`` is a Dataset or a DataLoader whose
    batches come from a batch sampler (:func:`workers_key`)."""
    return (config.persistent_workers and not config.sequential and config.stage_workers.get(stage.name, 0) > 0
            and not config.loader_threads(stage.name) and workers_key(obj) is not None)


def workers_key(obj: Any) -> tuple | None:
    """What worker processes started for ``obj`` hold: equal for two epochs' objects when workers
    started for the first can serve the second. None when ``obj`` cannot keep workers (an iterable,
    an ``IterableDataset``, a DataLoader without a batch sampler).

    Workers hold a copy of the dataset (and the collate and ``worker_init_fn`` functions) made when
    they start: the same dataset object with the same attribute values (a number, a string, or the
    same object, e.g. an epoch the source set) can be served by them; the sampler runs in this
    process, so a new DataLoader with a new sampler each epoch (``set_epoch``) still can.
    """
    from placer.attrs import attribute_values

    kind = describe_source(obj)
    if kind == "iterable":
        return None
    ds = obj.dataset if kind == "loader" else obj
    if any(c.__name__ == "IterableDataset" for c in type(ds).__mro__):
        return None
    if kind == "loader" and obj.batch_sampler is None:
        return None
    state = tuple(v if isinstance(v, (int, float, str, bytes, bool, type(None))) else ("id", id(v))
                  for v in attribute_values(ds))
    if kind == "loader":
        return (id(ds), state, id(obj.collate_fn), id(obj.worker_init_fn), id(obj.generator))
    return (id(ds), state)


class EpochBatches:
    """The batch sampler of a loader whose workers are kept between epochs: each epoch reads the
    batches of that epoch's object (its own sampler, e.g. one set to the epoch)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def batch_sampler_of(stage: Stage, obj: Any) -> Any:
    """The batch sampler one epoch of ``obj`` reads (a DataLoader's own; a Dataset's: in order, batches
    of the stage's ``batch_size``)."""
    if describe_source(obj) == "loader":
        return obj.batch_sampler
    from torch.utils.data import BatchSampler, SequentialSampler

    return BatchSampler(SequentialSampler(obj), stage.batch_size or 1, drop_last=False)


def kept_loader(stage: Stage, obj: Any, config: StreamConfig) -> tuple[Any, EpochBatches]:
    """A DataLoader for ``obj`` whose workers are kept between epochs, and its batch sampler (set
    :attr:`EpochBatches.inner` to a later epoch's :func:`batch_sampler_of`)."""
    batches_of = EpochBatches(batch_sampler_of(stage, obj))
    settings = LoaderSettings.from_stream(config, stage.name).model_copy(
        update={"pin_memory": False, "persistent_workers": True})
    if describe_source(obj) == "loader":
        return rebuild_loader(obj, settings.kwargs(), batch_sampler=batches_of, same_draws=True), batches_of
    return same_draws_loader()(dataset=obj, batch_sampler=batches_of, **settings.kwargs()), batches_of


@functools.cache
def same_draws_loader() -> type:
    """A ``DataLoader`` whose persistent workers leave the random numbers as a loader without them does.

    Each iterator a DataLoader starts draws its workers' base seed from the loader's
    generator (torch's global one without it); persistent workers start one iterator and
    reuse it, so from the second epoch on one number fewer is drawn per epoch, and a
    shuffling sampler on the same generator (or the script's own draws from the global
    one: dropout, augmentation) gets other numbers: other batches than the user's. This
    loader draws that number at every epoch after the first, as a new iterator would.
    """
    import torch
    from torch.utils.data import DataLoader

    class SameDrawsDataLoader(DataLoader):
        def __iter__(self):
            if self.persistent_workers and self.num_workers > 0 and getattr(self, "_iterator", None) is not None:
                torch.empty((), dtype=torch.int64).random_(generator=self.generator)
            return super().__iter__()

    return SameDrawsDataLoader


#: the arguments of ``DataLoader`` that say which batches are read, in which order (kept, or replaced
#: by ``dataset`` and ``batch_sampler``)
ORDER_FIELDS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
#: the arguments the worker settings give (:meth:`~placer.data.stream.LoaderSettings.kwargs`)
WORKER_FIELDS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
#: every other argument, kept as the user set it
KEPT_FIELDS = ("collate_fn", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
               "pin_memory_device", "in_order")


@functools.cache
def loader_arguments() -> tuple[str, ...]:
    """The arguments the installed torch's ``DataLoader`` takes."""
    import inspect

    from torch.utils.data import DataLoader

    return tuple(p for p in inspect.signature(DataLoader.__init__).parameters if p != "self")


def rebuild_loader(loader: Any, workers: dict[str, Any], *, threads: bool = False, dataset: Any = None,
                   batch_sampler: Any = None, sampler: Any = None, same_draws: bool = False,
                   threads_per_worker: int | None = None) -> Any:
    """A DataLoader with other worker settings that reads what ``loader`` reads, in the same order.

    The one place a loader is rebuilt: every argument of ``DataLoader`` is either kept
    (:data:`KEPT_FIELDS`: the generator, which seeds the workers and an unseeded sampler's
    order, ``worker_init_fn``, ``collate_fn``, ``timeout``, ``in_order``, ...), read from the
    order ``loader`` reads in (:data:`ORDER_FIELDS`: its sampler or batch sampler, batch size,
    ``drop_last``), or given by ``workers`` (:data:`WORKER_FIELDS`, DataLoader's keyword arguments;
    a kept one ``workers`` also names, e.g. ``in_order``, is ``workers``'s).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        The loader rebuilt (it is not changed).
    workers : dict
        ``num_workers``, ``prefetch_factor``, ``persistent_workers``, ``pin_memory`` (those given).
    threads : bool
        Read with a pool of threads (a :class:`~placer.executor.stream.threadloader.ThreadLoader`,
        which runs no ``worker_init_fn``) where ``workers`` has some.
    dataset : Dataset, optional
        Read this dataset instead (the same samples, e.g. through a cache).
    batch_sampler : iterable of lists of int, optional
        Read these batches instead of ``loader``'s order.
    sampler : iterable, optional
        Read these keys one by one, each item a batch (``batch_size=None``), instead of ``loader``'s order.
    same_draws : bool
        With persistent worker processes, draw the random numbers a loader without them draws
        (:func:`same_draws_loader`).
    threads_per_worker : int, optional
        Each worker process computes with this many threads: ``loader``'s ``worker_init_fn`` composed
        with one that sets them first (:class:`~placer.executor.stream.worker_init.WorkerThreads`).
    """
    from torch.utils.data import DataLoader, IterableDataset

    data = loader.dataset if dataset is None else dataset
    if batch_sampler is not None:
        order: dict[str, Any] = dict(batch_sampler=batch_sampler)
    elif sampler is not None:
        order = dict(batch_size=None, sampler=sampler)
    elif isinstance(loader.dataset, IterableDataset):
        order = dict(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:
        order = dict(batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        order = dict(batch_sampler=loader.batch_sampler)
    else:
        order = dict(batch_size=None, sampler=loader.sampler)
    if threads and workers.get("num_workers"):
        from placer.executor.stream.threadloader import ThreadLoader

        return ThreadLoader(data, **order, collate_fn=loader.collate_fn, generator=loader.generator,
                            num_workers=workers["num_workers"], prefetch_factor=workers.get("prefetch_factor"),
                            pin_memory=workers.get("pin_memory", False))
    defaults = {"timeout": 0, "in_order": True, "pin_memory_device": ""}
    kept = {k: getattr(loader, k, defaults.get(k)) for k in KEPT_FIELDS
            if k in loader_arguments() and k not in workers}
    if threads_per_worker is not None and workers.get("num_workers"):
        kept["worker_init_fn"] = WorkerThreads(threads_per_worker, kept.get("worker_init_fn"))
    if not workers.get("num_workers"):  # a start method and a timeout are for worker processes: DataLoader
        kept.pop("multiprocessing_context", None)  # refuses them without any
        kept.pop("timeout", None)
    kind = same_draws_loader() if same_draws and workers.get("num_workers") else DataLoader
    return kind(data, **order, **kept, **workers)


def close_loader(loader: Any) -> None:
    """Stop the worker processes a loader with ``persistent_workers`` keeps (no-op without them)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    if it is not None:
        loader._iterator = None


def _is_loader(obj: Any) -> bool:
    return type(obj).__name__ == "DataLoader" or any(
        c.__module__.startswith("torch.utils.data") and c.__name__ == "DataLoader" for c in type(obj).__mro__)


def _is_dataset(obj: Any) -> bool:
    return any(c.__module__.startswith("torch.utils.data") and c.__name__ in ("Dataset", "IterableDataset")
               for c in type(obj).__mro__)
