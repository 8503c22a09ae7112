"""Critical path, bottleneck and advice rules over hand-made facts."""

from __future__ import annotations

import pytest

from placer.report.advice import advise
from placer.report.critical import bottleneck, critical_path
from placer.data.report import (Bar, Dag, DagEdge, DagNode, DeviceInfo, Meta, Option, ReportFacts, StageRow,
                                 Summary, TargetPlan, Timeline)

DEVICES = [DeviceInfo(name="cpu", kind="cpu", label="CPU"), DeviceInfo(name="gpu:0", kind="gpu", label="GPU X")]


def make(stages, edges=(), bars=(), size=1000, devices=DEVICES, target=None, measured=None):
    """Facts of a small pipeline: ``stages`` as (name, kind, device, crossover, loop_carried)."""
    rows = [StageRow(name=n, kind=k, device=d, crossover_size=x, loop_carried=lc) for n, k, d, x, lc in stages]
    span = max((b.end_s for b in bars), default=None)
    return ReportFacts(
        meta=Meta(pipeline="p", size=size, devices=devices),
        summary=Summary(options=[Option(key="plan", title="chosen plan", measured_s=measured)]),
        dag=Dag(nodes=[DagNode(name=r.name, device=r.device) for r in rows],
                edges=[DagEdge(src=a, dst=b) for a, b in edges]),
        stages=rows, timeline=Timeline(measured=list(bars), measured_makespan_s=span), target=target)


def bar(label, lane, start, end, kind="stage", device=None, **kw):
    dev = device or ("cpu" if lane.startswith("cpu") else lane)
    return Bar(label=label, lane=lane, start_s=start, end_s=end, kind=kind, device=dev, **kw)


def test_critical_path_follows_the_latest_input_through_a_copy():
    #  a (cpu/0, 0-1) ─copy 1-3→ c (gpu, 3-4) ─copy 4-4.5→ host
    #  b (cpu/1, 0-2) ────────────↗
    bars = [bar("a", "cpu/0", 0, 1), bar("b", "cpu/1", 0, 2),
            bar("a", "link host→gpu:0", 1, 3, kind="transfer", device="gpu:0", src="host", dst="gpu:0"),
            bar("b", "link host→gpu:0", 2, 2.5, kind="transfer", device="gpu:0", src="host", dst="gpu:0"),
            bar("c", "gpu:0", 3, 4),
            bar("c", "link gpu:0→host", 4, 4.5, kind="transfer", device="gpu:0", src="gpu:0", dst="host")]
    path = critical_path(bars, {"c": ["a", "b"]}, {"cpu": "cpu", "gpu:0": "gpu"})
    assert [s.name for s in path] == ["a", "a (host→gpu:0)", "c", "c (gpu:0→host)"]
    f = make([("a", "other", "cpu", None, False), ("b", "other", "cpu", None, False),
              ("c", "training", "gpu:0", None, False)], edges=[("a", "c"), ("b", "c")], bars=bars)
    bn = bottleneck(f)
    assert bn.kind == "transfer" and bn.name == "a (host→gpu:0)"
    assert bn.share == pytest.approx(2 / 4.5)
    f.bottleneck = bn
    assert any(a.topic == "bottleneck" and "'a'" in a.text and "same device" in a.text for a in advise(f))


def test_critical_path_includes_waiting_for_a_busy_lane():
    # one worker: b is ready at 0 but waits for a; the wait is not work
    bars = [bar("a", "cpu/0", 0, 2), bar("b", "cpu/0", 2.5, 3)]
    path = critical_path(bars, {}, {"cpu": "cpu"})
    assert [(s.kind, s.name) for s in path] == [("stage", "a"), ("wait", "before b"), ("stage", "b")]
    assert path[1].seconds == pytest.approx(0.5)
    f = make([("a", "other", "cpu", None, False), ("b", "other", "cpu", None, False)], bars=bars)
    assert bottleneck(f).name == "a" and bottleneck(f).share == pytest.approx(2 / 3)


