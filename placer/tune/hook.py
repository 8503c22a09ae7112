"""Inside a script run by ``placer tune``: see its DataLoaders, apply a setting, time its loop, stop it.

May import: the standard library at load time; torch only once the script has imported it;
placer.executor.stream.source (the one loader rebuilder) only when a run applies thread workers;
placer.stream.procmem loaded from its file (standard library and psutil only);
placer.stream.dataset_cache only in a run that looks for a cache inside the Dataset, and
placer.stream.{cache_advice,wrappers} with placer.executor.stream.store only in a run that applies one
(each imported inside the function that needs it, in that run alone). This file is loaded by
the ``sitecustomize`` that ``placer tune`` puts first on the script's ``PYTHONPATH``, before
the script's first line, so it imports nothing the script would not: the script's own import
order (and what it sets before ``import torch``, such as ``OMP_NUM_THREADS``) holds.

What it does in the script's process, and only there (never in the DataLoader's worker
processes nor in other Pythons the script starts):

- when ``torch.utils.data`` is imported, wraps ``DataLoader.__init__`` and ``__iter__``:
  every loader built is recorded with where the script built it (the first frame outside
  torch and placer: ``train.py:57``) and its arguments; every iteration is timed batch by
  batch: the wait inside ``next()`` and the time between batches (the script's step,
  logging, validation). Where CUDA is initialised, each ``next()`` first waits for the GPU's
  queued work, so that work counts as the step's time, not as waiting for data;
- applies a setting (``num_workers``, worker processes or threads, ``prefetch_factor``,
  ``persistent_workers``, ``pin_memory``, torch's intra-op threads) to the loaders built at
  the chosen place, as they are built, without the script knowing;
- applies a cache inside the Dataset (:meth:`placer.stream.cache_advice.CacheAdvice.apply`: a
  method's outputs kept by its arguments in a store in shared memory, inside the same ``Subset``
  wrappers) to the dataset of the loaders built at the chosen place, before ``DataLoader``'s own
  ``__init__`` sees it;
- in a run that looks for such a cache, calls :func:`placer.stream.dataset_cache.find_cache` at
  the first ``iter()`` of the chosen loader (its own settings, no step: the script's step is not
  reachable from here), writes what it found and ends the script;
- stops the script after enough batches of the timed loader (or seconds), writing what it
  measured first and ending the loader's worker processes (and removing the cache's store), so
  no process or file is left behind.

The run's instructions come from the JSON file named by ``PLACER_TUNE``: ``mode``
(``trial``: time and stop; ``apply``: apply and run to the end; ``cache``: look for a cache inside
the Dataset at the target's first ``iter()`` and stop, with ``find``: ``batches``, ``budget_s``,
``budget_bytes`` for :func:`~placer.stream.dataset_cache.find_cache`), ``report`` (where to write
the measurements), ``target`` (a place ``file:line``, or null: time every loader),
``settings`` (or null: as written), ``warmup`` (batches not counted; default none: a run is counted
from the loader's first ``iter()``, its workers' start included), ``batches`` (counted
batches after which a trial stops), ``min_s`` (counted seconds a trial lasts at least when
``batches`` is null), ``stop_s`` (seconds after which a trial stops anyway), ``digest``
(hash every batch of the timed loader) and ``cache`` (or null: ``method``, ``Class.method`` as
:class:`~placer.stream.cache_advice.CacheAdvice` names it, and ``budget_bytes``: the cache applied at
the target).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import threading
import time
import weakref

#: the process this hook serves: set once, so that Pythons the script starts do not tune themselves
OWNER = "PLACER_TUNE_OWNER"
#: the exit status of a trial that the hook stopped after enough batches
STOPPED = 0
_T0 = time.perf_counter()
#: placer's own folder: frames there are not where the script built a loader
_PLACER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _State:
    """What one run of the script measured: the loaders built, the iterations of each."""

    def __init__(self, config: dict):
        self.config = config
        self.loaders: list[dict] = []
        self.lock = threading.Lock()
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.done = False
        self.stopped = ""
        self.error: str | None = None
        self.refused: str | None = None
        self.first_iter_s: float | None = None
        #: what the search for a cache inside the Dataset found (``CacheAdvice.as_dict()``), in a ``cache`` run
        self.cache: dict | None = None
        #: the stores of the caches this process applied, by the dataset they keep outputs of (held, so that
        #: its id is not reused): removed when the hook ends the script
        self.stores: dict[tuple, tuple] = {}
        self.finding = False

    # -- the record of a loader ----------------------------------------------------------
    def built(self, loader, site: str, arguments: dict, applied: dict | None) -> dict:
        rec = {"site": site, "arguments": arguments, "applied": applied, "iters": 0, "batches": 0,
               "samples": 0, "wait_s": 0.0, "between_s": 0.0, "first_batch_s": None, "iterated_s": 0.0,
               "epoch_batches": [], "torch_threads": None, "counted": 0, "counted_samples": 0,
               "counted_s": 0.0, "counted_wait_s": 0.0, "digest": None, "_t_first_counted": None,
               "_t_last": None, "_hash": None, "_draws": False, "memory_start": None, "memory_end": None}
        with self.lock:
            self.loaders.append(rec)
        return rec

    def timed(self, rec: dict) -> bool:
        target = self.config.get("target")
        return target is None or rec["site"] == target

    # -- stopping ------------------------------------------------------------------------
    def enough(self, rec: dict) -> bool:
        cfg = self.config
        if cfg.get("mode") != "trial" or not self.timed(rec):
            return False
        if cfg.get("batches") is not None:
            return rec["counted"] >= cfg["batches"]
        return rec["counted"] >= cfg.get("min_batches", 8) and rec["counted_s"] >= cfg.get("min_s", 1.0)

    def over_time(self) -> bool:
        stop_s = self.config.get("stop_s")
        return (self.config.get("mode") == "trial" and stop_s is not None and self.first_iter_s is not None
                and time.perf_counter() - _T0 - self.first_iter_s > stop_s)

    def report(self) -> dict:
        out = []
        for rec in self.loaders:
            r = {k: v for k, v in rec.items() if not k.startswith("_")}
            if rec["_hash"] is not None:
                r["digest"] = rec["_hash"].hexdigest()
            out.append(r)
        return {"loaders": out, "stopped": self.stopped, "error": self.error, "refused": self.refused,
                "first_iter_s": self.first_iter_s, "wall_s": time.perf_counter() - _T0,
                "cuda": _cuda_used(), "cache": self.cache}

    def write(self) -> None:
        path = self.config.get("report")
        if not path:
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.report(), f)
        os.replace(tmp, path)

    def stop(self, why: str) -> None:
        """Write the measurements, end the loaders' workers and end the script (a trial's end)."""
        with self.lock:
            if self.done:
                return
            self.done = True
            self.stopped = why
        end = memory()
        for rec in self.loaders:
            if rec["memory_start"] is not None:
                rec["memory_end"] = end
        self.write()
        for it in list(self.live):
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                try:
                    shutdown()
                except Exception:  # noqa: BLE001 - ending anyway; the parent ends the process group
                    pass
        self.close_stores()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(STOPPED)

    def close_stores(self) -> None:
        """Remove the applied caches' files (``os._exit`` runs no finaliser that would)."""
        for _, store in self.stores.values():
            try:
                store.close()
            except Exception:  # noqa: BLE001 - a store already gone
                pass


