"""Stream plans and reports speak of what the machine has: no accelerator words or pinned memory on a
machine with only a CPU, and shares of a sequential run that add up."""

from __future__ import annotations

from placer.data.stream import ScalingRow, StreamStageProfile as StageProfile, StreamProfile
from placer.stream.planner import plan_from_profile

MS = 1e-3


def cpu_only() -> StreamProfile:
    cpu = {"cpu": 2 * MS}
    stages = [
        StageProfile(name="batches", role="source", devices=["cpu"], seconds=cpu, cpu_seconds=cpu,
                     out_bytes={"host": 1000}, cacheable=True),
        StageProfile(name="decode", role="batch", devices=["cpu"], seconds={"cpu": 10 * MS},
                     cpu_seconds={"cpu": 10 * MS}, reads=["batches"], out_bytes={"host": 1000},
                     scaling=[ScalingRow(workers=1, batches_per_s=1, speedup=1),
                              ScalingRow(workers=2, batches_per_s=2, speedup=2)]),
        StageProfile(name="train", role="step", kind="training", devices=["cpu"], seconds={"cpu": 5 * MS},
                     cpu_seconds={"cpu": 5 * MS}, reads=["decode"]),
    ]
    return StreamProfile(pipeline="cpu", source="batches", step="train", members=["batches", "decode", "train"],
                         epochs=1, samples_per_batch=32, batches_per_epoch=10, cores=2, devices=["cpu"],
                         device_titles={"cpu": "CPU"}, simulated=[], real_gpus=[], stages=stages, copies=[],
                         consumer_samples_per_s={"cpu": 32 / (5 * MS)})


def test_a_cpu_only_plan_has_no_accelerator_rule_of_thumb_and_no_pinned_memory():
    plan, _, _ = plan_from_profile(cpu_only())
    assert {b.name for b in plan.baselines} >= {"num_workers=0", "rule of thumb", "workers=2"}
    for b in plan.baselines:
        assert "accelerator" not in b.change and "pin" not in b.name and "pinned" not in b.change
        assert not b.config.get("pin_memory"), b
    assert not plan.settings.pin_memory
