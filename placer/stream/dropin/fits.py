"""The memory budget of :func:`~placer.stream.dropin.advise_loader`: settings that would not fit are not recommended.

May import: placer.stream.procmem, placer.stream.dropin.{deciding,memory,trial,whole}; psutil inside functions.

A setting's memory over the user's run is projected by :func:`~placer.stream.dropin.memory.projected`
(the rule: :mod:`placer.stream.dropin.memory`), with the settings it would be recommended with (worker
processes kept between epochs: :func:`~placer.stream.dropin.deciding.persistent`). A setting whose projection
passes the budget (``memory_bytes=``; default: :func:`default_budget`) is set aside after its first run
(:func:`set_aside`), before the repeated runs that decide: it is not recommended, and the advice says why,
what it would take, and, where its workers grow by copying the Dataset's Python objects, the fix. A
recommendation whose longer runs project it past the budget gives way to the user's settings (:func:`hold`).
The user's own settings are always measured; where they pass the budget, the advice says so.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from placer.stream import procmem
from placer.stream.dropin.deciding import persistent
from placer.stream.dropin.memory import combined, mib, projected
from placer.stream.dropin.trial import Trial, label
from placer.stream.dropin.whole import whole_run

#: the default budget leaves this share of the machine's memory free, and at least ``MARGIN_MIN_BYTES``:
#: the kernel's "available" is an estimate, the page cache and other processes move, and a machine whose
#: last tenth is taken swaps or meets the out-of-memory killer before it is full
MARGIN_SHARE = 0.10
MARGIN_MIN_BYTES = 512 * 2**20
#: a Dataset attribute holding at least this many Python objects (a list, tuple, dict or set) is named as
#: the likely source of the workers' copy-on-read
MANY_OBJECTS = 10_000


def default_budget() -> tuple[int | None, str]:
    """The memory the script's process and its loader's workers may hold (bytes), and how it was made: the
    memory available now and what this process already holds (it is the script's main process), less a
    margin (``MARGIN_SHARE`` of the machine, at least ``MARGIN_MIN_BYTES``). None where psutil is missing."""
    try:
        import psutil
    except ImportError:
        return None, "psutil is not installed: memory was not weighed"
    vm = psutil.virtual_memory()
    own = (procmem.sizes() or {"anon": 0})["anon"]
    margin = max(MARGIN_SHARE * vm.total, MARGIN_MIN_BYTES)
    budget = int(vm.available + own - margin)
    return budget, (f"the memory available ({mib(vm.available)}) and this process's own ({mib(own)}), less a "
                    f"margin of {mib(margin)} ({MARGIN_SHARE:.0%} of the machine's {mib(vm.total)})")


def budget_for(memory_bytes: int | None) -> dict[str, Any]:
    """``{"bytes", "from", "own"}``: the budget given, or the default, and this process's own memory (the
    script's main process: what a fresh run's process, holding a copy of the loader and step, may not)."""
    own = (procmem.sizes() or {"anon": 0})["anon"]
    if memory_bytes is not None:
        return {"bytes": int(memory_bytes), "from": "memory_bytes", "own": own}
    b, why = default_budget()
    return {"bytes": b, "from": why, "own": own}


def over_run(t: Trial, a: Any, *, as_recommended: bool = True) -> dict[str, Any] | None:
    """``t``'s memory over the user's run (``a``: the advice in the making), with the settings it would be
    recommended with."""
    s = persistent(t).settings if as_recommended else t.settings
    if "copyable" not in a.memory_budget:
        a.memory_budget["copyable"] = python_bytes(getattr(a.loader, "dataset", None))
    return projected(t.memory, s, a.epochs, a.per_epoch, copyable=a.memory_budget["copyable"],
                     read_growth=read_growth([*a.trials, *a.over_memory]), main_at_least=a.memory_budget["own"])


def read_growth(trials: list[Trial]) -> float:
    """The workers' growth per batch measured by the setting with worker processes whose runs read the most
    batches (0 where none has workers): the Dataset's copy-on-read, best measured."""
    withw = [t.memory for t in trials if t.memory is not None and t.memory.processes]
    return max(withw, key=lambda m: m.batches).per_batch["workers"] if withw else 0.0


