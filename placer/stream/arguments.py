"""The drop-in's arguments, checked before anything runs.

May import: placer.errors; torch inside functions.

:func:`check` refuses what :func:`placer.stream.advise_loader` cannot measure with, before
it spends any of the budget: each error names the argument, what it got and the fix
(a ``ValueError`` or ``TypeError`` that is also a :class:`~placer.errors.PlacerError`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from placer.errors import ArgumentError, ArgumentTypeError

#: the fewest batches a run can measure: one of warm-up, then one counted
MIN_BATCHES = 2


def _what(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else type(value).__name__


def check(loader: Any, step: Any, *, batches: Any, budget_s: Any, epochs: Any, allow_reorder: Any = False) -> None:
    """Raise :class:`ArgumentTypeError` or :class:`ArgumentError` for the first argument that cannot be used."""
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        raise ArgumentTypeError(
            f"advise_loader: loader must be a torch.utils.data.DataLoader (got {type(loader).__name__}); "
            "wrap your data in one: DataLoader(dataset, batch_size=...)")
    if not callable(step):
        raise ArgumentTypeError(
            f"advise_loader: step must be callable, step(batch) as your loop calls it "
            f"(got {type(step).__name__}); pass the function, not its result")
    # bool is an int to Python, but True batches or epochs is a slip, not a count
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real):
        raise ArgumentTypeError(f"advise_loader: budget_s={_what(budget_s)}: budget_s must be a number of seconds "
                                f"(got {type(budget_s).__name__}); e.g. budget_s=60")
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise ArgumentError(f"advise_loader: budget_s={budget_s!r}: budget_s must be a finite number of seconds "
                            "above 0; e.g. budget_s=60")
    for name, value, least, fix in (
            ("batches", batches, MIN_BATCHES, "a run reads one batch of warm-up, then counts at least one; "
                                              "e.g. batches=20"),
            ("epochs", epochs, 1, "your script's run has at least one epoch; e.g. epochs=10")):
        if name == "epochs" and value is None:
            continue  # not given: one epoch assumed, and said (placer.stream.dropin.epochs)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ArgumentTypeError(f"advise_loader: {name}={_what(value)}: {name} must be a whole number "
                                    f"(got {type(value).__name__}); {fix}")
        if value < least:
            raise ArgumentError(f"advise_loader: {name}={value!r}: {name} must be at least {least}; {fix}")
    if not isinstance(allow_reorder, bool):
        raise ArgumentTypeError(f"advise_loader: allow_reorder={_what(allow_reorder)}: allow_reorder must be True "
                                f"or False (got {type(allow_reorder).__name__}); True lets the advice recommend "
                                "in_order=False, which hands batches over in another order each run")


def check_memory(memory_bytes: Any) -> None:
    """Refuse a ``memory_bytes`` that is not a whole number of bytes above 0 (None: the default budget)."""
    if memory_bytes is None:
        return
    fix = "e.g. memory_bytes=8 * 2**30 for 8 GiB, or leave it out for the memory available less a margin"
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, numbers.Integral):
        raise ArgumentTypeError(f"advise_loader: memory_bytes={_what(memory_bytes)}: memory_bytes must be a whole "
                                f"number of bytes (got {type(memory_bytes).__name__}); {fix}")
    if memory_bytes <= 0:
        raise ArgumentError(f"advise_loader: memory_bytes={memory_bytes!r}: memory_bytes must be above 0; {fix}")
