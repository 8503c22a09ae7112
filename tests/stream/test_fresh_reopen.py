"""Datasets holding open files, mapped arrays, database connections or locks still run in fresh processes."""

from __future__ import annotations

import os
import pickle
import sqlite3
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer.stream import advise_loader
from placer.stream.reopen import dumps

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fresh runs fork a helper: Linux only")


def test_a_binary_file_opens_again_at_its_position(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(100)))
    with open(path, "rb") as f:
        f.seek(40)
        g = pickle.loads(dumps(f))
        assert g.read(3) == bytes([40, 41, 42]) and f.tell() == 40  # the original is not moved
        g.close()


def test_a_text_file_opens_again_at_its_position_with_its_encoding(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("é one\ntwo\nthree\n", encoding="latin-1")
    with open(path, encoding="latin-1") as f:
        f.readline()
        g = pickle.loads(dumps(f))
        assert g.readline() == "two\n" and g.encoding == "latin-1"
        g.close()


def test_a_file_opened_for_writing_is_not_opened_again(tmp_path):
    with open(tmp_path / "out.txt", "w") as f, pytest.raises((TypeError, pickle.PicklingError)):
        dumps(f)  # opening it again would empty it: it does not pickle, as before
    assert (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("mode", ["r", "c", "r+", "w+"])
def test_a_mapped_array_is_mapped_again_not_copied(tmp_path, mode):
    path = tmp_path / "a.f32"
    np.arange(24, dtype=np.float32).tofile(path)
    a = np.memmap(path, dtype=np.float32, mode="r+" if mode == "w+" else mode, offset=8, shape=(2, 5))
    b = pickle.loads(dumps(a))
    assert isinstance(b, np.memmap) and os.fspath(b.filename) == os.fspath(a.filename) and b.shape == (2, 5)
    assert np.array_equal(b, np.arange(2, 12, dtype=np.float32).reshape(2, 5))
    assert len(dumps(a)) < a.nbytes + 200 or a.nbytes < 200  # the file's name, not its data
    assert (tmp_path / "a.f32").stat().st_size == 24 * 4  # never emptied
    # a view of the map pickles as an array (a copy), as numpy pickles it
    view = pickle.loads(dumps(a[1]))
    assert np.array_equal(view, a[1])


def test_a_database_connection_opens_the_same_file_again(tmp_path):
    con = sqlite3.connect(tmp_path / "db.sqlite")
    con.execute("create table t (x integer)")
    con.executemany("insert into t values (?)", [(i,) for i in range(5)])
    con.commit()
    again = pickle.loads(dumps(con))
    assert again.execute("select sum(x) from t").fetchone() == (10,)
    with pytest.raises((TypeError, pickle.PicklingError)):
        dumps(sqlite3.connect(":memory:"))  # nothing to open again


def test_a_lock_pickles_as_a_new_free_lock():
    lock, rlock = threading.Lock(), threading.RLock()
    with lock:
        other = pickle.loads(dumps(lock))
        assert other.acquire(blocking=False)
    assert isinstance(pickle.loads(dumps(rlock)), type(threading.RLock()))


class Records(Dataset):
    """Fixed-size records read from a file held open since ``__init__``, a label table in SQLite, a lock."""

    def __init__(self, folder):
        self.f = open(folder / "records.bin", "rb")
        self.table = np.memmap(folder / "scale.f32", dtype=np.float32, mode="r")
        self.db = sqlite3.connect(folder / "labels.sqlite", check_same_thread=False)  # read by thread workers too
        self.lock = threading.Lock()

    def __len__(self):
        return 48

    def __getitem__(self, i):
        with self.lock:
            self.f.seek(16 * i)
            raw = self.f.read(16)
        label = self.db.execute("select y from labels where i = ?", (i,)).fetchone()[0]
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float() * float(self.table[i % 4])
        return x, label


@pytest.fixture
def records(tmp_path):
    (tmp_path / "records.bin").write_bytes(bytes(i % 251 for i in range(16 * 48)))
    np.array([1, 2, 3, 4], dtype=np.float32).tofile(tmp_path / "scale.f32")
    con = sqlite3.connect(tmp_path / "labels.sqlite")
    con.execute("create table labels (i integer, y integer)")
    con.executemany("insert into labels values (?, ?)", [(i, i % 3) for i in range(48)])
    con.commit()
    con.close()
    return Records(tmp_path)


@linux_only
def test_a_dataset_holding_open_handles_is_measured_in_fresh_processes(records):
    with pytest.raises(TypeError):
        pickle.dumps(records)  # as a script holds it: it does not pickle
    loader = DataLoader(records, batch_size=8)
    before = [b[0].sum().item() for b in loader]
    advice = advise_loader(loader, lambda b: None, batches=3, budget_s=3, cache_bytes=0, fresh=True, epochs=1)
    assert advice.runs_in == "fresh processes", advice.notes
    assert not any(n.startswith("measured in this process") for n in advice.notes)
    assert [b[0].sum().item() for b in advice.loader()] == before
    assert records.f.tell() in range(0, 16 * 48 + 1) and not records.f.closed  # the user's handles still work


@linux_only
@pytest.mark.slow
def test_where_a_handle_cannot_be_opened_again_the_advice_says_what_in_process_runs_change(tmp_path, records):
    records.log = open(tmp_path / "log.txt", "a")  # appending: opening it again would move it
    advice = advise_loader(DataLoader(records, batch_size=8), lambda b: None, batches=3, budget_s=3, cache_bytes=0,
                           fresh=True, epochs=1)
    note = next(n for n in advice.notes if n.startswith("measured in this process"))
    assert "could not be pickled" in note and "heap" in note and "further apart" in note
    records.log.close()
