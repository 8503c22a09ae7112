"""An existing training script, unchanged but for three lines that ask placer about its DataLoader.

The dataset's ``__getitem__`` is deliberately slow (numpy work and a 2 ms wait per
sample, as reading and decoding a file would be), the loader has no workers, and the
step is a small model's SGD step: the step waits for data most of the time.
``placer.stream.advise_loader`` measures that, tries a few DataLoader settings
(worker processes or threads, prefetch) on a bounded number of batches, and recommends the
fastest with its measured speed-up; ``advice.loader()`` is the tuned loader, which
yields the same batches in the same order.

    python examples/stream_training_script.py [--samples N] [--json advice.json]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import placer.stream


class SlowDataset(Dataset):
    """Samples whose loading costs about 2 ms each (the wait releases the GIL)."""

    def __init__(self, n: int, features: int = 32):
        self.n, self.features = n, features

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        x = rng.normal(size=(self.features, 16)).mean(axis=1).astype(np.float32)
        time.sleep(0.002)
        return torch.from_numpy(x), int(x.sum() > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--json", help="also write the advice as JSON to this file")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(SlowDataset(args.samples), batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0), num_workers=0)

    def train_step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    # the drop-in: measure this loader with this step, then train with the tuned loader
    advice = placer.stream.advise_loader(loader, train_step, batches=12, budget_s=60)
    print(advice)
    if args.json:
        with open(args.json, "w") as f:
            f.write(advice.to_json())

    start = time.perf_counter()
    for batch in advice.loader():
        loss = train_step(batch)
    print(f"one epoch with the recommended loader: {time.perf_counter() - start:.1f} s, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