def passes(t: Trial, a: Any, *, as_recommended: bool = True) -> bool:
    """Whether ``t``'s projected memory passes the budget."""
    p, b = over_run(t, a, as_recommended=as_recommended), a.memory_budget["bytes"]
    return p is not None and b is not None and p["total"] > b


def set_aside(a: Any) -> None:
    """Move the settings (not the user's) whose projection passes the budget from ``a.trials`` to ``a.over_memory``."""
    if a.memory_budget is None or a.memory_budget["bytes"] is None:
        return
    over = [t for t in a.trials[1:] if passes(t, a)]
    a.trials = [t for t in a.trials if t not in over]
    a.over_memory += over


def hold(a: Any) -> None:
    """Keep the user's settings where the recommendation, with every run of it (its longer runs too), passes
    the budget."""
    best, mine = a.best, a.mine
    if best is mine or a.memory_budget is None or a.memory_budget["bytes"] is None:
        return
    runs = best if a.longer is None else _with_longer(best, a.longer[1])
    if not passes(runs, a, as_recommended=False):
        return
    a.noise = f"{label(best.settings)} was measured faster, but {over_budget(runs, a, as_recommended=False)}"
    a.best, a.confirmed = mine, None
    a.run = whole_run(mine, mine, a.trials, None, epochs=a.epochs, batches=a.per_epoch)
    a.threads_helped()


def _with_longer(best: Trial, longer: Trial) -> Trial:
    return replace(best, memory=combined([best.memory, longer.memory]))


