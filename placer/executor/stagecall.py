"""Calling one stage's implementation on one device.

May import: numpy, placer.pipeline, placer.devices, placer.executor.transfer; dask
inside functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placer.devices import Device
from placer.errors import PipelineError
from placer.executor.transfer import adapt, normalize_output, synchronize
from placer.pipeline import Stage

#: a data-parallel stage is split only when each partition gets at least this many rows
MIN_ROWS_PER_PARTITION = 4096


def call_stage(stage: Stage, device: Device, inputs: dict[str, Any], *, workers: int = 1,
               extra: dict[str, Any] | None = None) -> Any:
    """Run ``stage`` on ``device`` with ``inputs`` already at the device's location.

    Inputs are adapted to the implementation's data format, parameters and (when
    the implementation takes it) ``device=`` are passed as keywords, the device is
    synchronised before returning, and the output is put in canonical form for the
    device (see :func:`placer.executor.transfer.normalize_output`). ``extra``
    keywords (a stream's ``batch_info``, a step's ``state``) are passed as they are.

    Parameters
    ----------
    stage : Stage
        The stage to call.
    device : Device
        Where it runs; its kind picks the implementation (``cpu`` or ``gpu``).
    inputs : dict
        Argument name → value, already at ``device``'s location.
    workers : int
        CPU workers a ``data_parallel`` stage may split its rows over.
    extra : dict, optional
        More keywords passed as they are.

    Returns
    -------
    object
        The stage's output, in canonical form for the device.
    """
    impl = stage.impl_for(device.driver.implementation)
    if impl is None:
        raise PipelineError(
            f"stage {stage.name!r} has no implementation for {device.name}", stage=stage.name
        )
    kwargs = {a: adapt(v, impl.api, device) for a, v in inputs.items()}
    if stage.params:
        kwargs.update(stage.params)
    if extra:
        kwargs.update(extra)
    if impl.takes_device:
        kwargs["device"] = device.torch_device()
    if stage.data_parallel and not device.is_accelerator and workers > 1:
        out = _data_parallel(stage, impl.fn, kwargs, workers)
    else:
        out = impl.fn(**kwargs)
    synchronize(device, impl.api)
    return normalize_output(out, device)


def _rows(v: Any) -> int | None:
    if isinstance(v, np.ndarray) and v.ndim >= 1:
        return v.shape[0]
    if hasattr(v, "iloc") and hasattr(v, "__len__"):
        return len(v)
    if hasattr(v, "shape") and hasattr(v, "dim") and v.dim() >= 1:  # torch tensor
        return int(v.shape[0])
    return None


def _split(v: Any, parts: int) -> list[Any]:
    n = _rows(v)
    bounds = [n * i // parts for i in range(parts + 1)]
    if hasattr(v, "iloc"):
        return [v.iloc[a:b] for a, b in zip(bounds, bounds[1:])]
    return [v[a:b] for a, b in zip(bounds, bounds[1:])]


def _concat(parts: list[Any], stage: str) -> Any:
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(_concat([p[i] for p in parts], stage) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts], stage) for k in first}
    if isinstance(first, np.ndarray):
        return np.concatenate(parts, axis=0)
    if hasattr(first, "iloc"):
        import pandas as pd

        return pd.concat(parts)
    if hasattr(first, "dim"):
        import torch

        return torch.cat(parts, 0)
    raise PipelineError(
        f"stage {stage!r} is declared data_parallel but returned {type(first).__name__}; "
        "a data-parallel stage must return arrays (or tuples/dicts of arrays) split along rows",
        stage=stage,
    )


def _data_parallel(stage: Stage, fn, kwargs: dict[str, Any], workers: int) -> Any:
    """Split row-wise inputs into partitions and compute them with dask's threaded scheduler."""
    import dask

    data_args = {k: v for k, v in kwargs.items() if k in stage.inputs and _rows(v) is not None}
    if not data_args:
        return fn(**kwargs)
    lengths = {k: _rows(v) for k, v in data_args.items()}
    if len(set(lengths.values())) != 1:
        raise PipelineError(
            f"stage {stage.name!r} is data_parallel but its inputs have different row counts "
            f"{lengths}; make the inputs row-aligned or drop data_parallel",
            stage=stage.name,
        )
    n = next(iter(lengths.values()))
    parts = min(workers, max(1, n // MIN_ROWS_PER_PARTITION))
    if parts <= 1:
        return fn(**kwargs)
    split = {k: _split(v, parts) for k, v in data_args.items()}
    tasks = [
        dask.delayed(fn, pure=False)(**{**kwargs, **{k: split[k][i] for k in split}})
        for i in range(parts)
    ]
    results = dask.compute(*tasks, scheduler="threads", num_workers=parts)
    return _concat(list(results), stage.name)
