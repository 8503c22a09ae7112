"""The drop-in's runs in fresh processes (placer.stream.fresh): the state the user's script starts in."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset

from placer.stream import fresh
from placer.stream.dropin import advise_loader
from placer.timing import settle_allocator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="fresh processes are forked on Linux only; elsewhere the runs stay in-process")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mapped_bytes() -> int | None:
    """glibc's bytes in blocks mapped on their own (None off glibc)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    return libc.mallinfo2().hblkhd


class Noted(Dataset):
    """Writes, on its first item in each process but the fresh runs' helper (a child of the test's process),
    its process and whether a 24 MB block was mapped on its own there: glibc maps blocks above its
    threshold so, which starts at 128 KiB and rises to each mapped block freed (8 MB here, every item),
    while placer's settled processes keep it at 31 MiB."""

    def __init__(self, log):
        self.log, self.home = str(log), os.getpid()
        self.probed: set[int] = set()  # the processes whose first item probed already

    def __len__(self):
        return 64

    def __getitem__(self, i):
        block = np.ones(1 << 20)  # 8 MB, as the script's batches allocate
        if os.getpid() not in self.probed and os.getppid() != self.home:
            self.probed.add(os.getpid())
            before = _mapped_bytes()
            probe = np.ones(3 << 20)
            mapped = _mapped_bytes() - before >= probe.nbytes
            del probe
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()} {int(mapped)} {os.getppid()}\n")
        return torch.full((4,), float(i)) + float(block[0]) - 1.0


def _step(batch):
    return float(batch.sum())


def _seen(log) -> list[tuple[int, bool]]:
    """Each process's first item: (its id, whether the block was mapped on its own), for the processes whose
    parent read no item first: a run's own process. A worker forked from a run process that read items
    itself inherits that process's allocator, as a script's workers inherit the script's."""
    rows = [(int(p), m == "1", int(pp)) for p, m, pp in (line.split() for line in log.read_text().split("\n") if line)]
    read = {p for p, _, _ in rows}
    return [(p, m) for p, m, pp in rows if pp not in read]


@pytest.mark.skipif(_mapped_bytes() is None, reason="reads glibc's allocator (mallinfo2); this libc has none")
@pytest.mark.slow
def test_each_run_is_in_a_fresh_process_whose_allocator_is_as_a_script_starts(tmp_path):
    """In fresh processes a 24 MB block is mapped on its own, as in a script after its first batch; in this
    process, which placer has settled, it is not: the runs here would measure another allocator than the script's."""
    log = tmp_path / "fresh.log"
    a = advise_loader(DataLoader(Noted(log), batch_size=8), _step, batches=4, budget_s=6, cache_bytes=0, fresh=True)
    assert a.runs_in == "fresh processes" and a.as_dict()["runs_in"] == "fresh processes"
    seen = [(p, m) for p, m in _seen(log) if p != os.getpid()]  # (the advice reads items here too)
    assert len(seen) >= 3 and all(m for _, m in seen), seen  # a process per run (and worker processes of theirs)
    assert a.user.samples_per_s > 0 and all(t.samples_per_s > 0 for t in a.trials)

    here = tmp_path / "here.log"
    settle_allocator()  # as placer's own executor or profile leaves a process (the drop-in leaves yours as it is)
    b = advise_loader(DataLoader(Noted(here), batch_size=8), _step, batches=4, budget_s=6, cache_bytes=0, fresh=False)
    assert b.runs_in == "this process"
    assert _seen(here) == [(os.getpid(), False)]


_AFTER_ADVICE = """
import ctypes, sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
import placer.timing
from placer.stream.dropin import MeasuredLoader, advise_loader

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2

class Rows(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        block = np.ones(1 << 20)  # 8 MB, freed: glibc's threshold rises to it, not to placer's 31 MiB
        return torch.full((4,), float(i)) + float(block[0]) - 1.0

if sys.argv[1] == "settled":
    placer.timing.measure(lambda: None, min_reps=1, max_time_s=0.001, warn=False)
loader = DataLoader(Rows(), batch_size=8)
advise_loader(loader, lambda b: float(b.sum()), batches=4, budget_s=4, cache_bytes=0, fresh=True)
for _ in MeasuredLoader(loader):
    pass
before = libc.mallinfo2().hblkhd
probe = np.ones(3 << 20)  # 24 MB: mapped on its own unless the allocator was settled
print(int(libc.mallinfo2().hblkhd - before >= probe.nbytes), placer.timing._settled_allocator)
"""


