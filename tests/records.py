"""A Dataset of Python records whose worker processes grow as they read it (copy-on-read), and a reading of them.

Test helper (not part of placer). May import: torch, psutil. Run as a script
(``python records.py WORKERS BATCHES``), it builds the loader (:func:`loader`) as a user's script would,
reads that many batches and prints its worker processes' unique set sizes, summed, and how many there are,
as psutil reads them from the running workers.
"""

from __future__ import annotations

import sys

import psutil
import torch
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    """A few hundred thousand records held as Python dicts, each read in ``__getitem__``: a worker process
    copies the pages of the records it reads (reading writes their reference counts), so its memory grows."""

    def __init__(self, n: int = 300_000):
        self.items = [{"id": i, "name": f"item-{i}", "vals": [i, i + 1]} for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        d = self.items[i]
        x = 0.0
        for k in range(40):  # a little work per sample: the loader, not the step, sets the pace
            x += k * 0.5
        return torch.tensor([d["id"], len(d["name"]), d["vals"][1], x], dtype=torch.float32)


def workers_uss(loader: DataLoader, batches: int) -> tuple[int, int]:
    """Read ``batches`` batches, then the loader's worker processes' unique set sizes (summed) and their count,
    read with psutil while the workers run."""
    it = iter(loader)
    try:
        for _ in range(batches):
            next(it)
        pids = [w.pid for w in it._workers]
        return sum(psutil.Process(p).memory_full_info().uss for p in pids), len(pids)
    finally:
        it._shutdown_workers()


def loader(records: Records, workers: int) -> DataLoader:
    """The loader the tests advise on: shuffled from a seeded generator, so that the script below reads in the
    order the advice's first run reads."""
    return DataLoader(records, batch_size=64, num_workers=workers, shuffle=True,
                      generator=torch.Generator().manual_seed(0))


if __name__ == "__main__":
    workers, batches = int(sys.argv[1]), int(sys.argv[2])
    print(*workers_uss(loader(Records(), workers), batches))
