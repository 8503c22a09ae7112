"""The user's process left as the drop-in found it: what the step trains, the random generators, the threads.

May import: placer.stream.arguments; torch, numpy inside functions.

:func:`placer.stream.advise_loader` runs the user's step for real: the step-alone run, the cache
search's passes and, where the runs are not in fresh processes (``fresh=False``, a step on a GPU, a
loader that does not pickle), every run trains the user's model in the user's process. The script
then goes on training from there: its weights, its optimizer's moments and step count, its scheduler's
learning rate would all differ from a run without the advice. :class:`Kept` snapshots, before the
first run, what the step trains and restores it after each run in this process and at the end:

- what ``state=`` holds (a module, optimizer, scheduler, tensor, or a dict, list or tuple of them; any
  other object with ``state_dict`` and ``load_state_dict``), else what the step reaches by inspection
  (:func:`reachable`): its closure, the globals its code names, its bound object (``__self__``), a
  ``functools.partial``'s arguments, the attributes of objects among those, the functions among them in
  turn; modules (``torch.nn.Module``), optimizers, learning-rate schedulers and gradient scalers;
- a module through ``state_dict``/``load_state_dict`` (its parameters and persistent buffers), its
  other buffers, each parameter's ``requires_grad`` and ``.grad``, and each submodule's train/eval
  mode; an optimizer's ``state_dict`` (moments, step counts, its param groups' learning rates) and its
  parameters' values and gradients; a scheduler's ``state_dict``;
- Python's, numpy's and torch's global random generators (CUDA's where it started), torch's intra-op
  thread count, and the attributes of the loader's dataset (the same objects, not copies of them).

Snapshots are copies in host memory (tensors cloned to the CPU), so that a GPU model's memory is not
doubled on the GPU, and each restore loads a fresh copy of them: ``load_state_dict`` keeps the tensors it
is given where their device and dtype already fit, and the next run would train the snapshot itself.

Where the step reaches nothing it could train (no ``state=``, none found) or ``state=`` holds what
cannot be put back, :meth:`Kept.notes` says so in the advice: those objects kept the measured batches'
training.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import random
import sys
import types
from collections.abc import Callable
from typing import Any

from placer.stream import arguments

#: how deep :func:`reachable` follows references from the step (closure -> object -> attribute -> ...)
DEPTH = 4
#: how many items of one container :func:`reachable` looks at (a dataset's list is not walked whole)
ITEMS = 64
#: how many objects :func:`reachable` looks at in all: a step that reaches a large graph costs no more
VISITS = 20_000

_CURRENT: contextvars.ContextVar[Kept | None] = contextvars.ContextVar("placer_stream_kept", default=None)


def _torch() -> Any:
    import torch

    return torch


def _kind(obj: Any) -> str | None:
    """What ``obj`` is of the objects a step trains, or None."""
    torch = _torch()
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    try:  # an attribute of the user's object may be a property that raises
        steps = isinstance(getattr(obj, "optimizer", None), torch.optim.Optimizer)
    except Exception:  # noqa: BLE001
        steps = False
    if steps and _loads(obj):
        return "scheduler"  # an LR scheduler (ReduceLROnPlateau too): it steps an optimizer
    if type(obj).__name__ == "GradScaler" and _loads(obj):
        return "scaler"
    return None


def _loads(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _library(fn: types.FunctionType) -> bool:
    """A function of an installed library (torch's own): not walked, it holds no state of the user's."""
    path = fn.__code__.co_filename
    return "site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix + "/lib")


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions and lambdas name globals too
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def reachable(step: Callable[..., Any]) -> list[Any]:
    """The modules, optimizers, schedulers and gradient scalers ``step`` reaches, in the order found.

    Followed: a bound method's object, a ``functools.partial``'s function and arguments, a function's
    closure cells, defaults and the globals its code names, the attributes of other objects, the items
    of containers (the first :data:`ITEMS`), up to :data:`DEPTH` steps. Not followed: modules
    (``import``), classes, the functions of installed libraries, and what a found object holds (its
    ``state_dict`` covers it)."""
    found: list[Any] = []
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, complex)) \
                or len(seen) >= VISITS:
            return
        seen.add(id(obj))
        kind = _kind(obj)
        if kind is not None:
            if kind != "tensor":  # a tensor the step names is data, not what it trains (state= can say so)
                found.append(obj)
            return
        if depth > DEPTH or isinstance(obj, (types.ModuleType, type)):
            return
        if isinstance(obj, types.MethodType):
            visit(obj.__self__, depth + 1)
            visit(obj.__func__, depth + 1)
        elif isinstance(obj, functools.partial):
            for x in (obj.func, *obj.args, *obj.keywords.values()):
                visit(x, depth + 1)
        elif isinstance(obj, types.FunctionType):
            if _library(obj):
                return
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
            for x in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
                visit(x, depth + 1)
            g = obj.__globals__
            for name in sorted(_names(obj.__code__)):
                if name in g:
                    visit(g[name], depth + 1)
        elif isinstance(obj, dict):
            for x in list(obj.values())[:ITEMS]:
                visit(x, depth + 1)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for x in list(obj)[:ITEMS]:
                visit(x, depth + 1)
        elif hasattr(obj, "__dict__") and not inspect.isroutine(obj):
            for x in list(vars(obj).values())[:ITEMS]:  # an object that holds them: a trainer, a callable
                visit(x, depth + 1)

    visit(step, 0)
    return found


def given(state: Any) -> tuple[list[Any], list[str]]:
    """What ``state=`` holds that can be put back, and the names of what cannot."""
    out: list[Any] = []
    unknown: list[str] = []

    def visit(obj: Any, name: str) -> None:
        if obj is None:
            return
        if _kind(obj) is not None or _loads(obj):
            out.append(obj)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                visit(v, f"{name}[{k!r}]")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                visit(v, f"{name}[{i}]")
        else:
            unknown.append(f"{name} ({type(obj).__name__})")

    visit(state, "state")
    return out, unknown


def _to_host(x: Any) -> Any:
    """A copy of ``x`` (a state_dict: nested dicts, lists, tensors) with every tensor cloned to the CPU."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        out = copy.copy(x)  # its class and attributes too: a module's state_dict carries its ``_metadata``
        for k, v in x.items():
            out[k] = _to_host(v)
        return out
    if isinstance(x, list):
        return [_to_host(v) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_to_host(v) for v in x)
    return copy.deepcopy(x)


class _Tensor:
    """A tensor's value, ``requires_grad`` and ``.grad``, put back in place."""

    def __init__(self, t: Any, value: bool = True):
        self.t, self.value = t, t.detach().to("cpu", copy=True) if value else None
        self.requires_grad = t.requires_grad
        self.grad = None if t.grad is None else t.grad.detach().to("cpu", copy=True)

    def restore(self) -> None:
        torch = _torch()
        t = self.t
        if self.value is not None:
            with torch.no_grad():
                t.copy_(self.value)
        if t.is_leaf and t.requires_grad != self.requires_grad:
            t.requires_grad_(self.requires_grad)
        if t.is_leaf:  # a copy, not the snapshot: the next backward accumulates into .grad in place
            t.grad = None if self.grad is None else self.grad.to(device=t.device, dtype=t.dtype, copy=True)


class Kept:
    """A snapshot of the user's process as the drop-in found it (:mod:`placer.stream.keep`)."""

    def __init__(self, loader: Any, step: Callable[..., Any], state: Any = None):
        import numpy as np

        torch = _torch()
        self.given = state is not None
        self.failed: dict[int, str] = {}  # what refused to be put back, by id
        objects, self.unknown = given(state) if self.given else (reachable(step), [])
        # a scheduler's state_dict leaves out its optimizer, whose groups' learning rates it sets
        objects += [o.optimizer for o in objects if _kind(o) == "scheduler"
                    and all(o.optimizer is not x for x in objects)]
        self.objects = objects
        self.dicts: list[tuple[Any, Any]] = []  # (object, its state_dict on the host)
        self.tensors: dict[int, _Tensor] = {}
        self.modes: list[tuple[Any, bool]] = []
        for obj in objects:
            kind = _kind(obj)
            if kind == "tensor":
                self.tensors.setdefault(id(obj), _Tensor(obj))
                continue
            self.dicts.append((obj, _to_host(obj.state_dict())))
            if kind == "module":
                self.modes += [(m, m.training) for m in obj.modules()]
                for p in obj.parameters():  # values through load_state_dict; requires_grad and .grad here
                    self.tensors.setdefault(id(p), _Tensor(p, value=False))
                persistent = set(obj.state_dict(keep_vars=True))
                for name, b in obj.named_buffers():
                    if name not in persistent:  # not in state_dict: put back by value
                        self.tensors.setdefault(id(b), _Tensor(b))
            elif kind == "optimizer":  # its parameters, where no module found holds them
                for group in obj.param_groups:
                    for p in group["params"]:
                        self.tensors.setdefault(id(p), _Tensor(p))
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                    torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized()
                    else None)
        self.threads = torch.get_num_threads()
        self.attrs = [(d, dict(vars(d))) for d in _datasets(getattr(loader, "dataset", None))]

    def restore(self) -> None:
        """Put everything back as it was at the snapshot (each time from a fresh copy of it)."""
        import numpy as np

        torch = _torch()
        for obj, saved in self.dicts:
            try:
                obj.load_state_dict(copy.deepcopy(saved))
            except Exception as e:  # noqa: BLE001 - the user's object refuses: said in the advice, not raised
                self.failed.setdefault(id(obj), f"{type(obj).__name__} ({type(e).__name__}: {e})")
        for t in self.tensors.values():
            t.restore()
        for m, training in self.modes:
            m.training = training
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])
        if self.rng[3] is not None:
            torch.cuda.set_rng_state_all(self.rng[3])
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        for d, saved in self.attrs:
            now = vars(d)
            for k in [k for k in now if k not in saved]:
                del now[k]
            for k, v in saved.items():
                if now.get(k, _MISSING) is not v:
                    now[k] = v

    def notes(self) -> list[str]:
        """What the advice could not put back, in words (none where it put back all it ran)."""
        out = []
        if self.failed:
            out.append(f"could not put back what the step trained in this process: {', '.join(self.failed.values())}")
        if self.unknown:
            out.append(f"the batches the step ran in this process changed what state= holds but could not be put "
                       f"back: {', '.join(self.unknown)} (give modules, optimizers, schedulers or tensors: "
                       "objects with state_dict and load_state_dict)")
        if not self.objects and not self.unknown:
            out.append("found no model, optimizer or scheduler that the step holds (in its closure, the globals it "
                       "names or its object), and none was given as state=: if it trains one, the batches it ran "
                       "in this process trained it; pass state=(model, optimizer, scheduler) to have them put back")
        return out


