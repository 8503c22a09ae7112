"""A report of a run with streams speaks of throughput and total time, never of makespan.

The one-shot pipeline's objective keeps its name, makespan, where it is the documented objective.
"""

from __future__ import annotations

import re

from placer.data.run import StreamStageStats, StreamStats
from placer.report import collect, render_html, render_markdown


def node(name, kind, busy, starved, blocked):
    return StreamStageStats(name=name, kind=kind, device="cpu", workers=1, worker_kind="thread", batches=10,
                            busy_s=busy, starved_s=starved, blocked_s=blocked, wall_s=busy + starved + blocked)


def stream_run():
    stats = StreamStats(source="read", step="train", epochs=1, batches=10, samples=640, seconds=1.6,
                        samples_per_s=400.0, time_to_first_batch_s=0.05, consumer_idle_fraction=0.6, prefetch=2,
                        stages=[node("read", "source", 0.05, 0.0, 1.55), node("augment", "batch", 1.5, 0.1, 0.0),
                                node("train", "step", 0.4, 1.0, 0.2)],
                        queue_trace=[(0.2 * i, [2, 0]) for i in range(1, 11)])
    return {"pipeline": "p", "placement": {"read": "cpu", "augment": "cpu", "train": "cpu", "load": "cpu"},
            "executor": "threads", "workers": 1, "makespan_s": 1.7, "streams": [stats.model_dump(mode="json")],
            "stages": [{"name": "load", "device": "cpu", "lane": "cpu/0", "start_s": 0.0, "end_s": 0.1,
                        "seconds": 0.1},
                       {"name": "train", "device": "cpu", "lane": "stream: train", "start_s": 0.1, "end_s": 1.7,
                        "seconds": 1.6}]}


def one_shot_run():
    return {"pipeline": "demo", "placement": {"a": "cpu"}, "executor": "inline", "workers": 1, "makespan_s": 0.5,
            "stages": [{"name": "a", "device": "cpu", "lane": "cpu/0", "start_s": 0.0, "end_s": 0.5, "seconds": 0.5}]}


def visible(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", re.sub(r"<(style|svg)\b.*?</\1>", " ", html, flags=re.S))


def test_a_stream_report_says_total_time_and_never_makespan():
    facts = collect(run=stream_run())
    md = render_markdown(facts, {})
    assert "makespan" not in md.lower()
    assert "objective total time" in md and "Measured total time" in md
    html = render_html(facts)  # the pictures' titles too
    assert "makespan" not in html.lower() and "objective total time" in visible(html)
    assert "total time" in facts.bottleneck.sentence and "makespan" not in facts.bottleneck.sentence


def test_a_one_shot_report_keeps_its_documented_objective_makespan():
    facts = collect(run=one_shot_run())
    md = render_markdown(facts, {})
    assert "objective makespan" in md and "Measured makespan" in md


def test_a_loader_feeding_the_step_is_reported_with_its_worker_processes_not_as_one_batch_at_a_time():
    """The runner's script loop (a DataLoader's worker processes feeding the step, read in one thread) has no
    queue, and was reported as a sequential run of one thread that should "run with --workers 1 or more" (a
    text_infer plan of 2 worker processes: "Sequential run (no overlap) ... with workers the stages overlap")."""
    src = node("batches", "source", 0.9, 0.0, 0.0).model_copy(update={"loader_workers": 2})
    stats = StreamStats(source="batches", step="predict", epochs=1, batches=10, samples=640, seconds=1.0,
                        samples_per_s=640.0, time_to_first_batch_s=0.05, consumer_idle_fraction=0.9, prefetch=4,
                        stages=[src, node("predict", "step", 0.1, 0.9, 0.0)], sequential=False)
    run = {**stream_run(), "placement": {"batches": "cpu", "predict": "cpu", "load": "cpu"},
           "streams": [stats.model_dump(mode="json")]}
    run["stages"] = [{**st, "name": "predict" if st["name"] == "train" else st["name"]} for st in run["stages"]]
    facts = collect(run=run)
    s = facts.streams[0]
    assert not s.sequential and s.queues == []
    assert s.sentence.startswith("Input-bound") and "2 DataLoader worker processes on cpu" in s.sentence, s.sentence
    md = render_markdown(facts, {})
    assert "sequential run" not in md.lower() and "--workers 1 or more" not in md
    assert "| 2 DataLoader processes |" in md
    assert "its 2 DataLoader worker processes on cpu do not keep up" in md
    assert '2 <span class="tag">DataLoader processes</span>' in render_html(facts)
    # a thread-pool loader's threads feeding the step: its threads, not processes, nor one batch at a time
    threads = stats.model_copy(update={"stages": [src.model_copy(update={"loader_workers": 0, "loader_threads": 2}),
                                                   stats.stages[1]]})
    tfacts = collect(run={**run, "streams": [threads.model_dump(mode="json")]})
    t = tfacts.streams[0]
    assert not t.sequential and "2 loader threads on cpu" in t.sentence, t.sentence
    tmd = render_markdown(tfacts, {})
    assert "| 2 loader threads |" in tmd and "DataLoader process" not in tmd and "--workers 1 or more" not in tmd
    assert "its 2 loader threads on cpu do not keep up" in tmd
    assert '2 <span class="tag">loader threads</span>' in render_html(tfacts)
    # a file saved before runs recorded it: a run without queues is read as one batch at a time, as it was
    old = stats.model_dump(mode="json")
    old.pop("sequential")
    assert collect(run={**run, "streams": [old]}).streams[0].sequential
