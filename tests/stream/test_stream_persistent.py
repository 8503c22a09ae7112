"""A Dataset or DataLoader source's worker processes kept between epochs (``persistent_workers``).

The step records, batch by batch, the sample indices it saw, a number each item drew from
torch's generator in its worker, and the worker's process id: kept workers must give the
batches (order and random draws) of workers started each epoch and of one batch at a time,
and serve every epoch from the same processes.
"""

from __future__ import annotations

import os
import threading

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer import Pipeline, execute
from placer.data.stream import LoaderSettings, StreamProfile, StreamSettings
from placer.stream import StreamConfig
from placer.stream.model import predict
from placer.stream.search import Candidate, keep_workers, make

N, B, EPOCHS = 24, 4, 3


class Items(Dataset):
    """Item i: its index, a draw seeded by the index and the dataset's ``epoch`` (as augmentation seeded per
    sample is), and the id of the process that read it."""

    def __init__(self):
        self.epoch = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        draw = torch.randint(0, 1 << 20, (), generator=torch.Generator().manual_seed(i + 1000 * self.epoch))
        return torch.tensor([float(i), float(draw.item()), float(os.getpid())])


def stream(how: str = "same", fail_at: int | None = None) -> Pipeline:
    """``same``: the source returns one DataLoader every epoch; ``sampler``: a new DataLoader each epoch,
    its sampler set to the epoch, over the same dataset; ``dataset``: a new dataset each epoch;
    ``epoch``: the same dataset, its ``epoch`` set each epoch (its items change)."""
    p = Pipeline("kept-workers")

    @p.stage(kind="other", pin="cpu")
    def loader():
        return DataLoader(Items(), batch_size=B, shuffle=True, generator=torch.Generator().manual_seed(3))

    @p.source(epochs=EPOCHS, batch_size=B)
    def rows(loader, batch_info):
        if how == "same":
            return loader
        if how == "sampler":
            order = torch.randperm(N, generator=torch.Generator().manual_seed(batch_info.epoch)).tolist()
            return DataLoader(loader.dataset, batch_size=B, sampler=order)
        if how == "dataset":
            return DataLoader(Items(), batch_size=B, shuffle=True, generator=loader.generator)
        loader.dataset.epoch = batch_info.epoch
        return loader

    done = []

    @p.step()
    def seen(rows):
        if fail_at is not None and len(done) == fail_at:
            raise ValueError("bad batch in epoch 1")
        done.append(1)
        return rows.clone()

    return p


def batches(run):
    """Per batch: (indices, draws) and the set of worker process ids."""
    out = [(x[:, 0].tolist(), x[:, 1].tolist()) for x in run.outputs["seen"]]
    pids = {int(p) for x in run.outputs["seen"] for p in x[:, 2].tolist()}
    return out, pids


def per_epoch_pids(run):
    per = N // B
    xs = run.outputs["seen"]
    return [{int(p) for x in xs[e * per:(e + 1) * per] for p in x[:, 2].tolist()} for e in range(EPOCHS)]


