"""A run in a fresh process that blocks is ended after twice its share of the budget and a margin, and the
advice names the setting it could not measure (placer.stream.fresh.stuck_after)."""

from __future__ import annotations

import os
import pickle
import sys
import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader

from placer.stream import fresh
from placer.stream.dropin import advise_loader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="fresh processes are forked on Linux only; elsewhere the runs stay in-process")


class BlocksOnce:
    """A step that sleeps a minute in the first fresh run past the user's own (the fourth process but the
    test's to call it: the helper's first batch, the user's run and its longer rerun come first), once."""

    def __init__(self, folder):
        self.folder, self.home = str(folder), os.getpid()

    def __call__(self, batch):
        if os.getpid() == self.home:
            return
        mine = os.path.join(self.folder, str(os.getpid()))
        if not os.path.exists(mine):
            open(mine, "w").close()
            if len([f for f in os.listdir(self.folder) if f.isdigit()]) >= 4:
                try:
                    os.close(os.open(os.path.join(self.folder, "slept"), os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return
                time.sleep(60)


@pytest.mark.slow
def test_a_step_that_blocks_in_a_fresh_run_does_not_hold_the_advice(tmp_path):
    loader = DataLoader(torch.arange(64.0).reshape(64, 1), batch_size=8)
    t = time.perf_counter()
    a = advise_loader(loader, BlocksOnce(tmp_path), batches=4, budget_s=10, cache_bytes=0, fresh=True)
    took = time.perf_counter() - t
    assert (tmp_path / "slept").exists()
    assert took < 25, took
    assert a.runs_in == "fresh processes"  # the other runs went on in fresh processes
    stuck = [n for n in a.notes if n.startswith("could not be measured: ")]
    assert len(stuck) == 1 and "did not end in" in stuck[0], a.notes
    assert "could not be measured" in a.to_json() and "could not be measured" in str(a)


def test_the_limit_is_twice_the_share_and_warm_up_and_a_margin():
    class Left:
        def left(self):
            return 1.5

    assert fresh.stuck_after({"deadline": Left(), "give_up_s": 2.0}) == 2 * 3.5 + fresh.STUCK_MARGIN_S
    assert fresh.stuck_after({"deadline": Left(), "give_up_s": None}) == 1.5 + fresh.RUN_TIMEOUT_S


def test_two_answers_read_at_once_are_both_received():
    """The helper answers "started" and "done" for each run: a quick run's two answers arrive in one read."""
    r, w = os.pipe()
    runs = fresh.FreshRuns.__new__(fresh.FreshRuns)
    runs._r, runs._rest = r, b""
    try:
        os.write(w, pickle.dumps(("started", 1)) + pickle.dumps(("done", 0)))
        assert runs._recv(1) == ("started", 1) and runs._recv(1) == ("done", 0)
        with pytest.raises(TimeoutError):
            runs._recv(0.05)
    finally:
        os.close(r)
        os.close(w)