_MISSING = object()


def _datasets(dataset: Any) -> list[Any]:
    """The loader's dataset and those it wraps (a Subset's ``.dataset``), each with attributes."""
    out: list[Any] = []
    while dataset is not None and hasattr(dataset, "__dict__") and all(dataset is not d for d in out):
        out.append(dataset)
        dataset = getattr(dataset, "dataset", None)
    return out


def between_runs() -> None:
    """After a run of the step in this process: put back what the snapshot holds, so that the next run
    (and the script, after the advice) starts from the model, optimizer and generators as they were."""
    kept = _CURRENT.get()
    if kept is not None:
        kept.restore()


def keeps_the_process(advise: Callable[..., Any]) -> Callable[..., Any]:
    """``advise(loader, step, ..., state=...)`` with its arguments checked (:func:`arguments.check`) first,
    then the process snapshot before and put back after it (also where it raises); the advice's notes
    say what could not be."""
    signature = inspect.signature(advise)

    @functools.wraps(advise)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        arguments.check(a["loader"], a["step"], batches=a["batches"], budget_s=a["budget_s"], epochs=a["epochs"],
                        allow_reorder=a.get("allow_reorder", False))
        kept = Kept(a["loader"], a["step"], a.get("state"))
        token = _CURRENT.set(kept)
        try:
            advice = advise(*args, **kwargs)
        finally:
            _CURRENT.reset(token)
            kept.restore()
        advice.notes.extend(kept.notes())
        return advice

    return wrapper
