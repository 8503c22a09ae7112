"""Reports of stream runs: facts from what a run measured, the bottleneck sentence, advice, rendering, CLI.

Real runs use the gallery's image stream (small) and a toy stream whose stages sleep,
so that which side is slower is known; the sentence and advice rules are also checked
on :class:`StreamStats` built by hand. ``gpu-sim`` is the labelled simulated test
device: a report never calls it a GPU.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from placer import Pipeline, execute
from placer.data.report import ReportFacts
from placer.data.run import StreamStageStats, StreamStats
from placer.loader import load_pipeline
from placer.report import collect, load_facts, render_html, render_markdown, report
from placer.report.advice import stream_rules, workers_needed
from placer.report.inputs import ReportInputError
from placer.report.streams import stage_facts, stream_facts
from placer.stream import StreamConfig
from warm_cli import run as run_placer

ROOT = Path(__file__).resolve().parents[2]


# -- hand-built measurements -------------------------------------------------------------------
def node(name, kind, busy, starved, blocked, workers=1, batches=10, device="cpu"):
    """A node whose busy + starved + blocked seconds fill its wall time times its workers."""
    return StreamStageStats(name=name, kind=kind, device=device, workers=workers, worker_kind="thread",
                            batches=batches, busy_s=busy, starved_s=starved, blocked_s=blocked,
                            wall_s=(busy + starved + blocked) / workers)


def stats(stages, *, idle, rate, trace, batches=10, prefetch=2, seconds=1.6, first=0.05):
    return StreamStats(source="read", step="train", epochs=1, batches=batches, samples=64 * batches,
                       seconds=seconds, samples_per_s=rate, time_to_first_batch_s=first,
                       consumer_idle_fraction=idle, prefetch=prefetch, stages=stages, queue_trace=trace)


def starved(*, augment_workers=1, trace=None):
    """The step waits 63% of the time; 'augment' (busy 1.56 s for 640 samples) caps the stream at ~410/s."""
    return stats([node("read", "source", 0.05, 0.0, 1.55),
                  node("augment", "batch", 1.56 * augment_workers, 0.04 * augment_workers, 0.0,
                       workers=augment_workers),
                  node("train", "step", 0.34, 1.01, 0.25)],
                 idle=0.63, rate=410.0, trace=trace or [(0.2 * i, [2, 0]) for i in range(1, 11)])


def step_bound(augment_busy=0.2):
    """The step is busy 98% of the time; 'augment' (2 workers) mostly waits for room."""
    return stats([node("read", "source", 0.02, 0.0, 1.58),
                  node("augment", "batch", augment_busy, 0.02, 3.2 - augment_busy - 0.02, workers=2),
                  node("train", "step", 1.568, 0.016, 0.016)],
                 idle=0.01, rate=410.0, trace=[(0.16 * i, [2, 2]) for i in range(1, 11)])


def facts_of(s: StreamStats, **kw) -> ReportFacts:
    """A report's facts with only this stream (no run): for the advice rules."""
    facts = collect(run={"pipeline": "p", "placement": {"train": "cpu"}, "executor": "threads", "workers": 1,
                         "makespan_s": s.seconds, "streams": [s.model_dump()],
                         "stages": [{"name": "train", "device": "cpu", "lane": "stream", "start_s": 0.0,
                                     "end_s": s.seconds, "seconds": 1.0, "workers": 1, "busy_s": 1.0,
                                     "starved_s": 0.0, "blocked_s": 0.0, "worker_kind": "thread"}]}, **kw)
    return facts


def test_starved_stream_is_input_bound_and_names_the_slowest_stage():
    f = stream_facts(starved(), step_only_samples_per_s=1900.0)
    assert (f.bound, f.bottleneck) == ("input", "augment")
    assert f.sentence.startswith("Input-bound: the step 'train' waited for data 63% of the time.")
    assert "caps you at about 410 samples/s" in f.sentence
    assert "the step could take 1,900 (measured alone)" in f.sentence
    augment = f.stages[1]
    assert augment.capacity_samples_per_s == pytest.approx(640 / 1.56)
    assert augment.busy_share + augment.starved_share + augment.blocked_share == pytest.approx(1.0)


def test_without_a_step_only_measurement_the_sentence_estimates_it_from_busy_time():
    f = stream_facts(starved())
    assert f.step_only_samples_per_s is None
    assert "measured alone" not in f.sentence
    assert f"the step could take about {640 / 0.34:,.0f} (from its busy time here)" in f.sentence