@pytest.mark.parametrize("how", ["same", "sampler"])
@pytest.mark.slow
def test_kept_workers_give_the_batches_of_workers_started_each_epoch_from_the_same_processes(how):
    workers = StreamConfig(workers=1, stage_workers={"rows": 2})
    each = execute(stream(how), "all=cpu", stream=workers)
    kept = execute(stream(how), "all=cpu", stream=workers.override(persistent_workers=True))
    one = execute(stream(how), "all=cpu", stream=StreamConfig(workers=0))
    assert batches(kept)[0] == batches(each)[0] == batches(one)[0]  # the same order and draws, every epoch
    assert batches(kept)[0][: N // B] != batches(kept)[0][N // B: 2 * N // B]  # reshuffled each epoch
    kept_pids, each_pids = per_epoch_pids(kept), per_epoch_pids(each)
    assert all(p == kept_pids[0] for p in kept_pids) and len(kept_pids[0]) == 2
    assert len(set().union(*each_pids)) == 2 * EPOCHS  # without: two new processes each epoch
    assert os.getpid() not in kept_pids[0]
    assert not [q for q in psutil.Process().children() if q.pid in kept_pids[0] and q.is_running()
                and q.status() != psutil.STATUS_ZOMBIE]  # the kept workers stopped with the run


def test_a_step_that_fails_in_a_later_epoch_stops_the_kept_workers():
    from placer.errors import StageFailedError

    before = {q.pid for q in psutil.Process().children()}
    with pytest.raises(StageFailedError, match="bad batch in epoch 1") as err:
        execute(stream(fail_at=N // B + 1), "all=cpu",
                stream=StreamConfig(workers=1, stage_workers={"rows": 2}, persistent_workers=True))
    assert err.value.stage == "seen"
    alive = [q for q in psutil.Process().children() if q.pid not in before and q.is_running()
             and q.status() != psutil.STATUS_ZOMBIE]
    assert not alive


def test_kept_workers_leave_torchs_global_draws_as_workers_started_each_epoch_do():
    """A loader without a generator draws its workers' seed and its order from torch's global generator,
    which a user's script draws from too (dropout, its next run): kept workers must draw as many numbers
    from it, in the same order, as workers started each epoch do."""
    def build():
        p = Pipeline("global-draws")

        @p.stage(kind="other", pin="cpu")
        def loader():
            return DataLoader(Items(), batch_size=B, shuffle=True)

        @p.source(epochs=EPOCHS, batch_size=B)
        def rows(loader):
            return loader

        @p.step()
        def seen(rows):
            return rows[:, 0]

        return p

    workers = StreamConfig(workers=1, stage_workers={"rows": 2})
    out = []
    for cfg in (workers, workers.override(persistent_workers=True)):
        torch.manual_seed(11)
        out.append(([x.tolist() for x in execute(build(), "all=cpu", stream=cfg).outputs["seen"]],
                    torch.rand(3).tolist()))  # the global generator's next numbers after the run
    assert out[0] == out[1]
    assert out[0][0][: N // B] != out[0][0][N // B: 2 * N // B]


@pytest.mark.parametrize("how", ["dataset", "epoch"])
@pytest.mark.slow
def test_workers_start_again_for_a_new_dataset_or_one_the_source_changed(how):
    cfg = StreamConfig(workers=1, stage_workers={"rows": 2})
    kept = execute(stream(how), "all=cpu", stream=cfg.override(persistent_workers=True))
    assert len(set().union(*per_epoch_pids(kept))) == 2 * EPOCHS
    assert batches(kept)[0] == batches(execute(stream(how), "all=cpu", stream=cfg))[0]
    if how == "epoch":  # the items changed with the epoch, and the workers saw it
        draws = [d for _, d in batches(kept)[0]]
        assert draws[: N // B] != draws[N // B: 2 * N // B]


def test_the_loader_settings_carry_kept_workers_both_ways():
    s = StreamSettings(stage_workers={"rows": 2}, persistent_workers=True)
    lo = LoaderSettings.from_stream(s, "rows")
    assert lo.persistent_workers and lo.kwargs()["persistent_workers"] is True
    assert lo.to_stream("rows").persistent_workers
    assert not LoaderSettings.from_stream(s.override(workers=0), "rows").persistent_workers  # no workers to keep


@pytest.fixture(scope="module")
def profile() -> StreamProfile:
    from placer.stream.profile import profile_stream

    return profile_stream(stream(), "rows", budget_s=6.0)


def test_the_profile_finds_whether_the_epochs_read_the_same_dataset(profile):
    from placer.stream.profile import profile_stream

    assert profile.same_source
    assert profile_stream(stream("sampler"), "rows", budget_s=3.0).same_source
    assert not profile_stream(stream("dataset"), "rows", budget_s=3.0).same_source
    assert not profile_stream(stream("epoch"), "rows", budget_s=3.0).same_source


def test_the_model_starts_kept_workers_once_and_the_search_keeps_them(profile):
    place = tuple((m, "cpu") for m in profile.members)
    with_workers = make(place, {"rows": 2}, pin=False)
    assert profile.stage("rows").worker_start_s is not None
    each = predict(profile, dict(place), with_workers.settings)
    kept = predict(profile, dict(place), with_workers.settings.override(persistent_workers=True))
    bounds = profile.stage("rows").worker_start_s + (profile.stage("rows").worker_end_s or 0.0)
    assert each.total_s - kept.total_s == pytest.approx((EPOCHS - 1) * bounds, rel=1e-6)
    assert keep_workers(profile, with_workers, EPOCHS).settings.persistent_workers
    assert not keep_workers(profile, with_workers, 1).settings.persistent_workers  # one epoch: nothing to keep
    none = make(place, {"rows": 0}, pin=False)
    assert not keep_workers(profile, Candidate(none.placement, none.settings), EPOCHS).settings.persistent_workers
    cached = make(place, {"rows": 2}, pin=False, cache="rows")
    assert not keep_workers(profile, cached, EPOCHS).settings.persistent_workers


@pytest.mark.parametrize("objective", ["total_time", "throughput"])
def test_the_options_measured_speed_up_is_the_whole_runs_for_a_total_time_plan(objective):
    """A plan for the run's total time is set against the baselines' whole runs (samples over seconds, worker
    start-up and epoch ends included), as its prediction is; a throughput plan against their steady state."""
    from placer.data.report import StreamFacts
    from placer.data.run import StreamStats
    from placer.data.stream import Alternative, StreamPlan
    from placer.report.streams import add_plan

    plan = StreamPlan(pipeline="p", source="rows", step="seen", objective=objective, predicted_samples_per_s=900.0,
                      baselines=[Alternative(name="num_workers=0", change="in turn", placement={},
                                             predicted_samples_per_s=600.0)])
    # the plan: steady 1,000 samples/s but 1,000 samples in 1.25 s (its workers took 0.2 s to start)
    facts = StreamFacts(source="rows", step="seen", epochs=2, batches=10, samples=1000, seconds=1.25,
                        samples_per_s=1000.0, time_to_first_batch_s=0.2, consumer_idle_fraction=0.1, prefetch=2)
    base = StreamStats(source="rows", step="seen", epochs=2, batches=10, samples=1000, seconds=2.0,
                       samples_per_s=520.0, time_to_first_batch_s=0.0, consumer_idle_fraction=0.0, prefetch=2)
    add_plan(facts, plan, {"num_workers=0": base})
    opt = {o.name: o for o in facts.options}
    if objective == "total_time":
        assert facts.options_measure == "whole run"
        assert opt["plan"].measured_samples_per_s == pytest.approx(800.0)
        assert opt["num_workers=0"].measured_samples_per_s == pytest.approx(500.0)
        assert opt["num_workers=0"].plan_speedup_measured == pytest.approx(1.6)
    else:
        assert facts.options_measure == "steady state"
        assert opt["num_workers=0"].plan_speedup_measured == pytest.approx(1000.0 / 520.0)


class _Order(torch.utils.data.Sampler):
    """The indices in order, noting the thread that draws them (the one iterating the DataLoader)."""

    def __init__(self, names: set):
        self.names = names

    def __len__(self):
        return N

    def __iter__(self):
        for i in range(N):
            self.names.add(threading.current_thread().name)
            yield i


def _loop(names: set, steps: set, data: type = Items, columns: int = 2) -> Pipeline:
    """A DataLoader over ``data`` (its sampler records the threads drawing its indices in ``names``) and a step
    that records its thread in ``steps`` and returns each batch's first ``columns`` columns."""
    p = Pipeline("script-loop")

    @p.stage(kind="other", pin="cpu")
    def loader():
        return DataLoader(data(), batch_size=B, sampler=_Order(names))

    @p.source(epochs=2, batch_size=B)
    def rows(loader):
        return loader

    @p.step()
    def seen(rows):
        steps.add(threading.current_thread().name)
        return rows[:, :columns].clone()

    return p


def test_a_loader_with_worker_processes_feeds_the_step_in_one_thread_as_a_scripts_loop():
    """With DataLoader worker processes feeding a step on the host, the stream runs as a script's loop: one
    thread reads each batch from the loader and runs the step on it (on 2 cores a queue between two threads
    ranked torch's threads the other way round from the script's own loop); with the source read in this
    process by a thread of its own, the step keeps its thread. Outputs equal one batch at a time's."""
    from placer.data.report import ReportFacts
    from placer.report.advice import stream_rules
    from placer.report.streams import stream_facts

    reads, steps = set(), set()
    run = execute(_loop(reads, steps), "all=cpu", stream=StreamConfig(workers=1, stage_workers={"rows": 2}))
    assert len(reads) == 1 and reads == steps, (reads, steps)
    one = execute(_loop(set(), set()), "all=cpu", stream=StreamConfig(workers=0))
    assert [x.tolist() for x in run.outputs["seen"]] == [x.tolist() for x in one.outputs["seen"]]
    # the report tells it from one batch at a time: the workers read ahead while the step runs, and no queue
    stats = run.streams[0]
    assert stats.sequential is False and stats.stages[0].loader_workers == 2 and not stats.queue_trace
    facts = stream_facts(stats)
    assert not facts.sequential and not facts.sentence.startswith("Sequential") and facts.queues == []
    assert facts.stages[0].loader_workers == 2

    def words(f):
        return " ".join(a.text for a in stream_rules(ReportFacts.model_construct(streams=[f])))

    assert "was sequential (--workers 0" not in words(facts)
    plain = stream_facts(one.streams[0])
    assert plain.sequential and plain.sentence.startswith("Sequential") and plain.stages[0].loader_workers == 0
    assert "was sequential (--workers 0" in words(plain)
    reads, steps = set(), set()
    execute(_loop(reads, steps), "all=cpu", stream=StreamConfig(workers=1, stage_workers={"rows": 0}))
    assert len(reads) == len(steps) == 1 and reads != steps, (reads, steps)


def test_a_thread_pool_loader_reads_a_dataset_source_in_threads_with_the_batches_of_one_at_a_time():
    """A source whose worker kind is ``thread`` is read by a thread-pool loader's threads (in this process, no
    worker processes), feeding the step as the script's loop does; the batches, their order and their draws
    are one batch at a time's, every epoch, with workers kept between epochs asked for or not; the run and its
    report say "2 loader threads"."""
    from placer.report.streams import stream_facts, workers_text

    readers: set[str] = set()

    class Named(Items):
        def __getitem__(self, i):
            readers.add(threading.current_thread().name)
            return super().__getitem__(i)

    def pipe(names: set, steps: set) -> Pipeline:
        return _loop(names, steps, Named, 3)  # with the id of the process that read each item

    one = execute(pipe(set(), set()), "all=cpu", stream=StreamConfig(workers=0))
    want = [x.tolist() for x in one.outputs["seen"]]
    assert all(row[2] == os.getpid() for x in want for row in x)
    for persistent in (False, True):
        readers.clear()
        reads, steps = set(), set()
        cfg = StreamConfig(workers=1, stage_workers={"rows": 2}, worker_kind={"rows": "thread"},
                           persistent_workers=persistent)
        run = execute(pipe(reads, steps), "all=cpu", stream=cfg)
        assert [x.tolist() for x in run.outputs["seen"]] == want  # this process's pid: no worker process read
        assert readers and all(n.startswith("ThreadLoader") for n in readers), readers
        assert len(reads) == 1 and reads == steps, (reads, steps)  # the step's thread draws the indices
        stats = run.streams[0]
        node = stats.stages[0]
        assert (node.loader_threads, node.loader_workers) == (2, 0) and not stats.sequential
        facts = stream_facts(stats)
        assert workers_text(facts.stages[0]) == "2 loader threads on cpu"