_state: _State | None = None


def memory() -> dict | None:
    """The memory of this process and of its child processes (the DataLoader's workers), in bytes
    (:func:`placer.stream.procmem.memory`, loaded from its file: nothing of placer's package is imported
    into the script); None where psutil is not installed."""
    global _procmem
    if _procmem is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_placer_procmem", os.path.join(_PLACER, "stream", "procmem.py"))
        _procmem = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_procmem)
    return _procmem.memory()


#: :mod:`placer.stream.procmem`, once :func:`memory` has loaded it
_procmem = None


def _cuda_used() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _sync() -> None:
    """Wait for the GPU's queued work (where CUDA is in use), so it is not counted as waiting for data."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _site() -> str:
    """Where the script built a loader: the first frame outside torch, placer and this hook."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not (os.sep + "torch" + os.sep in name or name.startswith(_PLACER + os.sep) or name.startswith("<")):
            return f"{os.path.relpath(name) if not os.path.isabs(name) else _short(name)}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _samples(batch) -> int:
    """The samples in a batch: the leading dimension of its first array (1 where it has none)."""
    seen = [batch]
    while seen:
        x = seen.pop(0)
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(x, dict):
            seen.extend(x.values())
        elif isinstance(x, (list, tuple)):
            if x and not isinstance(x[0], (list, tuple, dict)) and getattr(x[0], "shape", None) is None:
                return len(x)
            seen.extend(x)
    return 1


