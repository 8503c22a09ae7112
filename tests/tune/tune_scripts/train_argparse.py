"""Train a small MLP on synthetic features computed per sample in numpy (a user's script, loader flags as options)."""

import argparse
import hashlib
import json
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Features(Dataset):
    def __init__(self, n, work):
        self.n, self.work = n, work

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        x = rng.normal(size=(self.work,)).astype(np.float32)
        for _ in range(3):
            x = np.tanh(np.sort(x) * 0.5)
        return torch.from_numpy(x[:32].copy()), torch.tensor(float(i % 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--work", type=int, default=20000)
    args = ap.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Features(args.size, args.work), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers, generator=torch.Generator().manual_seed(1))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(args.epochs):
        for x, y in loader:
            digest.update(x.numpy().tobytes())
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print(json.dumps({"seconds": time.perf_counter() - start, "digest": digest.hexdigest(), "loss": float(loss)}))


if __name__ == "__main__":
    main()
