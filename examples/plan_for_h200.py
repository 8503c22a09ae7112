"""Plan for a machine you are not on: the described H200 machine (an H200 and its 16-core host).

Profiles a gallery pipeline on this machine (the CPU, and a GPU if there is one),
then plans it for the H200 machine from placer's description of it
(``placer/data/h200.json``: the GPU's peak FLOP/s, memory bandwidth, launch and copy
costs, and its host CPU's op timings, all measured on a real one). The CPU side is
this machine's measured times scaled to that host's CPU by ops timed on both.
Nothing runs there: every number for it is a prediction, and the output says so.

    python examples/plan_for_h200.py [size]
"""

import sys

from placer.profile import profile
from placer.site import costs_from_profile

PIPELINE = "pipelines.batched_inference:build"
size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000

measured = profile(PIPELINE, size=size, budget_s=5.0, progress=False)
costs = costs_from_profile(measured, size=size, describe="h200")
chosen = costs.plan(target=True)

print(f"{PIPELINE} at size {size:,}, planned for {costs.target.name} (predicted, not measured):")
for stage in chosen.stages:
    print(f"  {stage.name:<12} {stage.device:<6} {stage.reason}")
print(f"predicted makespan {chosen.predicted_makespan_s:.4f} s; alternatives (predicted): "
      + ", ".join(f"{k} {v:.4f} s" for k, v in chosen.baselines.items() if v is not None))
for note in costs.target_notes:
    print(f"note: {note}")
