"""A stream's source: what its function returns, turned into batches for each epoch.

May import: placer.pipeline, placer.errors, placer.data.stream, placer.executor.stream.{config,nodes}; torch inside functions (only when
the source returns a ``Dataset`` or a ``DataLoader``).

A source function returns an iterable of batches (a generator, a list), a
``torch.utils.data.Dataset`` (batched here by a ``DataLoader`` with the stage's
``batch_size`` and the configured workers: worker *processes*, as DataLoader runs
them), or a ``DataLoader`` (its dataset, sampler, batch size, collate function,
generator and ``worker_init_fn`` are kept; with configured workers its worker
settings are replaced, else used as given: the user's own settings are the baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from placer.pipeline import BATCH_INFO, Stage
from placer.data.stream import LoaderSettings
from placer.executor.stream.config import BatchInfo, StreamConfig
from placer.executor.stream.nodes import takes


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
    from torch.utils.data import DataLoader

    given = stage.name in config.stage_workers or config.sequential
    if _is_loader(obj):
        if not given and wrap is None:
            return obj
        kw = dict(batch_size=obj.batch_size, sampler=obj.sampler if obj.batch_size is not None else None,
                  batch_sampler=obj.batch_sampler if obj.batch_size is None else None,
                  collate_fn=obj.collate_fn, drop_last=obj.drop_last if obj.batch_size is not None else False,
                  dataset=obj.dataset if wrap is None else wrap(obj.dataset),
                  # the generator draws each iterator's worker seed before a seeded sampler's order: without
                  # it a rebuilt loader would read another order than the user's
                  generator=obj.generator, worker_init_fn=obj.worker_init_fn)
        if not given:  # the user's own worker settings, on the wrapped dataset
            return DataLoader(**kw, **LoaderSettings.of(obj).kwargs())
    else:
        kw = dict(dataset=obj if wrap is None else wrap(obj), batch_size=stage.batch_size or 1, shuffle=False)
    # in a stream the copy node pins batches for a GPU, not the loader
    settings = LoaderSettings.from_stream(config, stage.name).model_copy(update={"pin_memory": False})
    return DataLoader(**kw, **settings.kwargs())


def _is_loader(obj: Any) -> bool:
    return type(obj).__name__ == "DataLoader" or any(
        c.__module__.startswith("torch.utils.data") and c.__name__ == "DataLoader" for c in type(obj).__mro__)


def _is_dataset(obj: Any) -> bool:
    return any(c.__module__.startswith("torch.utils.data") and c.__name__ in ("Dataset", "IterableDataset")
               for c in type(obj).__mro__)
