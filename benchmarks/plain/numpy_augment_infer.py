"""Run a CNN over images stored as ``.npy`` files, each resized, blurred and colour-corrected in numpy first.

An ordinary inference script: a folder of ``uint8`` arrays, a ``Dataset`` that
loads one, converts it to float, corrects its colour (a 3 x 3 matrix), blurs it
and resizes it with matrix products (numpy's BLAS calls, which release the GIL,
so a pool of threads can share the work), then a CNN under ``torch.no_grad()``.
No randomness: test-time preprocessing is the same on every run. The arrays are
written to ``--data-dir`` on the first run.

    python benchmarks/plain/numpy_augment_infer.py --num-workers 2 --worker-kind thread

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and a checksum of the predictions.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, default_collate

SIDE, OUT = 192, 96


def write_arrays(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    for i in range(n):
        rng = np.random.default_rng(i)
        base = np.sin(xx * rng.uniform(2, 20) + yy * rng.uniform(2, 20))
        img = np.stack([base * rng.uniform(0.3, 1) + rng.normal(0, 0.2, base.shape) for _ in range(3)], -1)
        np.save(folder / f"arr_{i:05d}.npy", np.clip(img * 100 + 128, 0, 255).astype(np.uint8))
    (folder / "done").write_text(str(n))


def gaussian_matrix(n: int, sigma: float) -> np.ndarray:
    """A blur along one axis as an n x n matrix (rows sum to one)."""
    d = np.arange(n)[:, None] - np.arange(n)[None, :]
    k = np.exp(-0.5 * (d / sigma) ** 2)
    return (k / k.sum(1, keepdims=True)).astype(np.float32)


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Linear interpolation from n_in to n_out points as an n_out x n_in matrix."""
    pos = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    lo = np.clip(np.floor(pos).astype(int), 0, n_in - 2)
    w = np.clip(pos - lo, 0, 1)
    m = np.zeros((n_out, n_in), dtype=np.float32)
    m[np.arange(n_out), lo] = 1 - w
    m[np.arange(n_out), lo + 1] = w
    return m


class Arrays(Dataset):
    def __init__(self, folder: Path):
        self.files = sorted(folder.glob("*.npy"))
        self.blur = gaussian_matrix(SIDE, 2.0)
        self.resize = resize_matrix(SIDE, OUT) @ self.blur
        self.colour = np.array([[0.9, 0.1, 0.0], [0.05, 0.9, 0.05], [0.0, 0.1, 0.9]], dtype=np.float32)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = np.load(self.files[i]).astype(np.float32) / 255.0
        img = img @ self.colour.T
        channels = []
        for c in range(3):
            ch = self.blur @ img[:, :, c] @ self.blur.T          # blur
            ch = self.resize @ ch @ self.resize.T                 # blur again and resize
            channels.append((ch - ch.mean()) / (ch.std() + 1e-5))
        return torch.from_numpy(np.stack(channels))


class ThreadLoader:
    """Batches built by a pool of threads (numpy's matrix products release the GIL), in order."""

    def __init__(self, dataset, batch_sampler, workers: int, prefetch: int):
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.workers, self.prefetch = workers, prefetch

    def __len__(self):
        return len(self.batch_sampler)

    def _batch(self, keys):
        return default_collate([self.dataset[k] for k in keys])

    def __iter__(self):
        with ThreadPoolExecutor(self.workers) as pool:
            pending = collections.deque()
            for keys in self.batch_sampler:
                pending.append(pool.submit(self._batch, keys))
                if len(pending) >= self.workers * self.prefetch:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=384, help="arrays in the dataset")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the data")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or a pool of threads")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the arrays are (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="numpy_augment_infer_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"arrays_{args.size}"
    if not (folder / "done").exists():
        write_arrays(folder, args.size)

    torch.manual_seed(args.seed)
    dataset = Arrays(folder)
    if args.worker_kind == "thread" and args.num_workers > 0:
        loader = ThreadLoader(dataset, BatchSampler(SequentialSampler(dataset), args.batch_size, drop_last=False),
                              args.num_workers, args.prefetch_factor or 2)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).eval()

    def predict(x):
        with torch.no_grad():
            return model(x).argmax(1)

    advice = None
    if args.placer_advice or args.placer_target:
        import placer.stream
        advised = placer.stream.advise_loader(loader, predict, batches=20, budget_s=60, epochs=args.epochs,
                                              target=args.placer_target)
        print(advised)
        loader = advised.loader()
        torch.set_num_threads(advised.recommended.settings.torch_threads)
        advice = {**advised.recommended.settings.as_dict(), "seconds": round(advised.seconds, 2),
                  "claimed_speedup": round(advised.speedup, 3),
                  "change": advised.change,
                  "cache": bool(advised.cache is not None and advised.cache.recommended)}

    digest = hashlib.blake2b(digest_size=16)
    counts = np.zeros(10, dtype=np.int64)
    samples, first_batch_s = 0, None
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for x in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            counts += np.bincount(predict(x).numpy(), minlength=10)
            samples += len(x)
        print(f"pass {epoch}: predicted classes {counts.tolist()}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "numpy_augment_infer", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": int(counts @ np.arange(1, 11)),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
