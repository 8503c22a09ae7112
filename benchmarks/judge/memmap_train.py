"""Train a 1-D CNN on windows of multichannel signals held in one big ``np.memmap`` array file (an HDF5 stand-in).

An ordinary script in the shape of the common HDF5 dataset (one large
``(samples, channels, length)`` array on disk, opened once in the ``Dataset``'s
``__init__`` and sliced row by row in ``__getitem__``), with ``np.memmap`` in place
of ``h5py``: the ``Dataset`` holds the memmap open, reads one row, normalises it
per channel with statistics computed once from a strided subsample of rows,
takes a random window (seeded by the row's index, so every loader setting reads
the same batches) and adds a first difference as extra channels. Labels sit in
a small ``.npy`` beside it. The array is written to ``--data-dir`` on the first run.

    python benchmarks/judge/memmap_train.py --num-workers 2 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

CHANNELS, LENGTH, WINDOW, CLASSES = 12, 1024, 768, 4


def write_array(folder: Path, n: int) -> None:
    """``signals.dat`` (float32, ``n`` x CHANNELS x LENGTH), ``labels.npy`` and ``shape.json``, renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    data = np.memmap(tmp / "signals.dat", dtype=np.float32, mode="w+", shape=(n, CHANNELS, LENGTH))
    labels = np.arange(n) % CLASSES
    t = np.arange(LENGTH) / LENGTH
    for start in range(0, n, 256):
        rows = np.arange(start, min(n, start + 256))
        rng = np.random.default_rng(start)
        freq = (3 + 4 * labels[rows])[:, None, None] * rng.uniform(0.9, 1.1, (len(rows), CHANNELS, 1))
        gain = rng.uniform(0.5, 20.0, (1, CHANNELS, 1))
        offset = rng.normal(0, 5, (1, CHANNELS, 1))
        data[rows] = gain * np.sin(2 * np.pi * freq * t) + offset + rng.normal(0, 1, (len(rows), CHANNELS, LENGTH))
    data.flush()
    del data
    np.save(tmp / "labels.npy", labels)
    (tmp / "shape.json").write_text(json.dumps([n, CHANNELS, LENGTH]))
    os.replace(tmp, folder)


class MemmapSignals(Dataset):
    def __init__(self, folder: Path, window: int = WINDOW, seed: int = 0):
        shape = tuple(json.loads((folder / "shape.json").read_text()))
        self.data = np.memmap(folder / "signals.dat", dtype=np.float32, mode="r", shape=shape)
        self.labels = np.load(folder / "labels.npy")
        sample = np.asarray(self.data[:: max(1, shape[0] // 64)])
        self.mean = sample.mean(axis=(0, 2), keepdims=True)[0]
        self.std = sample.std(axis=(0, 2), keepdims=True)[0] + 1e-6
        self.window, self.seed = window, seed

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        row = np.asarray(self.data[index])  # one row off the disk
        row = (row - self.mean) / self.std
        rng = np.random.default_rng([self.seed, index])
        start = int(rng.integers(0, row.shape[1] - self.window + 1))
        row = row[:, start:start + self.window]
        diff = np.diff(row, axis=1, prepend=row[:, :1])
        x = np.concatenate([row, diff]).astype(np.float32)
        return torch.from_numpy(x), int(self.labels[index])


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv1d(2 * CHANNELS, 32, 7, stride=2, padding=3), nn.ReLU(),
        nn.Conv1d(32, 32, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(32, 48, 5, stride=2, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(48, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048, help="rows in the array")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the array file is (written on the first run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--placer-advice", action="store_true", help="ask placer.stream.advise_loader first")
    ap.add_argument("--placer-target", default=None, metavar="NAME",
                    help="ask placer.stream.advise_loader first, also planning for a described machine "
                         "(e.g. h200: its numbers are predictions for that machine)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = None
    if args.data_dir is None:
        tmp = tempfile.mkdtemp(prefix="memmap_train_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"signals_{args.size}"
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        write_array(folder, args.size)

    torch.manual_seed(args.seed)
    dataset = MemmapSignals(folder, seed=args.seed)
    # the shuffle's generator sits on the sampler: a DataLoader draws its workers' base seed from its own
    # generator at every pass (once in all with persistent workers), which would reorder later epochs
    shuffled = RandomSampler(dataset, generator=torch.Generator().manual_seed(args.seed))
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, sampler=shuffled,
                              num_workers=args.num_workers,
                              prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=shuffled,
                            num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

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
        advised = placer.stream.advise_loader(loader, train_step, batches=20, budget_s=60, device="cpu",
                                              epochs=args.epochs, target=args.placer_target)
        print(advised)
        loader = advised.loader()
        torch.set_num_threads(advised.recommended.settings.torch_threads)
        advice = {**advised.recommended.settings.as_dict(), "seconds": round(advised.seconds, 2),
                  "claimed_speedup": round(advised.speedup, 3),
                  "change": advised.change,
                  "cache": bool(advised.cache is not None and advised.cache.recommended)}

    digest = hashlib.blake2b(digest_size=16)
    samples, first_batch_s, loss = 0, None, None
    start = time.perf_counter()
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            loss = train_step((x, y))
            total += loss.item() * len(y)
            samples += len(y)
        print(f"epoch {epoch}: loss {total / len(dataset):.4f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "memmap_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
