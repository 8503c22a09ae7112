"""Samples that wait on slow storage (a few ms each) and a light step: the loop waits for data.

Prints a JSON line with the digest of every batch it read.
"""

import argparse
import hashlib
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Remote(Dataset):
    def __len__(self):
        return 192

    def __getitem__(self, i):
        time.sleep(0.003)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), i


ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--num-workers", type=int, default=0)
args = ap.parse_args()
loader = DataLoader(Remote(), batch_size=8, shuffle=True, num_workers=args.num_workers,
                    generator=torch.Generator().manual_seed(7))
model = torch.nn.Linear(16, 1)
digest = hashlib.sha256()
for _ in range(args.epochs):
    for x, idx in loader:
        digest.update(x.numpy().tobytes() + idx.numpy().tobytes())
        model(x).sum().backward()
print(json.dumps({"digest": digest.hexdigest()}))
