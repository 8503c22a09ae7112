"""Records of which one in twenty sits on slow storage (30 ms; the others 1.5 ms), read by two worker processes.

Prints a JSON line with the digest of every batch in the order read and of the batches as a multiset.
"""

import argparse
import hashlib
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Skewed(Dataset):
    def __len__(self):
        return 240

    def __getitem__(self, i):
        time.sleep(0.03 if i % 20 == 0 else 0.0015)
        return torch.full((8,), float(i)), i


ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=2)
args = ap.parse_args()
loader = DataLoader(Skewed(), batch_size=2, num_workers=2)
model = torch.nn.Linear(8, 1)
ordered, batches = hashlib.sha256(), []
for _ in range(args.epochs):
    for x, idx in loader:
        ordered.update(idx.numpy().tobytes())
        batches.append(tuple(idx.tolist()))
        model(x).sum().backward()
print(json.dumps({"digest": ordered.hexdigest(), "multiset": hashlib.sha256(repr(sorted(batches)).encode()).hexdigest()}))
