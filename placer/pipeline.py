"""Declaring stages and building and validating the pipeline's graph.

May import: networkx, pydantic, placer.errors, placer.devices (device names), placer.precision
(precision names). Never
torch, dask or numba: planning and validation must stay fast and importable anywhere.

A pipeline is a :class:`networkx.DiGraph` whose nodes are stage names, each node
holding its :class:`Stage` under the attribute ``"stage"``; an edge ``u -> v``
carries ``u``'s output into ``v`` under the argument name ``edge["name"]``.
:class:`Pipeline` is a thin wrapper that builds and checks such a graph.

Examples
--------
>>> p = Pipeline("demo")
>>> @p.stage(kind="cleaning")
... def load(device):
...     return [1.0, 2.0]
>>> @p.stage(kind="preprocessing")
... def double(load, device):
...     return [2 * v for v in load]
>>> p.order()
['load', 'double']
>>> p.stages["double"].inputs
{'load': 'load'}
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from placer.devices import implementation_class
from placer.precision import check_allowed, check_precision
from placer.errors import (
    CycleError,
    DanglingInputError,
    DuplicateStageError,
    EmptyPipelineError,
    MissingImplementationError,
    PipelineError,
)

KINDS = ("cleaning", "preprocessing", "training", "inference", "other")
Kind = Literal["cleaning", "preprocessing", "training", "inference", "other"]
#: How an implementation wants its array data: torch tensors on the stage's device,
#: numpy arrays on the host (numpy, pandas, numba.njit, dask code), or numba CUDA
#: device arrays (``@cuda.jit`` kernels); ``any`` takes values as they come.
API = Literal["torch", "numpy", "numba.cuda", "any"]
DEVICE_CLASSES = ("cpu", "gpu")
#: What a stage does in a stream: runs ``once``; is the stream's ``source`` (yields
#: batches); runs per ``batch``; or is the ``step`` that consumes the stream (a train
#: step with state that persists across batches, or an inference step).
Role = Literal["once", "source", "batch", "step"]
STREAM_ROLES = ("source", "batch", "step")
#: argument names a stream stage's function may take without them being inputs
BATCH_INFO = "batch_info"
STATE = "state"


class Impl(BaseModel):
    """One implementation of a stage: a callable and the data format it takes.

    Parameters
    ----------
    fn : callable
        The implementation; its arguments are the stage's inputs and params.
    api : {"torch", "numpy", "numba.cuda", "any"}
        The data format it wants (see :data:`API`); inputs are converted to it.
    takes_device : bool
        Filled in from the signature: whether ``fn`` has a ``device`` parameter
        (only then is ``device=`` passed).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    fn: Callable[..., Any]
    api: API = "torch"
    #: whether ``fn`` names a ``device`` parameter (filled in from its signature);
    #: only then is ``device=`` passed
    takes_device: bool = False

    @model_validator(mode="after")
    def _signature(self) -> Impl:
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):  # builtins without a signature
            return self
        object.__setattr__(self, "takes_device", "device" in params)
        return self