def test_step_bound_stream_says_preprocessing_is_fast_enough():
    f = stream_facts(step_bound())
    assert (f.bound, f.bottleneck) == ("step", "train")
    assert f.sentence.startswith("Step-bound: the step 'train' was busy 98% of the time and waited for data 1%")
    assert "preprocessing is fast enough: 'augment' could feed about 6,400 samples/s" in f.sentence
    tight = stream_facts(step_bound(augment_busy=2.4), step_only_samples_per_s=1900.0)
    assert "little room to spare: 'augment' was busy 75%" in tight.sentence
    assert "The step alone runs at 1,900 samples/s (4.6× this)" in tight.sentence


def test_neither_side_dominating_is_balanced_and_an_empty_stream_says_so():
    s = stats([node("read", "source", 0.05, 0.0, 1.55), node("augment", "batch", 1.2, 0.1, 0.3),
               node("train", "step", 0.96, 0.16, 0.48)], idle=0.1, rate=410.0, trace=[(0.1, [1, 1])] * 10)
    f = stream_facts(s)
    assert (f.bound, f.bottleneck) == ("balanced", "augment")
    assert f.sentence.startswith("Balanced: the step 'train' was busy 60% of the time and waited for data 10%; "
                                 "the slowest stage upstream, 'augment', was busy 75%")
    empty = stream_facts(stats([], idle=0.0, rate=0.0, trace=[], batches=0))
    assert empty.sentence == "The stream read → train delivered no batches." and empty.bottleneck == ""
    assert stream_rules(facts_of(stats([], idle=0.0, rate=0.0, trace=[], batches=0))) == []


def test_queues_are_read_from_the_trace():
    f = stream_facts(starved(trace=[(0.1, [2, 0]), (0.2, [1, 0]), (0.3, [2, 1]), (0.4, [2, 2])]))
    into_augment, into_step = f.queues
    assert (into_augment.src, into_augment.dst, into_step.dst) == ("read", "augment", "train")
    assert into_augment.full_share == pytest.approx(0.75)
    assert (into_step.empty_share, into_step.full_share, into_step.mean) == (0.5, 0.25, 0.75)


def test_a_run_without_queues_is_sequential():
    s = stats([node("read", "source", 0.01, 0, 0), node("augment", "batch", 0.4, 0, 0),
               node("train", "step", 1.2, 0, 0)], idle=0.0, rate=400.0, trace=[])
    f = stream_facts(s)
    assert f.sequential and f.bound == "sequential" and f.bottleneck == "train"
    # stages run in turn: their shares of the stream's time add up (not 100 % each)
    assert "the step 'train' took 75% of the stream's time and 'augment' 25%" in f.sentence
    advice = stream_rules(facts_of(s))
    assert any(a.topic == "stream" and "--workers 1 or more" in a.text for a in advice)
    # a plan that chose one batch at a time is not told to undo its own choice
    planned = facts_of(s)
    planned.streams[0] = planned.streams[0].model_copy(update={"predicted_samples_per_s": 410.0})
    assert not [a for a in stream_rules(planned) if "--workers 1 or more" in a.text]


# -- advice --------------------------------------------------------------------------------------
def test_starved_step_and_a_busy_one_worker_stage_asks_for_workers():
    advice = stream_rules(facts_of(starved(), step_only={"train": 1900.0}))
    workers = [a for a in advice if a.topic == "workers"]
    assert [a.subject for a in workers] == ["augment"]
    # 1,900 samples/s at 410 per worker: 5 workers
    assert workers[0].text.startswith("Give 'augment' more workers: about 5 to feed the step's 1,900 samples/s")
    assert "stage_workers={'augment': 5}" in workers[0].text
    prefetch = [a for a in advice if a.topic == "prefetch"]
    assert len(prefetch) == 1 and "empty at 100%" in prefetch[0].text and "will not help" in prefetch[0].text


def test_a_starving_stage_with_enough_workers_on_paper_is_called_contended():
    s = stats([node("read", "source", 0.05, 0.0, 1.55), node("augment", "batch", 0.4, 6.0, 0.0, workers=4),
               node("train", "step", 0.34, 1.01, 0.25)], idle=0.63, rate=410.0,
              trace=[(0.2 * i, [2, 0]) for i in range(1, 11)])
    (advice,) = [a for a in stream_rules(facts_of(s, step_only={"train": 1900.0})) if a.topic == "workers"]
    assert advice.text.startswith("'augment' starves the step although its 4 thread workers could feed")
    assert "process workers" in advice.text and "Give" not in advice.text


