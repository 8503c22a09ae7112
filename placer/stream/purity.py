"""Whether a Dataset's method (or a transform prefix) is pure in its arguments: equal arguments give equal
outputs and no random generator moves, so its outputs may be cached by their arguments.

May import: numpy, placer.executor.stream.store, placer.timing, placer.stream.{cache_advice,wrappers}; torch
inside functions.

The dataset given is the loader's (:mod:`placer.stream.wrappers`: the leaves of one class inside its
``Subset`` and ``ConcatDataset`` wrappers are checked, through the loader's keys), and a key may be a
:class:`~placer.stream.wrappers.Batch` fetched at once with ``__getitems__``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.executor.stream.store import is_plain
from placer.timing import Clock
from placer.stream.cache_advice import MethodCandidate
from placer.stream.wrappers import fetched, items_in, leaf_class, leaves, probed



#: items whose calls are recorded to check determinism and arguments
CHECKED_ITEMS = 3


@contextlib.contextmanager
def global_random_state_kept() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global random generators afterwards."""
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _rng_state() -> tuple:
    import torch

    np_state = np.random.get_state()
    numpy_state = (np_state[0], np_state[1].tobytes(), *np_state[2:])
    return random.getstate(), numpy_state, torch.get_rng_state().numpy().tobytes()


class _Recorder:
    """A method that records its calls into a shared list: the leaf it was called on (its number), arguments,
    output, and whether it moved a global generator."""

    def __init__(self, owner: Any, name: str, number: int, calls: list[tuple[int, tuple, dict, Any, bool]]):
        self.owner, self.name, self.number, self.calls = owner, name, number, calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cls = type(self.owner)
        fn = inspect.getattr_static(cls, self.name).__get__(self.owner, cls)
        before = _rng_state()
        value = fn(*args, **kwargs)
        self.calls.append((self.number, args, kwargs, value, _rng_state() != before))
        return value


def _recorded(dataset: Any, name: str, keys: list[Any], cls: type) -> list[tuple[int, tuple, dict, Any, bool]]:
    """The calls of ``name`` on the leaves of ``cls`` while the first keys are fetched (``__getitem__``: the
    items themselves, on leaf None)."""
    calls: list[tuple[Any, tuple, dict, Any, bool]] = []
    if name == "__getitem__":
        for key in keys[:CHECKED_ITEMS]:
            before = _rng_state()
            value = fetched(dataset, key)
            calls.append((None, (key,), {}, value, _rng_state() != before))
        return calls
    probe = probed(dataset, cls, name, lambda leaf, number: _Recorder(leaf, name, number, calls))
    for key in keys[:CHECKED_ITEMS]:
        fetched(probe, key)
    return calls


def check(dataset: Any, name: str, keys: list[Any], *, cls: type | None = None) -> tuple[str | None, list[Any]]:
    """Why ``name``'s output cannot be cached (None when it can), and its recorded outputs; ``name`` a method
    of the leaves of class ``cls`` (default: the first leaf's) or ``__getitem__`` (the dataset's items)."""
    cls = leaf_class(dataset) if cls is None else cls
    calls = _recorded(dataset, name, keys, cls)
    if not calls:
        return f"{name} was not called as self.{name}(...)", []
    originals = leaves(dataset)

    def fn(number: Any, *args: Any, **kwargs: Any) -> Any:
        if number is None:
            return fetched(dataset, args[0])
        leaf = originals[number]
        return inspect.getattr_static(cls, name).__get__(leaf, cls)(*args, **kwargs)

    import torch

    for number, args, kwargs, value, moved in calls:
        if not (is_plain(args) and is_plain(sorted(kwargs.items()))):
            return f"its arguments are not plain data (numbers, strings, paths): {_types(args, kwargs)}", []
        if moved:
            return "it draws random numbers (a global random generator moved)", []
        for seed in (12345, 54321):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            if not equal(fn(number, *args, **kwargs), value):
                return "it draws random numbers (the same arguments gave another output)", []
    return None, [c[3] for c in calls]


def composed(dataset: Any) -> list[str]:
    """Attributes of the dataset that are composed transforms: callables with a list of ``transforms``."""
    out = []
    for name, value in vars(dataset).items() if hasattr(dataset, "__dict__") else ():
        steps = getattr(value, "transforms", None)
        if callable(value) and isinstance(steps, (list, tuple)) and steps and all(callable(t) for t in steps):
            out.append(name)
    return out