class Stage(BaseModel):
    """A stage of a pipeline.

    A stage has either one device-agnostic torch function ``fn`` (called with
    ``device=torch.device(...)``) or separate ``cpu`` and ``gpu`` implementations,
    or both (``cpu``/``gpu`` win over ``fn`` on their device class).

    Inputs map the implementation's argument names to the producing stage's name;
    ``params`` are passed as keyword arguments too.

    Parameters
    ----------
    name : str
        Unique within its pipeline; other stages' ``inputs`` refer to it.
    kind : {"cleaning", "preprocessing", "training", "inference", "other"}
        What the stage does; reports, advice and the rule-of-thumb baseline use it.
    fn : Impl, optional
        The device-agnostic torch implementation (called with ``device=``).
    cpu, gpu : Impl, optional
        Device-specific implementations; each wins over ``fn`` on its device class.
    inputs : dict of str to str
        Argument name → the name of the stage whose output it receives.
    pin : str, optional
        A device the stage must run on (``"cpu"``, ``"gpu"``, ``"gpu:1"``).
    params : dict
        Keyword arguments passed on every call (part of the stage's code hash).
    data_parallel : bool
        The CPU implementation is row-wise along axis 0, so it may be split into partitions.
    doc : str
        One line for reports.
    flops, bytes_moved : float, optional
        Declared work counts, used to predict devices that are absent.
    role : {"once", "source", "batch", "step"}
        What the stage does in a stream (see :data:`Role`).
    epochs : int
        A source: passes over its data.
    batch_size : int, optional
        A source: samples per batch when its function returns a ``Dataset``.
    init : callable, optional
        A step: builds the state that persists across batches (``init(device=...)``).
    random : bool
        A per-batch stage whose output differs between epochs: never cached.
    cache_key : callable, optional
        A source: the key of each batch it yields (``cache_key(batch)``, plain data:
        numbers, strings, tuples of them), equal for batches that are the same in any
        epoch. With it a cache point holds outputs by key, so a source that reshuffles
        its batches each epoch can be cached.
    precision : tuple of str, optional
        Lower precisions the stage may run in (``("tf32", "bf16")``, see
        :mod:`placer.precision`); None takes the pipeline's default, ``()`` allows none.
        Nothing changes numerics unless allowed here, by the pipeline or by the user.
    tolerance : float, optional
        The relative difference from fp32 (of the outputs, or the loss of a training
        stage) a lower precision may make and still be chosen (default
        :data:`placer.precision.DEFAULT_TOLERANCE`).
    run_precision : str
        The precision the stage runs in (set by the executor from a plan or
        ``--precision``; ``fp32`` changes nothing).

    Examples
    --------
    >>> s = Stage(name="clean", kind="cleaning", fn=Impl(fn=lambda x, device: x), inputs={"x": "load"})
    >>> s.inputs, s.fn.takes_device
    ({'x': 'load'}, True)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", validate_assignment=True)

    name: str = Field(min_length=1)
    kind: str = "other"
    fn: Impl | None = None
    cpu: Impl | None = None
    gpu: Impl | None = None
    inputs: dict[str, str] = Field(default_factory=dict)
    pin: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    #: the CPU implementation is row-wise along axis 0, so it may be split into partitions
    data_parallel: bool = False
    doc: str = ""
    #: optional declared work counts, used to predict devices that are absent
    flops: float | None = None
    bytes_moved: float | None = None
    #: what the stage does in a stream (see :data:`Role`); ``once`` stages reading a
    #: source or a per-batch stage become ``batch`` stages when the pipeline is validated
    role: Role = "once"
    #: a source: passes over its data (each pass calls the source function again)
    epochs: int = Field(1, ge=1)
    #: a source: samples per batch when its function returns a ``Dataset`` (else informative)
    batch_size: int | None = Field(None, ge=1)
    #: a step: builds the state that persists across batches (``init(device=...)``)
    init: Callable[..., Any] | None = None
    #: a per-batch stage whose output differs between epochs (random augmentation): never cached
    random: bool = False
    #: a source: the key of each batch it yields, for a cache that survives reshuffling
    cache_key: Callable[[Any], Any] | None = None
    #: lower precisions the stage may run in (None: the pipeline's default; see placer.precision)
    precision: tuple[str, ...] | None = None
    #: the relative difference from fp32 a lower precision may make (None: the default)
    tolerance: float | None = Field(None, gt=0)
    #: the precision the stage runs in (fp32: nothing changed)
    run_precision: str = "fp32"

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, v: Any, info) -> Any:
        return check_allowed(v, stage=info.data.get("name"))

    @field_validator("run_precision", mode="before")
    @classmethod
    def _run_precision(cls, v: Any, info) -> Any:
        return check_precision(v, stage=info.data.get("name"), field="run_precision")

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str, info) -> str:
        if v not in KINDS:
            name = info.data.get("name", "?")
            raise ValueError(
                f"stage {name!r}: unknown kind {v!r}; use one of {', '.join(KINDS)}"
            )
        return v

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {v: v}
        if isinstance(v, (list, tuple)):
            return {x: x for x in v}
        return v

    @field_validator("fn", "cpu", "gpu", mode="before")
    @classmethod
    def _impl(cls, v: Any, info) -> Any:
        if v is None or isinstance(v, (Impl, dict)):
            return v
        if callable(v):
            api = {"fn": "torch", "cpu": "numpy", "gpu": "torch"}[info.field_name]
            return Impl(fn=v, api=api)
        raise ValueError(
            f"stage {info.data.get('name', '?')!r}: {info.field_name} must be a callable or "
            f"Impl, got {type(v).__name__}"
        )

    @model_validator(mode="after")
    def _has_impl(self) -> Stage:
        if self.fn is None and self.cpu is None and self.gpu is None:
            raise ValueError(
                f"stage {self.name!r} has no implementation; give fn= (device-agnostic torch) "
                "or cpu=/gpu= functions"
            )
        return self

    def impl_for(self, device_class: str) -> Impl | None:
        """The implementation used on a device class (``"cpu"`` or ``"gpu"``)."""
        own = self.cpu if device_class == "cpu" else self.gpu
        return own if own is not None else self.fn

    def device_classes(self) -> list[str]:
        """Device classes this stage can run on."""
        return [c for c in DEVICE_CLASSES if self.impl_for(c) is not None]

    def code_hash(self) -> str:
        """A hash of the stage's code and parameters (changes when either does)."""
        h = hashlib.sha256()
        h.update(self.name.encode())
        for impl in (self.fn, self.cpu, self.gpu):
            if impl is None:
                h.update(b"-")
                continue
            code = getattr(impl.fn, "__code__", None)
            if code is not None:
                h.update(code.co_code)
                h.update(repr(code.co_consts).encode())
                h.update(repr(code.co_names).encode())
            else:
                h.update(repr(impl.fn).encode())
            h.update(impl.api.encode())
        h.update(repr(sorted(self.inputs.items())).encode())
        h.update(repr(sorted((k, repr(v)) for k, v in self.params.items())).encode())
        h.update(repr(self.data_parallel).encode())
        if self.role != "once":
            h.update(repr((self.role, self.epochs, self.batch_size, self.random)).encode())
        return h.hexdigest()[:16]


