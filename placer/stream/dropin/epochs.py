"""The epochs the advice predicts the user's run over: theirs, or, not given, one, said plainly.

May import: nothing of placer (the loader is read through its public attributes).

A script's epoch count lives in its loop, out of the drop-in's sight; the loader shows
only its length (batches per epoch) and whether its sampler takes ``set_epoch``, as a
sampler meant for several epochs does. Without ``epochs=`` the whole run is predicted
over one epoch, the one run every script makes, and the advice says so, naming what the
loader shows; a cache, which pays only from the second epoch, is then offered with its
gain per epoch and the epochs it needs to pay (:func:`placer.stream.dropin.whole.cache_over_the_run`).
"""

from __future__ import annotations

from typing import Any

#: the run assumed where ``epochs`` is not given: one epoch, the run every script makes
ASSUMED_EPOCHS = 1


def epoch_aware(loader: Any) -> str | None:
    """The loader's sampler (or batch sampler) that takes ``set_epoch``, by class name; None if none does."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for s in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        if s is not None and callable(getattr(s, "set_epoch", None)):
            return type(s).__name__
    return None


def run_epochs(loader: Any, epochs: int | None, per_epoch: int | None) -> tuple[int, str | None]:
    """The epochs to predict the run over, and the sentence saying they were assumed (None where given).

    >>> from torch.utils.data import DataLoader
    >>> run_epochs(DataLoader(list(range(8)), batch_size=4), None, 2)[1]
    'epochs not given: your run is predicted as one epoch of 2 batches; pass epochs= for more'
    >>> run_epochs(DataLoader(list(range(8)), batch_size=4), 5, 2)
    (5, None)
    """
    if epochs is not None:
        return epochs, None
    shape = f"one epoch of {per_epoch} batches" if per_epoch else "one epoch"
    said = f"epochs not given: your run is predicted as {shape}"
    if (name := epoch_aware(loader)) is not None:
        said += f" (your loader's {name} has set_epoch, as samplers for several epochs do)"
    return ASSUMED_EPOCHS, said + "; pass epochs= for more"