def _hash_into(h, x) -> None:
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        h.update(f"{tuple(x.shape)}{x.dtype}".encode())
        h.update(x.contiguous().view(-1).numpy().tobytes() if x.numel() else b"")
    elif hasattr(x, "tobytes") and hasattr(x, "dtype"):
        h.update(f"{getattr(x, 'shape', ())}{x.dtype}".encode())
        h.update(x.tobytes())
    elif isinstance(x, dict):
        for k in sorted(x, key=repr):
            h.update(repr(k).encode())
            _hash_into(h, x[k])
    elif isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__}{len(x)}".encode())
        for v in x:
            _hash_into(h, v)
    else:
        h.update(repr(x).encode())


class _Timed:
    """An iterator over a loader's batches that times each ``next()`` and the time between them."""

    def __init__(self, it, rec: dict, state: _State, t_iter: float):
        self.it, self.rec, self.state = it, rec, state
        self.t_iter = t_iter  # before ``iter(loader)``: the workers' start is the iteration's
        self.n = 0
        self.last_end: float | None = None
        state.live.add(it) if _weakable(it) else None

    def __iter__(self):
        return self

    def __len__(self):
        return len(self.it)

    def __getattr__(self, name):
        return getattr(self.it, name)

    def __next__(self):
        rec, st = self.rec, self.state
        if st.timed(rec):
            _sync()
        t0 = time.perf_counter()
        try:
            batch = next(self.it)
        except StopIteration:
            rec["epoch_batches"].append(self.n)
            raise
        t1 = time.perf_counter()
        self._count(batch, t0, t1)
        return batch

    def _count(self, batch, t0: float, t1: float) -> None:
        rec, st, cfg = self.rec, self.state, self.state.config
        n = _samples(batch)
        if self.n == 0:
            rec["first_batch_s"] = rec["first_batch_s"] if rec["first_batch_s"] is not None else t1 - self.t_iter
        else:
            rec["between_s"] += t0 - self.last_end
        rec["iterated_s"] += t1 - (self.last_end if self.n else self.t_iter)
        rec["wait_s"] += t1 - t0
        rec["batches"] += 1
        rec["samples"] += n
        self.n += 1
        self.last_end = t1
        if not st.timed(rec):
            return
        if rec["_hash"] is not None:
            _hash_into(rec["_hash"], batch)
        if rec["batches"] > cfg.get("warmup", 0):
            # counted: from the end of the last warm-up batch, so each counted batch brings its step and wait;
            # without warm-up, from the loader's first ``iter()``: the workers' start is counted, as the script pays it
            if rec["_t_first_counted"] is None:
                rec["_t_first_counted"] = rec["_t_last"] if rec["_t_last"] is not None else self.t_iter
                rec["memory_start"] = memory()
            rec["counted"] += 1
            rec["counted_samples"] += n
            rec["counted_wait_s"] += t1 - t0
            rec["counted_s"] = t1 - rec["_t_first_counted"]
        rec["_t_last"] = t1
        if st.enough(rec):
            st.stop("batches")
        elif st.over_time():
            st.stop("time")


def _weakable(x) -> bool:
    try:
        weakref.ref(x)
        return True
    except TypeError:
        return False


def _patch(dataloader_module) -> None:
    """Wrap ``DataLoader.__init__`` and ``__iter__`` (once)."""
    import inspect

    DataLoader = dataloader_module.DataLoader
    if getattr(DataLoader, "_placer_tuned", False):
        return
    init, iter_ = DataLoader.__init__, DataLoader.__iter__
    signature = inspect.signature(init)
    state = _state

    def __init__(self, *args, **kwargs):
        if state is None or getattr(self, "_placer_rec", None) is not None:
            return init(self, *args, **kwargs)
        site = _site()
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return init(self, *args, **kwargs)
        arguments = {k: _describe(v) for k, v in bound.arguments.items() if k not in ("self", "kwargs")}
        settings = state.config.get("settings")
        applied = None
        threads = False
        theirs = bool(bound.arguments.get("persistent_workers")) and bool(bound.arguments.get("num_workers"))
        if settings is not None and (state.config.get("target") in (None, site)):
            applied, threads = _apply(bound, settings)
        cache = None
        if state.config.get("cache") and state.config.get("target") in (None, site) and not state.finding:
            cache = _with_cache(bound, state.config["cache"])
        init(*bound.args, **bound.kwargs)
        rec = state.built(self, site, arguments, applied)
        rec["_draws"] = bool(applied and applied.get("persistent_workers")) and not theirs
        rec["cache"] = cache
        rec["iterable"] = isinstance(self.dataset, dataloader_module.IterableDataset)
        try:
            rec["length"] = len(self)
        except TypeError:
            rec["length"] = None
        if threads:
            _as_thread_loader(self, settings)
        if state.config.get("digest") and state.timed(rec):
            rec["_hash"] = hashlib.sha256()
        self._placer_rec = rec

    def __iter__(self):
        t_iter = time.perf_counter()
        rec = getattr(self, "_placer_rec", None)
        if rec is not None and rec["_draws"] and getattr(self, "_iterator", None) is not None:
            # persistent workers reuse one iterator, which draws its workers' base seed once: draw it at
            # every epoch, as the script's own loader does, so a shuffle on the same generator (or the
            # script's draws from torch's global one) gets the same numbers
            dataloader_module.torch.empty((), dtype=dataloader_module.torch.int64).random_(generator=self.generator)
        if (rec is not None and state.config.get("mode") == "cache" and state.timed(rec) and not state.finding
                and rec["iters"] == 0):
            state.cache = _find_cache(self, state)
            state.stop("cache")
        it = iter_(self)
        if state is None or rec is None:
            return it
        return _started(self, rec, it, t_iter)

    __init__.__wrapped__ = init
    __iter__.__wrapped__ = iter_
    DataLoader.__init__ = __init__
    DataLoader.__iter__ = __iter__
    DataLoader._placer_tuned = True