@dataclass
class PrefixCandidate:
    candidate: MethodCandidate
    reason: str | None
    values: list[Any]
    steps: list[str]


def check_prefix(dataset: Any, attr: str, keys: list[Any], item_s: float, *,
                 cls: type | None = None) -> PrefixCandidate | None:
    """The deterministic prefix of the composed transform ``attr`` of the leaves of class ``cls`` (default:
    the first leaf's): its length, share and outputs.

    Its calls on a few items are recorded; the input must be plain data (whether it recurs
    across epochs is measured apart, :func:`placer.stream.hits.hit_rate`); each step then runs twice on
    the previous steps' output under two states of the global random generators: the first step whose
    outputs differ, or that moves a generator, ends the prefix (each leaf's own steps, the shortest
    prefix for all). None when the transform is not called.
    """
    import torch

    seen: list[tuple[Any, Any]] = []

    def make(leaf: Any, number: int) -> Any:
        compose = getattr(leaf, attr)

        def record(x: Any) -> Any:
            seen.append((x, compose))
            return compose(x)

        return record

    probe = probed(dataset, leaf_class(dataset) if cls is None else cls, attr, make)
    for key in keys[:CHECKED_ITEMS]:
        fetched(probe, key)
    if not seen:
        return None
    steps = list(seen[0][1].transforms)
    k, outputs, prefix_s = min(len(c.transforms) for _, c in seen), [], 0.0
    for x, compose in seen:
        if not is_plain((x,)):
            return PrefixCandidate(MethodCandidate(f"{attr}[:0]", 0.0, 0.0, 0.0), f"its input is not plain data "
                           f"({type(x).__name__}): nothing to key a cache by", [], [])
        y = x
        for j, t in enumerate(list(compose.transforms)[:k]):
            outs = []
            for seed in (12345, 54321):
                random.seed(seed)
                np.random.seed(seed)
                torch.manual_seed(seed)
                before = _rng_state()
                with Clock(cpu_clock=None) as c:
                    outs.append(t(copy.deepcopy(y)))
                if _rng_state() != before:
                    outs.append(None)
            if len(outs) != 2 or not equal(outs[0], outs[1]):
                k = j
                break
            prefix_s += c.wall
            y = outs[0]
        outputs.append(y)
    names = [type(t).__name__ for t in steps[:k]]
    share = min(1.0, prefix_s / len(seen) / max(item_s, 1e-12))
    cand = MethodCandidate(f"{attr}[:{k}]", share, len(seen) / max(items_in(keys[:CHECKED_ITEMS]), 1),
                           prefix_s / len(seen))
    if k == 0:
        return PrefixCandidate(cand, f"its first step ({type(steps[0]).__name__}) draws random numbers", [], [])
    return PrefixCandidate(cand, None, outputs, names)


def item_seconds(dataset: Any, keys: list[Any]) -> float:
    """Seconds an item of the first keys takes, fetched as the loader fetches it."""
    with Clock(cpu_clock=None) as c:
        for key in keys[:CHECKED_ITEMS]:
            fetched(dataset, key)
    return c.wall / max(1, items_in(keys[:CHECKED_ITEMS]))


def _types(args: tuple, kwargs: dict) -> str:
    return ", ".join(type(a).__name__ for a in [*args, *kwargs.values()])


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def equal(a: Any, b: Any) -> bool:
    """Whether two items are equal: arrays and tensors element by element, containers recursively."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes") and hasattr(b, "tobytes"):  # PIL images and the like
        try:
            return type(a) is type(b) and a.tobytes() == b.tobytes()
        except Exception:  # noqa: BLE001
            return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def digest(batch: Any) -> str:
    """A digest of a batch's content (tensors and arrays by their bytes, dtype and shape)."""
    h = hashlib.blake2b(digest_size=16)

    def walk(x: Any) -> None:
        if hasattr(x, "detach") and hasattr(x, "numpy"):
            x = x.detach().cpu().numpy()
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (tuple, list)):
            h.update(f"{type(x).__name__}{len(x)}".encode())
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    walk(batch)
    return h.hexdigest()