def test_loop_carried_stage_is_kept_on_the_cpu():
    f = make([("ema", "preprocessing", "cpu", None, True), ("fit", "training", "cpu", None, False)])
    texts = [a.text for a in advise(f) if a.topic == "loop"]
    assert len(texts) == 1 and "'ema'" in texts[0] and "keep it on the CPU" in texts[0]
    f = make([("ema", "preprocessing", "gpu:0", None, True)])
    assert "move it to the CPU" in next(a.text for a in advise(f) if a.topic == "loop")


def test_crossover_gives_move_advice_with_its_size():
    f = make([("features", "preprocessing", "cpu", 50_000.0, False), ("train", "training", "gpu:0", 400.0, False)],
             size=1000)
    moves = {a.subject: a.text for a in advise(f) if a.topic == "move"}
    assert "above 50,000 rows" in moves["features"] and "1,000 rows" in moves["features"]
    assert "Keep stage 'train' on the GPU (gpu:0) for 400 rows" in moves["train"]


def test_inference_below_its_crossover_gives_batching_advice():
    f = make([("infer", "inference", "cpu", 256.0, False)], size=8)
    texts = [a.text for a in advise(f) if a.topic == "batch"]
    assert texts == ["Batch requests to at least 256 rows to make the GPU (gpu:0) pay for stage 'infer'; "
                     "at 8 rows it is faster on the CPU."]
    assert not [a for a in advise(make([("infer", "inference", "cpu", 256.0, False)], size=512)) if a.topic == "batch"]


def test_large_pageable_copy_to_a_gpu_gives_pin_advice():
    copy = bar("load", "link host→gpu:0", 0.1, 0.3, kind="transfer", device="gpu:0", src="host", dst="gpu:0",
               bytes=200e6, pinned=False)
    f = make([("load", "cleaning", "cpu", None, False), ("train", "training", "gpu:0", None, False)],
             edges=[("load", "train")], bars=[bar("load", "cpu/0", 0, 0.1), copy, bar("train", "gpu:0", 0.3, 0.4)])
    pins = [a.text for a in advise(f) if a.topic == "pin"]
    assert len(pins) == 1 and "'load'" in pins[0] and "200.0 MB" in pins[0] and "1.0 GB/s" in pins[0]
    pinned = copy.model_copy(update={"pinned": True})
    f2 = make([("load", "cleaning", "cpu", None, False), ("train", "training", "gpu:0", None, False)],
              edges=[("load", "train")], bars=[bar("load", "cpu/0", 0, 0.1), pinned, bar("train", "gpu:0", 0.3, 0.4)])
    assert not [a for a in advise(f2) if a.topic == "pin"]


def test_simulated_device_copies_get_no_pin_advice_and_no_gpu_name():
    sim = [DeviceInfo(name="cpu", kind="cpu"), DeviceInfo(name="gpu-sim", kind="sim", label="simulated")]
    copy = bar("load", "link host→gpu-sim", 0.1, 0.3, kind="transfer", device="gpu-sim", src="host", dst="gpu-sim",
               bytes=200e6, pinned=False)
    f = make([("load", "cleaning", "cpu", 10_000.0, False), ("train", "training", "gpu-sim", None, False)],
             edges=[("load", "train")], devices=sim, bars=[bar("load", "cpu/0", 0, 0.1), copy])
    advice = advise(f)
    assert not [a for a in advice if a.topic == "pin"]
    move = next(a.text for a in advice if a.topic == "move")
    assert "gpu-sim (simulated test device)" in move and "GPU" not in move


def test_target_plan_advice_names_the_absent_gpu():
    t = TargetPlan(device="gpu:0", label="NVIDIA H200", placement={"a": "cpu", "b": "gpu:0"}, predicted_s=0.5,
                   all_cpu_predicted_s=2.0, speedup=4.0, crossover_size={"a": 5000.0, "b": None})
    cpu_only = [DeviceInfo(name="cpu", kind="cpu"), DeviceInfo(name="gpu:0", kind="gpu", present=False)]
    f = make([("a", "preprocessing", "cpu", None, False), ("b", "training", "cpu", None, False)], size=1000,
             devices=cpu_only, target=t)
    advice = advise(f)
    assert any(a.topic == "target" and "'b' on the GPU" in a.text and "4.0×" in a.text for a in advice)
    assert any(a.topic == "move" and a.text.startswith("On NVIDIA H200: Move stage 'a'") and "5,000 rows" in a.text
               for a in advice)