def _started(loader, rec: dict, it, t_iter: float | None = None):
    """A timed iterator over ``it``; the first iteration of a timed loader sets torch's threads."""
    state = _state
    rec["iters"] += 1
    if state.first_iter_s is None and state.timed(rec):
        state.first_iter_s = time.perf_counter() - _T0
    threads = (state.config.get("settings") or {}).get("torch_threads")
    torch = sys.modules.get("torch")
    if rec["applied"] is not None and threads and torch is not None:
        torch.set_num_threads(int(threads))
    if torch is not None and rec["torch_threads"] is None:
        rec["torch_threads"] = torch.get_num_threads()
    return _Timed(it, rec, state, time.perf_counter() if t_iter is None else t_iter)


def _describe(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _apply(bound, settings: dict) -> tuple[dict, bool]:
    """Set the loader's arguments to ``settings``; returns what was set and whether the workers are threads."""
    a = bound.arguments
    workers = int(settings.get("num_workers", 0))
    threads = settings.get("worker_kind") in ("threads", "thread") and workers > 0
    applied = {"num_workers": workers, "pin_memory": bool(settings.get("pin_memory", False))}
    a["num_workers"] = 0 if threads else workers
    a["pin_memory"] = applied["pin_memory"]
    if workers and not threads:
        a["prefetch_factor"] = settings.get("prefetch_factor") or 2
        a["persistent_workers"] = bool(settings.get("persistent_workers", False))
        applied |= {"prefetch_factor": a["prefetch_factor"], "persistent_workers": a["persistent_workers"]}
        if settings.get("in_order") is False and "in_order" in bound.signature.parameters:
            a["in_order"] = applied["in_order"] = False  # batches as the workers finish them
    else:
        a["prefetch_factor"] = None
        a["persistent_workers"] = False
        a.pop("multiprocessing_context", None)
        a.pop("timeout", None)
        if threads:
            applied |= {"prefetch_factor": settings.get("prefetch_factor") or 2, "worker_kind": "threads"}
    return applied, threads


def _with_cache(bound, spec: dict) -> dict:
    """Put the cache ``spec`` names inside the loader's dataset (its ``Subset`` and ``ConcatDataset`` wrappers
    kept); what was done.

    The cache is applied only to datasets of the class it was found in: a script that builds
    another dataset at the same place (another split, another option) keeps its own. A loader built
    again around the same datasets (each epoch, say) reads the store the first one filled; other
    dataset objects, even of the same class, get their own store, as their outputs by the same arguments
    may differ (a training and a validation split built by one function).
    """
    from placer.executor.stream.store import SampleStore
    from placer.stream.cache_advice import CacheAdvice
    from placer.stream.wrappers import leaves

    method = str(spec["method"])
    dataset = bound.arguments.get("dataset")
    cls = method.rsplit(".", 1)[0]
    mine = tuple(leaf for leaf in leaves(dataset) if type(leaf).__name__ == cls)
    if not mine:
        kinds = ", ".join(dict.fromkeys(type(leaf).__name__ for leaf in leaves(dataset)))
        return {"method": method, "applied": False, "reason": f"the dataset built here is a {kinds}, not a {cls}"}
    key = tuple(id(leaf) for leaf in leaves(dataset))
    if key not in _state.stores:
        _state.stores[key] = (leaves(dataset), SampleStore(int(spec["budget_bytes"])))
    store = _state.stores[key][1]
    bound.arguments["dataset"] = CacheAdvice(method, budget_bytes=int(spec["budget_bytes"])).apply(dataset, store)
    return {"method": method, "applied": True, "reason": "", "folder": store.folder}


def _find_cache(loader, state: _State) -> dict:
    """:func:`placer.stream.dataset_cache.find_cache` on the script's loader, with its own settings and no step
    (what :meth:`~placer.stream.cache_advice.CacheAdvice.as_dict` gives, or why nothing was looked for)."""
    find = state.config.get("find") or {}
    kwargs = {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
              "prefetch_factor": loader.prefetch_factor if loader.num_workers else None,
              "persistent_workers": bool(loader.persistent_workers and loader.num_workers)}
    state.finding = True
    try:
        from placer.stream.dataset_cache import find_cache

        advice = find_cache(loader, None, loader_kwargs=kwargs, batches=int(find.get("batches", 20)),
                            budget_s=float(find.get("budget_s", 20.0)), budget_bytes=find.get("budget_bytes"))
        return advice.as_dict()
    except Exception as e:  # noqa: BLE001 - a dataset that cannot be probed gets its loader advice still
        return {"method": None, "recommended": False, "reason": f"probing the dataset failed: {type(e).__name__}: {e}"}
    finally:
        state.finding = False


def _as_thread_loader(loader, settings: dict) -> None:
    """Make ``loader`` iterate through placer's thread-pool loader (same batches, same order), rebuilt by
    placer's one loader rebuilder at each ``iter()``."""
    from placer.executor.stream.source import rebuild_loader

    cls = type(loader)
    sub = type(cls.__name__, (cls,), {"__iter__": _thread_iter, "__module__": cls.__module__})
    loader._placer_threads = {"num_workers": int(settings["num_workers"]),
                              "prefetch_factor": int(settings.get("prefetch_factor") or 2),
                              "pin_memory": bool(settings.get("pin_memory", False))}
    loader._placer_rebuild = rebuild_loader
    object.__setattr__(loader, "__class__", sub)


def _thread_iter(self):
    t_iter = time.perf_counter()
    pool = self._placer_rebuild(self, self._placer_threads, threads=True)
    it = iter(pool)
    rec = getattr(self, "_placer_rec", None)
    return it if rec is None or _state is None else _started(self, rec, it, t_iter)


def _refuse_spawn(module) -> None:
    """A multi-process launch inside the script: refused in a trial (tune one rank instead)."""
    spawn = getattr(module, "spawn", None)
    if spawn is None or getattr(spawn, "_placer_tuned", False):
        return

    def refused(*args, **kwargs):
        st = _state
        if st is not None and st.config.get("mode") == "trial":
            st.refused = ("the script starts several processes with torch.multiprocessing.spawn: tune one "
                          "rank (a single-process run of the script) instead")
            st.stop("refused")
        return spawn(*args, **kwargs)

    refused._placer_tuned = True
    module.spawn = refused


class _Finder:
    """Patches torch's DataLoader when the script imports it (and ``torch.multiprocessing``)."""

    WATCH = {"torch.utils.data.dataloader": _patch, "torch.multiprocessing": _refuse_spawn}

    def find_spec(self, name, path=None, target=None):
        if name not in self.WATCH:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _After(spec.loader, self.WATCH[name])
                return spec
        return None


class _After:
    """A module loader that runs a patch after the module's own code."""

    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def _excepthook(kind, value, tb) -> None:
    st = _state
    if st is not None:
        st.error = f"{kind.__name__}: {value}"
    _previous_excepthook(kind, value, tb)


_previous_excepthook = sys.excepthook


def _at_exit() -> None:
    st = _state
    if st is not None and not st.done:
        st.done = True
        st.stopped = st.stopped or "exit"
        end = memory()
        for rec in st.loaders:
            if rec["memory_start"] is not None:
                rec["memory_end"] = end
        st.write()
        st.close_stores()


def install() -> None:
    """Start tuning this process, once, where ``PLACER_TUNE`` names the run's instructions."""
    global _state
    path = os.environ.get("PLACER_TUNE")
    owner = os.environ.get(OWNER)
    if not path or (owner and owner != str(os.getpid())) or _state is not None:
        return
    os.environ[OWNER] = str(os.getpid())
    with open(path) as f:
        _state = _State(json.load(f))
    sys.excepthook = _excepthook
    atexit.register(_at_exit)
    mod = sys.modules.get("torch.utils.data.dataloader")
    if mod is not None:
        _patch(mod)
    sys.meta_path.insert(0, _Finder())
