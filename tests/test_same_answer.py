"""Same inputs, same outputs, on every placement: a property test over random DAGs
and over the bundled pipelines (the tolerance is placer.digest's)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer import Pipeline
from placer.digest import assert_outputs_close
from placer.executor import execute
from placer.loader import load_pipeline

OPS = ("tanh", "affine", "sort", "square")


def _torch_op(op, i):
    def fn(device, **inputs):
        if inputs:
            x = sum(inputs[k] for k in sorted(inputs))
        else:
            x = torch.linspace(-1.0, 1.0, 257, dtype=torch.float64, device=device) * (i + 1)
        if op == "tanh":
            return torch.tanh(x)
        if op == "affine":
            return x * 2.0 + i
        if op == "sort":
            return torch.sort(x.flip(0)).values
        return x * x

    return fn


def _numpy_op(op, i):
    def fn(**inputs):
        if inputs:
            x = sum(inputs[k] for k in sorted(inputs))
        else:
            x = np.linspace(-1.0, 1.0, 257) * (i + 1)
        if op == "tanh":
            return np.tanh(x)
        if op == "affine":
            return x * 2.0 + i
        if op == "sort":
            return np.sort(x[::-1])
        return x * x

    return fn


@st.composite
def dags(draw):
    n = draw(st.integers(2, 5))
    p = Pipeline("random")
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=min(i, 3))) if i else []
        op = draw(st.sampled_from(OPS))
        inputs = {f"in{j}": f"s{j}" for j in parents}
        if draw(st.booleans()):
            p.add(name=f"s{i}", fn=_torch_op(op, i), inputs=inputs)
        else:  # separate implementations: numpy on the CPU, torch on the GPU
            p.add(name=f"s{i}", cpu=_numpy_op(op, i), gpu=_torch_op(op, i), inputs=inputs)
    return p


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_every_placement_of_a_random_dag_gives_the_same_outputs(p):
    names = p.order()
    ref = execute(p, "all=cpu")
    for devs in itertools.product(("cpu", "gpu-sim"), repeat=len(names)):
        placement = dict(zip(names, devs))
        run = execute(p, placement)
        assert run.outputs_digest == ref.outputs_digest, placement
        assert_outputs_close(ref.final_outputs, run.final_outputs)
        # every sink's output came back to the host
        for v in run.final_outputs.values():
            assert isinstance(v, np.ndarray) or v.device.type == "cpu"


@pytest.mark.parametrize("ref,size", [("pipelines/tabular.py", 600), ("pipelines/requests.py", 8)])
def test_every_placement_of_bundled_pipelines_gives_the_same_outputs(ref, size):
    p = load_pipeline(ref, size)
    names = p.order()
    base = execute(p, "all=cpu")
    for devs in itertools.product(("cpu", "gpu-sim"), repeat=len(names)):
        run = execute(p, dict(zip(names, devs)))
        assert run.outputs_digest == base.outputs_digest, devs
        assert_outputs_close(base.final_outputs, run.final_outputs)


def test_digest_changes_when_outputs_change():
    p = load_pipeline("pipelines/requests.py", 8)
    q = load_pipeline("pipelines/requests.py", 8, seed=8)
    assert execute(p, "all=cpu").outputs_digest != execute(q, "all=cpu").outputs_digest
