"""Small, real inputs for report tests: a tabular pipeline, a plan over cpu and gpu-sim, its runs.

The plan comes from :func:`placer.optimize.plan` over a hand-written cost table
whose times grow with size (so crossover sizes exist); the runs are real runs of
the pipeline on this machine, the GPU stages on the simulated test device.
"""

from __future__ import annotations

import functools

from placer.loader import load_pipeline

SIZE = 400
#: (fixed seconds, seconds per row) on each device
COSTS = {
    "load": {"cpu": (1e-3, 1e-7), "gpu-sim": (2e-3, 1e-7)},
    "clean": {"cpu": (1e-3, 2e-7), "gpu-sim": (3e-3, 1e-8)},
    "features": {"cpu": (1e-3, 2e-6), "gpu-sim": (4e-3, 2e-8)},
    "train": {"cpu": (2e-3, 5e-5), "gpu-sim": (6e-3, 1e-7)},
    "predict": {"cpu": (1e-3, 1e-6), "gpu-sim": (4e-3, 1e-8)},
}


def build(size: int = SIZE):
    return load_pipeline("pipelines.tabular:build", size, epochs=1)


def cost_table(pipeline, size: float):
    from placer.optimize import CostTable

    stages = []
    for name in pipeline.order():
        st = pipeline.stages[name]
        secs = {d: a + b * size for d, (a, b) in COSTS[name].items()}
        stages.append({"name": name, "kind": st.kind, "inputs": list(dict.fromkeys(st.inputs.values())),
                       "output_bytes": 64.0 * size, "seconds": secs})
    return CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu", "workers": 2, "label": "test CPU"},
                    "gpu-sim": {"kind": "sim", "label": "simulated test device"}},
        "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 5e9}, "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 5e9}},
        "stages": stages, "size": size})


def inputs(size: int = SIZE):
    """``(pipeline, plan, run, cpu_run, gpu_run, costs)`` made once per size and test session."""
    return _inputs(int(size))


@functools.lru_cache(maxsize=None)
def _inputs(size: int):
    from placer.executor import execute
    from placer.optimize import plan

    p = build(size)
    chosen = plan(cost_table(p, size), cost_at=lambda s: cost_table(p, s), size=size)
    run = execute(p, chosen.placement, executor="threads")
    cpu = execute(p, "all=cpu")
    gpu = execute(p, "all=gpu-sim")
    return p, chosen, run, cpu, gpu, cost_table(p, size)


def facts(size: int = SIZE, **extra):
    from placer.devices import discover
    from placer.report import collect

    p, chosen, run, cpu, gpu, costs = inputs(size)
    return collect(plan=chosen, run=run, baselines={"all_cpu": cpu, "all_gpu": gpu}, pipeline=p, costs=costs,
                   inventory=discover(), **extra)