def over_budget(t: Trial, a: Any, *, as_recommended: bool = True) -> str:
    """Why ``t`` is not recommended, in words: its projection, the budget and what it would take."""
    p = over_run(t, a, as_recommended=as_recommended)
    b = a.memory_budget
    what = (f"over your run ({p['epochs']} epoch{'s' if p['epochs'] != 1 else ''} x {p['batches']:,} batches) it "
            f"would hold {mib(p['total'])}" if p.get("extrapolated") else f"it held {mib(p['total'])}")
    out = (f"{what} (main process {mib(p['main'])}, workers {mib(p['workers'])}), over the memory budget of "
           f"{mib(b['bytes'])} ({b['from']}): it would take {mib(p['total'] - b['bytes'])} more")
    per = p["workers"] / t.memory.processes if t.memory.processes else 0
    if per > 0 and b["bytes"] > p["main"]:
        fit = int((b["bytes"] - p["main"]) // per)
        out += (f", or at most {fit} worker process{'es' if fit != 1 else ''} ({mib(per)} each)" if fit else
                f"; not one worker process fits beside the main process ({mib(per)} each)")
    return out


def copy_on_read(t: Trial, a: Any) -> str | None:
    """Where ``t``'s workers grew while reading, the cause and the fix (the Dataset's Python objects, named)."""
    m = t.memory
    if m is None or not m.processes or m.per_batch["workers"] <= 0:
        return None
    each = m.per_batch["workers"] * 100 / m.processes
    held = python_objects(getattr(a.loader, "dataset", None))
    where = f" ({'; '.join(held)})" if held else ""
    return (f"worker processes grew {mib(each)} each per 100 batches while they read ({label(t.settings)}): a "
            "worker copies every page of the Dataset's Python objects it reads, since reading a list's or a dict's "
            f"items writes their reference counts (copy-on-read){where}. Keep such data in numpy arrays or torch "
            "tensors (strings as one array of bytes with offsets, records as columns): workers read those without "
            "copying them")


def python_objects(dataset: Any) -> list[str]:
    """The Dataset's attributes that hold many Python objects (``MANY_OBJECTS``): ``self.items: a list of
    300,000 dict``; those of a wrapped Dataset (``.dataset``) too."""
    out: list[str] = []
    seen: set[int] = set()
    while dataset is not None and id(dataset) not in seen:
        seen.add(id(dataset))
        for name, value in (getattr(dataset, "__dict__", None) or {}).items():
            if isinstance(value, (list, tuple, dict, set)) and len(value) >= MANY_OBJECTS:
                first = next(iter(value.values() if isinstance(value, dict) else value))
                out.append(f"self.{name}: a {type(value).__name__} of {len(value):,} {type(first).__name__}")
        dataset = getattr(dataset, "dataset", None)
    return out


#: items of a container sampled to size it (:func:`python_bytes`)
SAMPLED = 200


def python_bytes(dataset: Any) -> int | None:
    """The bytes of the Python objects held in the Dataset's attributes of many (:func:`python_objects`; those of
    a wrapped ``.dataset`` too), from the deep size of ``SAMPLED`` items of each; None where it holds none.
    What a worker can copy by reading them.

    >>> class Records:
    ...     def __init__(self):
    ...         self.items = [{"id": i, "tags": [i]} for i in range(MANY_OBJECTS)]
    >>> 100 * MANY_OBJECTS < python_bytes(Records()) < 1000 * MANY_OBJECTS
    True
    """
    total, found, seen = 0, False, set()
    while dataset is not None and id(dataset) not in seen:
        seen.add(id(dataset))
        for value in (getattr(dataset, "__dict__", None) or {}).values():
            if isinstance(value, (list, tuple, dict, set)) and len(value) >= MANY_OBJECTS:
                items = list(value.values() if isinstance(value, dict) else value) if not isinstance(value, list) \
                    else value
                step = max(len(items) // SAMPLED, 1)
                sample = items[::step][:SAMPLED]
                total += sys.getsizeof(value) + len(items) * sum(_deep(x) for x in sample) // len(sample)
                found = True
        dataset = getattr(dataset, "dataset", None)
    return total if found else None


def _deep(x: Any, depth: int = 3) -> int:
    """An object's size with what it holds (``depth`` levels; small ints and interned strings are shared)."""
    n = sys.getsizeof(x)
    if depth and isinstance(x, dict):
        n += sum(_deep(v, depth - 1) for v in x.values())
    elif depth and isinstance(x, (list, tuple, set, frozenset)):
        n += sum(_deep(v, depth - 1) for v in x)
    return n


def said(advice: Any, a: Any) -> None:
    """The advice's memory: the set-aside settings in its table and notes (the copy-on-read of the Dataset's
    objects said once, for the setting whose workers grew most), the budget and the projections in
    ``advice.memory``."""
    if a.memory_budget is None:
        return
    advice.trials += [t for t in a.over_memory if all(t is not u for u in advice.trials)]
    advice.memory = {"budget_bytes": a.memory_budget["bytes"], "budget_from": a.memory_budget["from"],
                     "your_process_bytes": a.memory_budget["own"],
                     "dataset_objects_bytes": a.memory_budget.get("copyable"),
                     "user": over_run(a.mine, a, as_recommended=False),
                     "recommended": over_run(a.best, a, as_recommended=False),
                     "over_budget": [{"settings": label(t.settings), "projected": over_run(t, a),
                                      "why": over_budget(t, a), "copy_on_read": copy_on_read(t, a)}
                                     for t in a.over_memory]}
    mine_over = passes(a.mine, a, as_recommended=False)
    advice.notes += [f"not recommended, {label(t.settings)}: {over_budget(t, a)}" for t in a.over_memory]
    if mine_over:
        advice.notes.append(f"your settings: {over_budget(a.mine, a, as_recommended=False)}")
    grown = [t for t in [*a.over_memory, *([a.mine] if mine_over else [])] if copy_on_read(t, a)]
    if grown:
        most = max(grown, key=lambda t: t.memory.per_batch["workers"] / t.memory.processes)
        advice.notes.append(copy_on_read(most, a))