def test_workers_needed_follows_each_workers_rate():
    eight = stream_facts(starved(augment_workers=8)).stages[1]  # 8 workers, each at ~51 samples/s
    assert workers_needed(eight, 1900.0) == 38 and workers_needed(eight, 100.0) == 2
    fast = stage_facts(node("augment", "batch", 1.56, 11.0, 0.0, workers=8), 64.0)  # each at ~410 samples/s
    assert workers_needed(fast, 1900.0) == 5 and workers_needed(fast, 100.0) == 1
    assert workers_needed(stage_facts(node("idle", "batch", 0.0, 1.0, 0.0), 64.0), 100.0) is None


def test_bursty_queues_ask_for_a_deeper_prefetch():
    trace = [(0.1 * i, [2, 0 if i % 2 else 2]) for i in range(1, 11)]
    advice = stream_rules(facts_of(starved(trace=trace)))
    assert any(a.topic == "prefetch" and a.text.startswith("Raise prefetch (now 2)") for a in advice)


def test_busy_step_says_the_step_is_the_bottleneck_and_prefetch_is_enough():
    advice = stream_rules(facts_of(step_bound()))
    by_topic = {a.topic: a for a in advice}
    assert "preprocessing is fast enough" in by_topic["bottleneck"].text
    assert by_topic["bottleneck"].text.startswith("The step 'train' is the bottleneck (busy 98%")
    assert by_topic["prefetch"].text == "Prefetch 2 is enough: the queue into 'train' was full at 100% of the step's takes."
    # 'augment' could feed 6,400 samples/s with 2 workers: one keeps up with 410
    assert by_topic["workers"].text.startswith("'augment' would keep up with 1 worker (it has 2")
    assert not any(a.text.startswith("Give") for a in advice)


def test_a_short_run_is_called_rough():
    few = stream_rules(facts_of(stats(step_bound().stages, idle=0.01, rate=410.0, batches=4,
                                      trace=[(0.1, [2, 2])] * 4)))
    assert any(a.topic == "stream" and "only 4 batches reached 'train'" in a.text for a in few)
    assert not any(a.topic == "stream" for a in stream_rules(facts_of(step_bound())))


# -- real runs ------------------------------------------------------------------------------------
def toy(step_sleep: float, augment_sleep: float, batches: int = 12) -> Pipeline:
    """source → augment (sleeps) → step (sleeps): which side is slower is set by the sleeps."""
    p = Pipeline("toy_stream", size=batches * 4, size_unit="samples")

    @p.source(epochs=1, batch_size=4)
    def read():
        for i in range(batches):
            yield np.full((4, 2), i, dtype=np.float32)

    @p.stage(kind="preprocessing")
    def augment(read):
        time.sleep(augment_sleep)
        return read * 2

    @p.step()
    def train(augment):
        time.sleep(step_sleep)
        return float(augment.sum())

    return p


def test_a_real_run_with_slow_preprocessing_is_input_bound():
    run = execute(toy(step_sleep=0.004, augment_sleep=0.03), "all=cpu", stream=StreamConfig(workers=1))
    facts = collect(run=run)
    (s,) = facts.streams
    assert (s.bound, s.bottleneck) == ("input", "augment")
    assert s.consumer_idle_fraction > 0.5
    assert [n.name for n in s.stages] == ["read", "augment", "train"]
    assert any(a.topic == "workers" and a.subject == "augment" for a in facts.advice)
    assert "The stream read → train ran at" in facts.summary.headline


@pytest.fixture(scope="module")
def image_runs():
    """The gallery's image stream, all on the CPU with 2 workers and on the simulated test device."""
    p = load_pipeline("pipelines/stream_images.py", 128, batch=32)
    cpu = execute(p, "all=cpu", stream=StreamConfig(workers=2))
    sim = execute(p, "augment=gpu-sim,train=gpu-sim", stream=StreamConfig(workers=2))
    return cpu, sim


def test_facts_of_a_real_stream_run(image_runs):
    cpu, _ = image_runs
    facts = collect(run=cpu)
    (s,) = facts.streams
    measured = cpu.streams[0]
    assert (s.source, s.step, s.batches, s.samples) == ("batches", "train", 8, 256)
    assert s.samples_per_s == measured.samples_per_s and s.prefetch == 2
    assert [(n.name, n.kind, n.workers) for n in s.stages] == [("batches", "source", 1), ("augment", "batch", 2),
                                                              ("train", "step", 1)]
    for n in s.stages:
        assert n.busy_share + n.starved_share + n.blocked_share == pytest.approx(1.0)
    assert [(q.src, q.dst) for q in s.queues] == [("batches", "augment"), ("augment", "train")]
    assert len(s.queue_trace) == 8 and s.bound in ("input", "step", "balanced")
    assert s.bottleneck in {n.name for n in s.stages} and s.sentence
    lanes = {b.label: b.lane for b in facts.timeline.measured}
    assert lanes["augment"] == "stream: augment ×2" and lanes["dataset"].startswith("cpu/")