@pytest.mark.skipif(_mapped_bytes() is None, reason="reads glibc's allocator (mallinfo2); this libc has none")
@pytest.mark.parametrize("before", ["as a script starts", "settled"])
@pytest.mark.slow
def test_the_advice_and_measuring_leave_the_users_allocator_as_they_found_it(before):
    """The script runs on in its own process after the advice: settled there (placer's 31 MiB threshold and top
    pad), numpy_augment's loop ran 1.16x as fast as its settings in a fresh script, a speed-up the advice's claim
    (from fresh runs) did not price. A process placer had settled before stays settled."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _AFTER_ADVICE, "settled" if before == "settled" else "fresh"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    mapped, settled = out.stdout.split()[-2:]
    assert (mapped, settled) == (("0", "True") if before == "settled" else ("1", "False")), out.stdout


@pytest.mark.slow
def test_a_step_that_fails_in_a_fresh_process_raises_its_error_in_yours():
    def step(batch):
        raise ValueError("this batch has no labels")

    with pytest.raises(ValueError, match="this batch has no labels"):
        advise_loader(DataLoader(list(range(64)), batch_size=8), step, batches=4, budget_s=4, cache_bytes=0,
                      fresh=True)


class Locked(Dataset):
    def __init__(self):
        self.lock = threading.Lock()  # a new lock in a fresh process (placer.stream.reopen)
        self.ids = (i for i in range(10**9))  # a generator does not pickle

    def __len__(self):
        return 64

    def __getitem__(self, i):
        with self.lock:
            return torch.tensor([float(i)])


@pytest.mark.slow
def test_a_loader_that_does_not_pickle_is_measured_in_this_process_and_the_advice_says_why():
    a = advise_loader(DataLoader(Locked(), batch_size=8), _step, batches=4, budget_s=4, cache_bytes=0, fresh=True)
    assert a.runs_in == "this process"
    why = [n for n in a.notes if n.startswith("measured in this process")]
    assert len(why) == 1 and "could not be pickled" in why[0] and "generator" in why[0].lower()
    assert a.user.samples_per_s > 0



class PickledWhere:
    """Unpickles to the id of the process that pickled it; where that is not the one that made it, pickling
    takes ``away_s`` seconds, and with ``fails`` it raises."""

    def __init__(self, away_s: float = 0.0, fails: bool = False):
        self.home, self.away_s, self.fails = os.getpid(), away_s, fails

    def __reduce__(self):
        if self.fails:
            raise ValueError("this object refuses to be pickled")
        if os.getpid() != self.home:
            time.sleep(self.away_s)
        return (int, (os.getpid(),))


def _unpickled(path) -> object:
    import pickle

    with open(path, "rb") as f:
        return pickle.load(f)


def test_the_loader_is_pickled_for_the_helper_by_a_child_leaving_the_users_heap_as_it_was(tmp_path):
    """Pickling the loader in the user's process slowed the script's loop after the advice (0.91x, text_infer)."""
    fresh.pickled_apart(str(tmp_path / "p.pkl"), {"loader": PickledWhere()})
    got = _unpickled(tmp_path / "p.pkl")["loader"]
    assert isinstance(got, int) and got != os.getpid()
    assert sorted(os.listdir(tmp_path)) == ["p.pkl"]  # written whole, nothing else left


@pytest.mark.slow
def test_a_child_that_does_not_finish_pickling_is_stopped_and_the_pickling_is_done_here(tmp_path):
    t0 = time.monotonic()
    fresh.pickled_apart(str(tmp_path / "p.pkl"), PickledWhere(away_s=600), timeout_s=1.0)
    assert time.monotonic() - t0 < 30
    assert _unpickled(tmp_path / "p.pkl") == os.getpid()
    assert sorted(os.listdir(tmp_path)) == ["p.pkl"]


def test_what_fails_to_pickle_in_the_child_is_named_in_the_error(tmp_path):
    with pytest.raises(fresh.FreshUnavailable, match="ValueError: this object refuses to be pickled"):
        fresh.pickled_apart(str(tmp_path / "p.pkl"), PickledWhere(fails=True))
    assert os.listdir(tmp_path) == []

class StuckAway(Dataset):
    """Hangs in the fresh runs (not in the process that made it nor in their helper, its child)."""

    def __init__(self):
        self.home = os.getpid()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.home not in (os.getpid(), os.getppid()):
            time.sleep(600)
        return torch.tensor([float(i)])


@pytest.mark.slow
def test_a_fresh_run_that_does_not_end_is_stopped_and_the_runs_go_on_here(monkeypatch):
    monkeypatch.setattr(fresh, "RUN_TIMEOUT_S", 1.0)
    monkeypatch.setattr(fresh, "START_TIMEOUT_S", 30.0)
    made = []
    start = fresh.start
    monkeypatch.setattr(fresh, "start", lambda *a: made.append(start(*a)) or made[-1])
    t = time.perf_counter()
    a = advise_loader(DataLoader(StuckAway(), batch_size=8), _step, batches=4, budget_s=3, cache_bytes=0, fresh=True)
    assert time.perf_counter() - t < 60
    assert a.runs_in == "this process" and a.user.samples_per_s > 0
    assert any(n.startswith("measured in this process") and "did not end" in n for n in a.notes)
    runs = made[0][0]
    assert runs.proc.poll() is not None and not os.path.exists(runs.dir)  # the helper and its child are gone


def test_the_runs_are_fresh_by_default_unless_placer_fresh_runs_is_0(monkeypatch):
    monkeypatch.delenv("PLACER_FRESH_RUNS")
    loader = DataLoader(list(range(64)), batch_size=8)
    assert advise_loader(loader, _step, batches=4, budget_s=3, cache_bytes=0).runs_in == "fresh processes"
    monkeypatch.setenv("PLACER_FRESH_RUNS", "0")
    assert advise_loader(loader, _step, batches=4, budget_s=3, cache_bytes=0).runs_in == "this process"


def test_a_step_on_a_gpu_keeps_the_runs_here():
    assert "GPU" in fresh.why_not("cuda") and fresh.why_not("cpu") is None


@pytest.mark.slow
def test_the_fresh_runs_start_after_the_scripts_first_batch_its_first_call_costs_paid():
    """The helper reads one batch through the step before the runs (the script's first batch): a step whose
    first call in a process is slow (imports, kernels made) slows no run; without it every run paid it."""
    calls = {"n": 0}

    def step(batch):
        if calls["n"] == 0:
            time.sleep(1.0)
        calls["n"] += 1
        return float(batch.sum())

    a = advise_loader(DataLoader(torch.arange(256.0), batch_size=8), step, batches=6, budget_s=10, cache_bytes=0,
                      fresh=True)
    assert a.runs_in == "fresh processes" and len(a.trials) >= 3
    assert all(t.read_s - t.seconds < 0.5 for t in a.trials), [(t.read_s, t.seconds) for t in a.trials]