def _infer_inputs(fn: Callable, params: Mapping[str, Any], reserved: tuple[str, ...] = ()) -> dict[str, str]:
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in ("device", BATCH_INFO, *reserved) or p.name in params:
            continue
        if p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        if p.default is not inspect.Parameter.empty:
            continue
        names.append(p.name)
    return {n: n for n in names}


class Pipeline:
    """A pipeline of stages: a thin wrapper around a ``networkx.DiGraph``.

    Parameters
    ----------
    name : str
        Shown in reports and run records.
    graph : networkx.DiGraph, optional
        A hand-built graph; each node's ``"stage"`` attribute is a :class:`Stage`
        or a dict of its fields. Edges without a matching stage input become inputs
        named after the edge's ``"name"`` attribute (default: the producer's name).
    size : int, optional
        The scale the pipeline was built at (``build(size)``).
    size_unit : str
        What ``size`` counts (rows, images, samples, ...); reports and advice use it.
    precision : tuple of str
        Lower precisions every stage that declares none may run in (default: none).
    """

    def __init__(self, name: str = "pipeline", graph: nx.DiGraph | None = None, *,
                 size: int | None = None, size_unit: str = "rows", precision: Iterable[str] | str = ()):
        self.name = name
        self.size = size
        self.size_unit = size_unit
        self.precision = check_allowed(precision) or ()
        self.graph = nx.DiGraph(name=name)
        if graph is not None:
            self._adopt(graph)

    # -- building -----------------------------------------------------------------
    def add(self, stage: Stage | None = None, /, **fields: Any) -> Stage:
        """Add a stage (a :class:`Stage` or its fields as keywords) and return it."""
        if stage is None:
            stage = Stage(**fields)
        if stage.name in self.graph:
            raise DuplicateStageError(
                f"stage {stage.name!r} is declared twice; give each stage a unique name",
                stage=stage.name,
            )
        self.graph.add_node(stage.name, stage=stage)
        self._order_cache = None
        return stage

    def stage(
        self,
        name: str | None = None,
        *,
        kind: str = "other",
        inputs: Iterable[str] | Mapping[str, str] | None = None,
        device: Literal["cpu", "gpu"] | None = None,
        api: str | None = None,
        pin: str | None = None,
        params: Mapping[str, Any] | None = None,
        data_parallel: bool | None = None,
        flops: float | None = None,
        bytes_moved: float | None = None,
        random: bool = False,
        precision: Iterable[str] | str | None = None,
        tolerance: float | None = None,
        **stream: Any,
    ) -> Callable[[Callable], Callable]:
        """Decorator declaring a stage from a function.

        Without ``device`` the function is the device-agnostic torch version and
        receives ``device=``. With ``device="cpu"`` or ``"gpu"`` it is that device's
        implementation; decorating a second function with the same ``name`` and the
        other device adds it to the same stage. Inputs default to the function's
        required arguments, each read from the stage of the same name.

        A stage that reads a stream's source or another per-batch stage runs once per
        batch (see :meth:`source` and :meth:`step`); ``random=True`` says its output
        differs between epochs, so it is never cached. A per-batch function may take
        ``batch_info`` (a :class:`~placer.stream.BatchInfo`: epoch, index, a seed).
        ``precision`` lists the lower precisions it may run in and ``tolerance`` the
        difference from fp32 they may make (see :class:`Stage`).
        """
        reserved = (STATE,) if stream.get("role") == "step" else ()

        def register(fn: Callable) -> Callable:
            sname = name or fn.__name__
            prm = dict(params or {})
            ins = inputs if inputs is not None else _infer_inputs(fn, prm, reserved)
            slot = "fn" if device is None else device
            if slot not in ("fn", "cpu", "gpu"):
                raise PipelineError(
                    f"stage {sname!r}: device must be 'cpu', 'gpu' or omitted, got {device!r}",
                    stage=sname,
                )
            default_api = {"fn": "torch", "cpu": "numpy", "gpu": "torch"}[slot]
            impl = Impl(fn=fn, api=api or default_api)
            if sname in self.graph:
                old: Stage = self.graph.nodes[sname]["stage"]
                if getattr(old, slot) is not None:
                    raise DuplicateStageError(
                        f"stage {sname!r} already has a {slot} implementation; "
                        "use another name or another device",
                        stage=sname,
                    )
                upd = {slot: impl}
                if data_parallel is not None:
                    upd["data_parallel"] = data_parallel
                if stream.get("init") is not None:
                    upd["init"] = stream["init"]
                new = old.model_copy(update=upd)
                self.graph.nodes[sname]["stage"] = new
            else:
                self.add(
                    Stage(
                        name=sname,
                        kind=kind,
                        inputs=ins,
                        pin=pin,
                        params=prm,
                        data_parallel=bool(data_parallel),
                        doc=inspect.getdoc(fn) or "",
                        flops=flops,
                        bytes_moved=bytes_moved,
                        random=random,
                        precision=check_allowed(precision, stage=sname),
                        tolerance=tolerance,
                        **stream,
                        **{slot: impl},
                    )
                )
            return fn

        return register

    def source(
        self,
        name: str | None = None,
        *,
        kind: str = "cleaning",
        epochs: int = 1,
        batch_size: int | None = None,
        inputs: Iterable[str] | Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        cache_key: Callable[[Any], Any] | None = None,
    ) -> Callable[[Callable], Callable]:
        """Decorator declaring a stream's source: a function returning its batches.

        The function is called once per epoch (with ``batch_info`` when it takes it,
        whose ``epoch`` lets it reshuffle) and returns an iterable of batches (a
        generator, a list), a ``torch.utils.data.Dataset`` (batched by a DataLoader
        with ``batch_size`` and the planned workers), or a ``DataLoader`` (its
        dataset, sampler and collate function are kept; its worker settings are the
        user's baseline). Inputs come from one-shot stages. A source runs on the CPU.

        A source that reshuffles (takes ``batch_info``) can still have a cache point:
        at the source itself when it returns a ``Dataset`` or ``DataLoader`` (samples
        are kept by index), or after a deterministic stage when ``cache_key(batch)``
        names each batch (outputs are kept by key).

        Examples
        --------
        >>> p = Pipeline("s")
        >>> @p.source(epochs=2)
        ... def numbers():
        ...     return [[1.0, 2.0], [3.0]]
        >>> @p.step(kind="inference")
        ... def total(numbers):
        ...     return sum(numbers)
        >>> p.validate().stages["total"].role
        'step'
        """
        return self.stage(name, kind=kind, inputs=inputs, device="cpu", api="any", params=params, pin="cpu",
                          role="source", epochs=epochs, batch_size=batch_size, cache_key=cache_key)

    def step(
        self,
        name: str | None = None,
        *,
        kind: str = "training",
        init: Callable[..., Any] | None = None,
        inputs: Iterable[str] | Mapping[str, str] | None = None,
        device: Literal["cpu", "gpu"] | None = None,
        api: str | None = None,
        pin: str | None = None,
        params: Mapping[str, Any] | None = None,
        precision: Iterable[str] | str | None = None,
        tolerance: float | None = None,
    ) -> Callable[[Callable], Callable]:
        """Decorator declaring the step that consumes a stream, batch by batch, in order.

        With ``init`` (called once per run as ``init(device=...)`` when it takes
        ``device``), the step is a fold: it receives ``state`` with each batch and
        returns the new state (or None after changing it in place); its output is
        the final state, e.g. a trained model. Without ``init`` its output is the
        list of what it returned for every batch, e.g. predictions. Like any stage it
        may have a device-agnostic torch function or separate CPU and GPU ones.
        """
        return self.stage(name, kind=kind, inputs=inputs, device=device, api=api, pin=pin, params=params,
                          role="step", init=init, precision=precision, tolerance=tolerance)

    def _adopt(self, graph: nx.DiGraph) -> None:
        for node, data in graph.nodes(data=True):
            st = data.get("stage")
            if st is None:
                raise PipelineError(
                    f"node {node!r} has no 'stage' attribute; add stage=Stage(...) to the node",
                    stage=str(node),
                )
            if isinstance(st, Mapping):
                st = Stage(**{"name": node, **st})
            if st.name != node:
                raise PipelineError(
                    f"node {node!r} holds stage {st.name!r}; the node key must equal the stage name",
                    stage=str(node),
                )
            self.add(st)
        for u, v, data in graph.edges(data=True):
            st: Stage = self.graph.nodes[v]["stage"]
            if u not in st.inputs.values():
                arg = data.get("name", u)
                self.graph.nodes[v]["stage"] = st.model_copy(
                    update={"inputs": {**st.inputs, arg: u}}
                )
        self._order_cache = None

    # -- views ----------------------------------------------------------------------
    @property
    def stages(self) -> dict[str, Stage]:
        """Stages by name, in declaration order."""
        return {n: d["stage"] for n, d in self.graph.nodes(data=True)}

    def allowed_precisions(self, name: str) -> tuple[str, ...]:
        """The lower precisions stage ``name`` may run in: its own declaration, else the pipeline's default."""
        st = self.stages[name]
        return st.precision if st.precision is not None else tuple(getattr(self, "precision", ()))

    def with_precision(self, precision: Mapping[str, str]) -> Pipeline:
        """A copy whose stages run in the given precisions (stage → name; others as they are).

        Raises :class:`~placer.errors.PipelineError` naming an unknown stage or precision.
        """
        stages = self.stages
        for n, v in precision.items():
            if n not in stages:
                raise PipelineError(f"precision for unknown stage {n!r}; stages: {', '.join(stages)}", stage=n)
            check_precision(v, stage=n)
        g = self.graph.copy()
        for n, v in precision.items():
            g.nodes[n]["stage"] = stages[n].model_copy(update={"run_precision": check_precision(v, stage=n)})
        out = Pipeline.__new__(Pipeline)
        out.__dict__.update(self.__dict__)
        out.graph = g
        out._order_cache = None
        return out

    def validate(self) -> Pipeline:
        """Check the graph; raise a :class:`~placer.errors.PipelineError` naming the stage."""
        if self.graph.number_of_nodes() == 0:
            raise EmptyPipelineError(
                f"pipeline {self.name!r} has no stages; declare at least one with @pipeline.stage"
            )
        # rebuild edges from inputs, so the graph always matches the declarations
        self.graph.remove_edges_from(list(self.graph.edges))
        for name, st in self.stages.items():
            for arg, src in st.inputs.items():
                if src not in self.graph:
                    raise DanglingInputError(
                        f"stage {name!r} reads input {arg!r} from stage {src!r}, which no stage "
                        f"produces; add a stage named {src!r} or fix the input's name",
                        stage=name,
                    )
                if src == name:
                    raise CycleError(
                        f"stage {name!r} reads its own output; remove the self-dependency",
                        stage=name,
                    )
                self.graph.add_edge(src, name, name=arg)
        try:
            cycle = nx.find_cycle(self.graph)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle:
            path = " -> ".join([e[0] for e in cycle] + [cycle[0][0]])
            raise CycleError(
                f"stage {cycle[0][0]!r} is part of a cycle ({path}); a pipeline must be acyclic, "
                "remove one of these inputs",
                stage=cycle[0][0],
            )
        self._order_cache = None
        self._check_streams()
        return self

    def _check_streams(self) -> None:
        """Give per-batch stages their role and check each stream: one source, one step, no loose ends."""
        index = {n: i for i, n in enumerate(self.graph.nodes)}
        stream_of: dict[str, str] = {}
        step_of: dict[str, str] = {}
        for n in nx.lexicographical_topological_sort(self.graph, key=index.__getitem__):
            st: Stage = self.graph.nodes[n]["stage"]
            feeds = {stream_of[src] for src in st.inputs.values() if src in stream_of}
            if len(feeds) > 1:
                raise PipelineError(
                    f"stage {n!r} reads batches of two streams ({', '.join(sorted(feeds))}); a stage may read "
                    "one stream only: join the data in one source", stage=n)
            src = next(iter(feeds), None)
            if st.role == "source":
                _check_source(st, src)
                stream_of[n] = n
            elif st.role == "step":
                if src is None:
                    raise PipelineError(
                        f"step {n!r} reads no batches; give it an input from a source or a per-batch stage",
                        stage=n)
                if src in step_of:
                    raise PipelineError(
                        f"stream {src!r} has two steps ({step_of[src]!r} and {n!r}); end a stream with one "
                        "step (combine them in one function)", stage=n)
                step_of[src] = n
                _check_step(st)
            elif src is not None:
                if st.role != "batch":
                    self.graph.nodes[n]["stage"] = st.model_copy(update={"role": "batch"})
                stream_of[n] = src
            elif st.role == "batch":
                raise PipelineError(
                    f"stage {n!r} is per-batch but reads no source or per-batch stage", stage=n)
        for n, src in stream_of.items():
            if self.graph.out_degree(n) == 0:
                raise PipelineError(
                    f"per-batch stage {n!r} of stream {src!r} feeds nothing; end the stream with a "
                    "@pipeline.step that reads it", stage=n)

    def streams(self) -> dict[str, list[str]]:
        """Each stream's source → its stages (source, per-batch stages, step) in dispatch order."""
        out: dict[str, list[str]] = {}
        member: dict[str, str] = {}
        for n in self.order():
            st = self.stages[n]
            if st.role == "source":
                member[n] = n
                out[n] = [n]
            elif st.role in ("batch", "step"):
                src = next(member[s] for s in st.inputs.values() if s in member)
                out[src].append(n)
                if st.role == "batch":
                    member[n] = src
        return out

    def order(self) -> list[str]:
        """Topological order, ties broken by declaration order (the dispatch priority)."""
        cached = getattr(self, "_order_cache", None)
        if cached is not None:
            return cached
        self.validate()
        index = {n: i for i, n in enumerate(self.graph.nodes)}
        order = list(nx.lexicographical_topological_sort(self.graph, key=index.__getitem__))
        self._order_cache = order
        return order

    def sinks(self) -> list[str]:
        """Stages whose output no stage reads: the pipeline's final outputs."""
        return [n for n in self.order() if self.graph.out_degree(n) == 0]

    def consumers(self, name: str) -> list[str]:
        return list(self.graph.successors(name))

    def check_placement(self, placement: Mapping[str, str]) -> None:
        """Check that each stage has an implementation for its placed device class."""
        for name, st in self.stages.items():
            dev = placement.get(name)
            if dev is None:
                raise PipelineError(
                    f"stage {name!r} has no device in the placement; add {name}=cpu or {name}=gpu",
                    stage=name,
                )
            cls = device_class(dev)
            if st.impl_for(cls) is None:
                have = ", ".join(st.device_classes())
                raise MissingImplementationError(
                    f"stage {name!r} has no {cls} implementation (it has: {have}); "
                    f"place it on {have} or add a {cls} implementation",
                    stage=name,
                )

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, stages={list(self.graph.nodes)})"

    def __len__(self) -> int:
        return self.graph.number_of_nodes()