def test_the_report_lists_each_precision_on_the_target_with_the_measured_differences():
    from placer.report.render import render_html, render_markdown

    t = TargetPlan(device="gpu:0", label="NVIDIA H200", placement={"a": "cpu", "b": "gpu:0"}, predicted_s=0.5,
                   precision={"b": "bf16"},
                   precision_s={"b": {"cpu": {"fp32": 2.0, "bf16": 200.0},
                                      "gpu:0": {"fp32": 0.06, "tf32": 0.02, "bf16": 0.01}}},
                   precision_checks={"b": [{"precision": "tf32", "metric": "loss", "rel_error": 2e-6, "tolerance": 0.01},
                                           {"precision": "bf16", "metric": "loss", "rel_error": 0.003,
                                            "tolerance": 0.01}]},
                   precision_notes=["allow bf16 on 'a' for a predicted 3.0x on gpu:0"])
    cpu_only = [DeviceInfo(name="cpu", kind="cpu"), DeviceInfo(name="gpu:0", kind="gpu", present=False)]
    f = make([("a", "preprocessing", "cpu", None, False), ("b", "training", "cpu", None, False)], devices=cpu_only,
             target=t)
    md = render_markdown(f)
    assert "| fp32 | tf32 | bf16 | fp16 | planned |" in md
    row = next(line for line in md.splitlines() if line.startswith("| b |") and "(6.0×)" in line)
    assert "(3.0×)" in row and "| bf16 |" in row and "bf16 loss 0.3% (tolerance 1%)" in row
    assert "allow bf16 on 'a'" in md
    html = render_html(f)
    assert "(6.0×)" in html and "bf16 loss 0.3% (tolerance 1%)" in html
    plain = make([("a", "preprocessing", "cpu", None, False)], devices=cpu_only,
                 target=TargetPlan(device="gpu:0", label="NVIDIA H200", placement={"a": "cpu"}, predicted_s=0.5))
    assert "Per precision" not in render_markdown(plain) and "Per precision" not in render_html(plain)


def _stream(plan_rate, others, runs=1):
    from placer.data.report import StreamFacts, StreamOption

    s = StreamFacts(source="batches", step="predict", epochs=1, batches=64, samples=4096, seconds=0.9,
                    samples_per_s=plan_rate, time_to_first_batch_s=0.01, consumer_idle_fraction=0.0, prefetch=2,
                    options_measure="whole run",
                    options_runs=runs)
    s.options = [StreamOption(name="plan", change="placer's plan", measured_samples_per_s=plan_rate)] + [
        StreamOption(name=n, change=c, measured_samples_per_s=r) for n, c, r in others]
    return s


def test_a_stream_option_that_measured_faster_than_the_plan_is_named_not_called_slower():
    """The report said "Nothing to change: the plan was the fastest of the options measured here" beside a
    table where the plan measured 0.75x num_workers=0 (text_infer's pipeline form on a 2-core EPYC)."""
    f = make([("batches", "cleaning", "cpu", None, False), ("predict", "inference", "cpu", None, False)],
             measured=0.9, devices=DEVICES[:1])
    f.streams = [_stream(5293.0, [("num_workers=0", "every batch through every stage in turn", 7042.0),
                                  ("rule of thumb", "1 worker per stage", 6534.0)], runs=3)]
    keep = [a for a in advise(f) if a.topic == "keep"]
    assert len(keep) == 1 and "fastest" not in keep[0].text
    assert "'num_workers=0'" in keep[0].text and "7,042" in keep[0].text and "5,293" in keep[0].text
    assert "1.33x" in keep[0].text and "median of 3 runs each" in keep[0].text and "whole run" in keep[0].text
    # within the margin (5 %) the plan stands, and other options were measured: it was the fastest of them
    f.streams = [_stream(7000.0, [("num_workers=0", "in turn", 7300.0)])]
    assert [a.text for a in advise(f) if a.topic == "keep"] == [
        "Nothing to change: the plan was the fastest of the options measured here."]
    # nothing else measured at all: no claim of having been the fastest
    f.streams = None
    assert [a.text for a in advise(f) if a.topic == "keep"] == [
        "Nothing to change was found; no other option was measured here to compare with."]
