"""What pinning costs: the pin-memory thread's CPU share, read by thread, and said beside its gain."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from placer.data.stream import LoaderSettings
from placer.stream.dropin import pinning
from placer.stream.dropin.trial import Trial


def spinning():
    """A thread burning CPU until told to stop, and the event that stops it."""
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    return t, stop


def test_a_threads_cpu_seconds_are_read_by_its_native_id():
    t, stop = spinning()
    try:
        time.sleep(0.3)
        first = pinning.thread_cpu_s(t.native_id)
        time.sleep(0.3)
        later = pinning.thread_cpu_s(t.native_id)
    finally:
        stop.set()
        t.join()
    assert first is not None and later is not None and later > first > 0
    assert pinning.thread_cpu_s(None) is None
    assert pinning.thread_cpu_s(-1) is None  # no such thread in this process


class Iterator:
    """Stands in for a multi-process DataLoader iterator with pin_memory on a CUDA machine."""

    def __init__(self, thread=None):
        if thread is not None:
            self._pin_memory_thread = thread


def test_the_pin_memory_thread_of_an_iterator_is_read_and_an_iterator_without_one_gives_none():
    t, stop = spinning()
    try:
        time.sleep(0.2)
        assert pinning.pin_thread_cpu_s(Iterator(t)) > 0
    finally:
        stop.set()
        t.join()
    assert pinning.pin_thread_cpu_s(Iterator()) is None


def trial(pin: bool, rate: float, share: float | None) -> Trial:
    s = LoaderSettings(num_workers=2, prefetch_factor=2, pin_memory=pin, persistent_workers=True, torch_threads=2)
    return Trial(settings=s, samples_per_s=rate, first_batch_s=0.1, fetch_fraction=0.5, batches=10, samples=80,
                 seconds=80 / rate, pin_share=share)


def test_pinning_that_reads_no_faster_than_unpinned_is_said_to_cost_more_than_it_saves():
    best, unpinned = trial(True, 900.0, 0.31), trial(False, 1000.0, None)
    words = pinning.said(best, [unpinned, best])
    assert "took 31% of a core" in words and "0.90x" in words and "costs more than it saves" in words


def test_pinning_that_pays_is_said_with_its_gain_and_its_cpu():
    best, unpinned = trial(True, 1500.0, 0.12), trial(False, 1000.0, None)
    words = pinning.said(best, [unpinned, best])
    assert "took 12% of a core" in words and "1.50x over the same settings unpinned" in words
    assert "(the same settings unpinned were not run)" in pinning.said(best, [best])


def test_nothing_is_said_without_pinning_or_without_a_pin_memory_thread():
    assert pinning.said(trial(False, 1000.0, None), []) is None
    assert pinning.said(trial(True, 1000.0, None), []) is None  # no CUDA: torch starts no pin-memory thread


def test_the_share_is_kept_across_repeated_runs_and_in_the_json():
    from placer.stream.dropin.trial import merged

    runs = merged(trial(True, 1000.0, 0.1), [trial(True, 1100.0, 0.3), trial(True, 900.0, 0.2)])
    assert runs.pin_share == pytest.approx(0.2) and runs.as_dict()["pin_thread_share"] == 0.2
    assert "pin_thread_share" not in trial(False, 1000.0, None).as_dict()


class Slow(Dataset):
    def __len__(self):
        return 160

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.full((256,), float(i))


@pytest.mark.gpu
def test_on_a_gpu_each_pinned_run_reads_its_pin_memory_threads_cpu():
    from placer.devices import discover
    from placer.stream.dropin.measuring import run_loader
    from placer.timing import Deadline

    loader = DataLoader(Slow(), batch_size=16, num_workers=2, pin_memory=True)
    t = run_loader(loader, lambda b: b.cuda(non_blocking=True).sum(), batches=8, warmup=2,
                   device=discover().resolve("gpu"), deadline=Deadline(20))
    assert t is not None and t.pin_share is not None and 0 < t.pin_share < 1.5
