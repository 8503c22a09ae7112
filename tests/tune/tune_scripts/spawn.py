"""Starts one process per rank with torch.multiprocessing.spawn."""

import torch.multiprocessing as mp
from torch.utils.data import DataLoader


def work(rank):
    for _ in DataLoader(list(range(8)), batch_size=2):
        pass


if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
