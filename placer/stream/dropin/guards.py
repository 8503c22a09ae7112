"""Guards around the drop-in's runs: the random state put back, torch's warning about many workers silenced,
and whether a dataset draws random numbers its index does not fix.

May import: nothing of placer; numpy and torch inside functions.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


@contextlib.contextmanager
def random_state_kept(loader: Any) -> Iterator[None]:
    """Restore torch's global random state and the loader's generators afterwards."""
    import torch

    gens = {}
    for owner in (loader, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator):
            gens[id(g)] = (g, g.get_state())
    cpu_state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        for g, state in gens.values():
            g.set_state(state)


@contextlib.contextmanager
def past_the_cores() -> Iterator[None]:
    """torch's warning that a DataLoader starts more worker processes than the cores, silenced for the
    advice's own runs: the search tries more on purpose, while the rate rises (:func:`more_workers`);
    a recommendation of more says so in its notes."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


def draws_unseeded(dataset: Any) -> bool:
    """Whether ``dataset[i]`` draws random numbers that the index does not fix.

    The check: read the first sample twice, under two different states of Python's,
    numpy's and torch's global random generators (restored afterwards). A dataset that
    draws none, or seeds its own generator from the index, gives equal samples; one
    that draws from a global generator gives different ones. Only such a dataset draws
    other numbers when ``num_workers`` changes (each worker seeds its own generators).
    An iterable dataset, or one that cannot be read here, is assumed not to draw.
    """
    import numpy as np
    import torch

    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return False
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        if len(dataset) == 0:
            return False
        out = []
        for seed in (12345, 54321):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            getitems = getattr(dataset, "__getitems__", None)  # a batch's keys at once, as the loader reads them
            out.append(getitems([0])[0] if callable(getitems) else dataset[0])
        return not _equal(out[0], out[1])
    except Exception as e:  # a dataset that cannot be read twice: say nothing rather than guess
        log.debug("could not check whether the dataset draws random numbers: %s", e)
        return False
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _equal(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes") and hasattr(b, "tobytes"):  # PIL images and the like
        try:
            return a.tobytes() == b.tobytes()
        except Exception:
            return False
    try:
        return bool(a == b)
    except Exception:
        return False
