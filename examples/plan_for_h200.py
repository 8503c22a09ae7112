"""Plan for a GPU this machine does not have: the described NVIDIA H200.

Profiles a gallery pipeline on this machine (the CPU, and a GPU if there is one),
then plans it for a machine with this CPU and an H200, using placer's description
of the H200 (``placer/data/h200.json``: peak FLOP/s, memory bandwidth, launch and
copy costs measured on a real one). Nothing runs on the H200: every number for it
is a prediction, and the output says so.

    python examples/plan_for_h200.py [size]
"""

import sys

from placer.costmodel.model import CostModel
from placer.optimize import plan
from placer.profile import profile

PIPELINE = "pipelines.batched_inference:build"
size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000

measured = profile(PIPELINE, size=size, budget_s=5.0, progress=False)
model = CostModel(measured, describe=["h200"])
h200 = next(iter(model.described))  # the device name the description plans under
chosen = plan(model.table(size, devices=["cpu", h200]))

print(f"{PIPELINE} at size {size:,}, planned for this CPU + {model.described[h200].name} (predicted, not measured):")
for stage in chosen.stages:
    print(f"  {stage.name:<12} {stage.device:<6} {stage.reason}")
print(f"predicted makespan {chosen.predicted_makespan_s:.4f} s; alternatives (predicted): "
      + ", ".join(f"{k} {v:.4f} s" for k, v in chosen.baselines.items() if v is not None))
