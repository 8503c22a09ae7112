"""Train a small CNN on PNG and JPEG files decoded with PIL, with random crops and flips in numpy.

An ordinary training script: a folder of image files, a ``Dataset`` that opens,
decodes, resizes and augments one image in ``__getitem__``, a ``DataLoader``, a
CNN and an SGD loop over several epochs. The images are drawn (stripes whose
angle is the class, plus noise) and written to ``--data-dir`` on the first run.

Augmentation is random but seeded per sample and epoch (the sampler hands each
index with its epoch), so every loader setting trains on the same batches.

    python benchmarks/plain/images_train.py --num-workers 2 --prefetch-factor 4 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, default_collate

CLASSES = 8


def write_images(folder: Path, n: int, size: int = 128) -> None:
    """Draw ``n`` striped images (half PNG, half JPEG); the file name holds the class."""
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    for i in range(n):
        rng = np.random.default_rng(i)
        label = i % CLASSES
        angle = np.pi * label / CLASSES
        wave = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / 4.0 + rng.uniform(0, 6.28))
        rgb = np.stack([wave * rng.uniform(0.5, 1.0) for _ in range(3)], axis=-1)
        rgb = (rgb + rng.normal(0, 0.3, rgb.shape)) * 60 + 128
        img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))
        ext = "png" if i % 2 == 0 else "jpg"
        img.save(folder / f"img_{i:05d}_c{label}.{ext}", quality=90)
    (folder / "done").write_text(str(n))


class ImageFolder(Dataset):
    def __init__(self, folder: Path, crop: int = 64):
        self.files = sorted(p for p in folder.iterdir() if p.suffix in (".png", ".jpg"))
        self.crop = crop
        self.mean = np.array([0.5, 0.5, 0.5], dtype=np.float32)
        self.std = np.array([0.25, 0.25, 0.25], dtype=np.float32)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, key):
        index, epoch = key
        path = self.files[index]
        label = int(path.stem.split("_c")[-1])
        with Image.open(path) as im:
            im = im.convert("RGB").resize((self.crop + 8, self.crop + 8), Image.BILINEAR)
            x = np.asarray(im, dtype=np.float32) / 255.0
        rng = np.random.default_rng([index, epoch])
        top, left = rng.integers(0, 9, size=2)
        x = x[top:top + self.crop, left:left + self.crop]
        if rng.random() < 0.5:
            x = x[:, ::-1]
        x = x * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)
        x = (x - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), label


class EpochShuffle(Sampler):
    """A new order every epoch; each index comes with its epoch (to seed its augmentation)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter([(i, self.epoch) for i in torch.randperm(self.n, generator=g).tolist()])


class ThreadLoader:
    """Batches built by a pool of threads (PIL and numpy release the GIL), in order."""

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


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512, help="images in the dataset")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or a pool of threads")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the images are (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="images_train_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"images_{args.size}"
    if not (folder / "done").exists():
        write_images(folder, args.size)

    torch.manual_seed(args.seed)
    dataset = ImageFolder(folder)
    sampler = EpochShuffle(len(dataset), args.seed)
    if args.worker_kind == "thread" and args.num_workers > 0:
        loader = ThreadLoader(dataset, BatchSampler(sampler, args.batch_size, drop_last=False),
                              args.num_workers, args.prefetch_factor or 2)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def train_step(batch):
        x, y = batch
        loss = loss_fn(model(x), y)
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
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            losses.append(train_step((x, y)).item())
            samples += len(y)
        print(f"epoch {epoch}: loss {np.mean(losses[-len(loader):]):.4f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "images_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{losses[-1]:.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