def test_a_stream_on_the_simulated_device_is_never_called_a_gpu(image_runs, tmp_path):
    _, sim = image_runs
    facts = report(tmp_path / "r.html", run=sim)
    (s,) = facts.streams
    assert [(n.name, n.kind, n.device) for n in s.stages] == [
        ("batches", "source", "cpu"), ("augment:copy", "copy", "gpu-sim"), ("augment", "batch", "gpu-sim"),
        ("train", "step", "gpu-sim")]
    section = re.search(r'<section id="streams">.*?</section>', (tmp_path / "r.html").read_text(), re.S).group(0)
    assert "gpu-sim (simulated test device)" in section
    visible = re.sub(r'title="[^"]*"', "", section)  # the device's label says what it is not
    assert "GPU" not in visible
    assert not any("GPU" in a.text for a in facts.advice)


# -- rendering and the CLI ------------------------------------------------------------------------
def test_html_markdown_and_json_carry_the_stream(tmp_path):
    facts = facts_of(starved(), step_only={"train": 1900.0})
    html = render_html(facts)
    assert '<section id="streams">' in html and 'id="fig-stream0"' in html
    assert "waited for data 63% of the time" in html and "step alone" in html
    assert '<tr data-node="augment" class="limit">' in html
    md = render_markdown(facts, {"stream0": "r_files/stream0.svg"})
    assert "## Streams" in md and "### read → train" in md
    assert "| **augment** (bottleneck) | batch |" in md and "(r_files/stream0.svg)" in md
    assert "the step alone: 1,900 samples/s" in md
    path = tmp_path / "r.json"
    report(path, run={"pipeline": "p", "placement": {"train": "cpu"}, "executor": "threads", "workers": 1,
                      "makespan_s": 1.6, "streams": [starved().model_dump(mode="json")]})
    back = load_facts(path)
    assert back.streams[0].sentence == stream_facts(starved()).sentence
    assert back.streams[0].queue_trace == stream_facts(starved()).queue_trace


def test_a_one_shot_report_has_no_stream_section_or_key():
    facts = collect(run={"pipeline": "demo", "placement": {"a": "cpu"}, "executor": "inline", "workers": 1,
                         "makespan_s": 0.5, "stages": [{"name": "a", "device": "cpu", "lane": "cpu/0",
                                                        "start_s": 0.0, "end_s": 0.5, "seconds": 0.5}]})
    assert facts.streams is None
    assert "streams" not in json.loads(facts.to_json()) and "streams" not in facts.model_dump()
    assert "Streams" not in render_html(facts) and "Streams" not in render_markdown(facts)
    assert ".cards" not in render_html(facts)


def test_a_saved_run_summary_must_repeat_its_stream(tmp_path):
    doc = {"pipeline": "p", "placement": {"train": "cpu"}, "executor": "threads", "workers": 1,
           "makespan_s": 1.6, "streams": [starved().model_dump(mode="json")], "samples_per_s": 410.0, "batches": 10}
    assert collect(run=doc).streams[0].samples_per_s == 410.0
    with pytest.raises(ReportInputError, match="field samples_per_s is not a field of a placer run"):
        collect(run={**doc, "samples_per_s": 1.0})


@pytest.mark.slow
def test_cli_reports_a_saved_stream_run(tmp_path):
    saved = tmp_path / "run.json"
    env_run = run_placer(["run", "pipelines/stream_images.py", "--size", "64",
                              "--placement", "all=cpu", "--workers", "2", "-o", str(saved)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert env_run.returncode == 0, env_run.stderr
    out = tmp_path / "report.html"
    done = run_placer(["report", "--run", str(saved), "-o", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert '<section id="streams">' in html and "batches → train" in html and 'id="fig-stream0"' in html
    md = tmp_path / "report.md"
    run_placer(["report", "--run", str(saved), "-o", str(md), "--pictures"],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert "## Streams" in md.read_text() and (tmp_path / "report_files" / "stream0.svg").exists()