def _check_source(st: Stage, reads: str | None) -> None:
    if reads is not None:
        raise PipelineError(
            f"source {st.name!r} reads batches of stream {reads!r}; a source's inputs must be one-shot stages",
            stage=st.name)
    if st.gpu is not None or (st.fn is not None and st.cpu is None):
        raise PipelineError(
            f"source {st.name!r} has a GPU implementation; a source runs on the CPU: declare it with "
            "@pipeline.source (move GPU work to a per-batch stage)", stage=st.name)


def _check_step(st: Stage) -> None:
    if st.init is None:
        return
    for impl in (st.fn, st.cpu, st.gpu):
        if impl is not None and STATE not in _params(impl.fn):
            raise PipelineError(
                f"step {st.name!r} has init= but its function {impl.fn.__name__!r} takes no 'state' argument; add "
                "a 'state' parameter (it receives init's result, then what the step returned)", stage=st.name)


def _params(fn: Callable) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def device_class(device: str) -> str:
    """Which implementation runs on the device called ``device``: ``"cpu"`` on the CPU,
    ``"gpu"`` on a GPU, the simulated test device and any other accelerator (its
    kind says; see :func:`placer.devices.implementation_class`)."""
    return implementation_class(device)


def as_pipeline(obj: Any, name: str | None = None) -> Pipeline:
    """Accept a :class:`Pipeline` or a hand-built ``networkx.DiGraph``."""
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, nx.DiGraph):
        return Pipeline(name or obj.graph.get("name") or "pipeline", obj)
    raise PipelineError(
        f"expected a placer.Pipeline or networkx.DiGraph, got {type(obj).__name__}; "
        "build(size) must return one of these"
    )
