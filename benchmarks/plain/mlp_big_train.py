"""Train a wide MLP on cheap features: the model's step dominates and loader settings barely matter.

An ordinary script whose ``Dataset`` makes each sample from its own seeded
generator (a few microseconds of numpy), and whose model (four wide linear
layers) spends tens of milliseconds per batch: the step is the bottleneck, so no
loader setting should make it faster.

    python benchmarks/plain/mlp_big_train.py --num-workers 2

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES, CLASSES = 256, 10


class Synthetic(Dataset):
    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed = n, seed
        self.centres = np.random.default_rng(seed).normal(0, 1, (CLASSES, FEATURES)).astype(np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i])
        label = int(rng.integers(0, CLASSES))
        x = self.centres[label] + rng.normal(0, 1.5, FEATURES).astype(np.float32)
        return torch.from_numpy(x), label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048, help="samples per epoch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="unused: the samples are generated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--placer-advice", action="store_true", help="ask placer.stream.advise_loader first")
    ap.add_argument("--placer-target", default=None, metavar="NAME",
                    help="ask placer.stream.advise_loader first, also planning for a described machine "
                         "(e.g. h200: its numbers are predictions for that machine)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dataset = Synthetic(args.size, args.seed)
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed), num_workers=args.num_workers,
                              prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed), num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    w = args.width
    model = nn.Sequential(nn.Linear(FEATURES, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, w), nn.ReLU(), nn.Linear(w, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def train_step(batch):
        x, y = batch
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    advice = None
    if args.placer_advice or args.placer_target:
        import placer.stream
        advised = placer.stream.advise_loader(loader, train_step, batches=20, budget_s=60, epochs=args.epochs,
                                              target=args.placer_target)
        print(advised)
        loader = advised.loader()
        torch.set_num_threads(advised.recommended.settings.torch_threads)
        advice = {**advised.recommended.settings.as_dict(), "seconds": round(advised.seconds, 2),
                  "claimed_speedup": round(advised.speedup, 3),
                  "change": advised.change,
                  "cache": bool(advised.cache is not None and advised.cache.recommended)}

    digest = hashlib.blake2b(digest_size=16)
    samples, first_batch_s, losses = 0, None, []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for x, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            losses.append(train_step((x, y)).item())
            samples += len(y)
        print(f"epoch {epoch}: loss {np.mean(losses[-len(loader):]):.4f}", flush=True)
    seconds = time.perf_counter() - start
    print(json.dumps({"script": "mlp_big_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{losses[-1]:.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
