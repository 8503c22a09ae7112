"""Declare a pipeline and get advice in ten lines.

Three device-agnostic torch stages in a ``build(size)`` function; ``advise``
profiles them at several sizes on this machine's devices, plans where each stage
should run, runs the plan (and the all-CPU / all-GPU / rule-of-thumb
alternatives that can run here) and says why.

    python examples/quickstart.py [size]
"""

import sys

import torch

from placer import Pipeline
from placer.advisor import advise


def build(size=None):
    n = size or 2_000
    p = Pipeline("quickstart", size=n)
    p.add(name="load", kind="cleaning", fn=lambda device: torch.randn(n, 32, generator=torch.Generator().manual_seed(0)).to(device))
    p.add(name="features", kind="preprocessing", inputs=["load"], fn=lambda load, device: torch.cat([load, load.square()], 1))
    p.add(name="score", kind="inference", inputs=["features"], fn=lambda features, device: torch.sigmoid(features @ torch.linspace(-1, 1, 64, device=features.device)))
    return p


if __name__ == "__main__":
    advice = advise(__file__, size=int(sys.argv[1]) if len(sys.argv) > 1 else None, budget_s=3.0, target="none")
    print(advice.facts.summary.headline)
    for stage in advice.plan.stages:
        print(f"{stage.name}: {stage.device} ({stage.reason})")
