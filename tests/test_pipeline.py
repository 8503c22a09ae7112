"""Declaring stages and validating the graph: every error names the stage and the fix."""

from __future__ import annotations

import networkx as nx
import pydantic
import pytest

from placer import (
    CycleError,
    DanglingInputError,
    DeviceUnavailableError,
    DuplicateStageError,
    EmptyPipelineError,
    MissingImplementationError,
    Pipeline,
    PlacementError,
    Stage,
)
from placer.devices import discover
from placer.placement import check_pins, parse_spec, resolve


def _noop(device=None, **kw):
    return 1


def test_decorator_infers_inputs_and_keeps_function_callable():
    p = Pipeline("t")

    @p.stage(kind="cleaning")
    def load(device):
        return 3

    @p.stage(kind="preprocessing", params={"k": 2})
    def scale(load, k, device):
        return load * k

    assert scale(load=4, k=2, device=None) == 8
    assert p.stages["scale"].inputs == {"load": "load"}
    assert p.stages["scale"].params == {"k": 2}
    assert p.validate().graph.has_edge("load", "scale")
    assert p.graph.edges["load", "scale"]["name"] == "load"


def test_separate_cpu_and_gpu_implementations_join_one_stage():
    p = Pipeline("t")

    @p.stage("ema", device="cpu", inputs=[])
    def ema_cpu():
        return 1

    @p.stage("ema", device="gpu", api="numba.cuda", inputs=[])
    def ema_gpu():
        return 1

    st = p.stages["ema"]
    assert st.cpu.fn is ema_cpu and st.gpu.fn is ema_gpu
    assert st.cpu.api == "numpy" and st.gpu.api == "numba.cuda"
    assert st.device_classes() == ["cpu", "gpu"]
    with pytest.raises(DuplicateStageError, match="'ema' already has a cpu"):
        p.stage("ema", device="cpu", inputs=[])(ema_cpu)


def test_hand_built_digraph_is_accepted_with_edge_names():
    g = nx.DiGraph(name="hand")
    g.add_node("a", stage=Stage(name="a", fn=_noop))
    g.add_node("b", stage={"fn": _noop, "kind": "training"})
    g.add_edge("a", "b", name="x")
    p = Pipeline("hand", g).validate()
    assert p.stages["b"].inputs == {"x": "a"}
    assert p.stages["b"].kind == "training"
    assert p.order() == ["a", "b"]


def test_empty_pipeline():
    with pytest.raises(EmptyPipelineError, match="no stages"):
        Pipeline("empty").validate()


def test_duplicate_names():
    p = Pipeline("t")
    p.add(name="a", fn=_noop)
    with pytest.raises(DuplicateStageError, match="'a' is declared twice") as e:
        p.add(name="a", fn=_noop)
    assert e.value.stage == "a"


def test_cycle_names_a_stage_and_the_path():
    p = Pipeline("t")
    p.add(name="a", fn=_noop, inputs=["c"])
    p.add(name="b", fn=_noop, inputs=["a"])
    p.add(name="c", fn=_noop, inputs=["b"])
    with pytest.raises(CycleError, match="part of a cycle") as e:
        p.validate()
    assert e.value.stage in {"a", "b", "c"}
    assert "->" in str(e.value)


def test_self_loop_is_a_cycle():
    p = Pipeline("t")
    p.add(name="a", fn=_noop, inputs=["a"])
    with pytest.raises(CycleError, match="'a' reads its own output"):
        p.validate()


def test_dangling_input_names_stage_and_missing_producer():
    p = Pipeline("t")
    p.add(name="train", fn=_noop, inputs={"x": "feats"})
    with pytest.raises(DanglingInputError, match="stage 'train' reads input 'x' from stage 'feats'") as e:
        p.validate()
    assert e.value.stage == "train"
    assert "add a stage named 'feats'" in str(e.value)


def test_unknown_kind_is_a_pydantic_error_naming_the_stage():
    with pytest.raises(pydantic.ValidationError, match="stage 'x': unknown kind 'wrangling'"):
        Stage(name="x", kind="wrangling", fn=_noop)


def test_stage_without_any_implementation():
    with pytest.raises(pydantic.ValidationError, match="stage 'x' has no implementation"):
        Stage(name="x")


def test_missing_implementation_for_requested_device():
    p = Pipeline("t")
    p.add(name="ema", cpu=_noop)
    with pytest.raises(MissingImplementationError, match="stage 'ema' has no gpu implementation") as e:
        resolve(p, "all=gpu-sim", discover())
    assert e.value.stage == "ema"


def test_pin_to_absent_device():
    p = Pipeline("t")
    p.add(name="train", fn=_noop, pin="gpu:3")
    with pytest.raises(DeviceUnavailableError, match="stage 'train' is pinned to gpu:3"):
        check_pins(p, discover())
    with pytest.raises(DeviceUnavailableError, match="'train'"):
        resolve(p, None, discover())


def test_pin_wins_over_all_but_not_over_explicit_item():
    p = Pipeline("t")
    p.add(name="a", fn=_noop)
    p.add(name="b", fn=_noop, inputs=["a"], pin="cpu")
    devs = resolve(p, "all=gpu-sim", discover())
    assert devs["a"].name == "gpu-sim" and devs["b"].name == "cpu"
    with pytest.raises(PlacementError, match="stage 'b' is pinned to cpu"):
        resolve(p, "b=gpu-sim", discover())


def test_parse_spec_errors_name_the_problem():
    with pytest.raises(PlacementError, match="stage 'nope'"):
        parse_spec("nope=cpu", ["a"])
    with pytest.raises(PlacementError, match="not stage=device"):
        parse_spec("cpu", ["a"])
    spec = parse_spec("all=cpu,b=gpu", ["a", "b"])
    assert spec["a"] == "cpu" and spec["b"] == "gpu"


def test_code_hash_changes_with_code_or_params_only():
    a1 = Stage(name="a", fn=lambda device: 1, params={"k": 1})
    a2 = Stage(name="a", fn=lambda device: 1, params={"k": 1})
    a3 = Stage(name="a", fn=lambda device: 2, params={"k": 1})
    a4 = Stage(name="a", fn=lambda device: 1, params={"k": 2})
    assert a1.code_hash() == a2.code_hash()
    assert a1.code_hash() != a3.code_hash()
    assert a1.code_hash() != a4.code_hash()


def test_order_breaks_ties_by_declaration():
    p = Pipeline("t")
    for n in ("z", "y", "x"):
        p.add(name=n, fn=_noop)
    p.add(name="m", fn=_noop, inputs=["x", "z"])
    assert p.order() == ["z", "y", "x", "m"]
    assert p.sinks() == ["y", "m"]
