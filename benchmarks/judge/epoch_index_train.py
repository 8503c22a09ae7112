"""Train a CNN on a packed record file, its random crops seeded by ``(epoch, index)`` keys from a custom ``Sampler``.

An ordinary script in the shape of the reproducible-augmentation recipes (a
``Sampler`` with ``set_epoch``, as ``DistributedSampler`` has, that yields keys
instead of bare indices; a ``Dataset`` whose ``__getitem__(key)`` seeds its
augmentation from the key, so that a sample's crop depends on its epoch and index
and not on which worker drew it). The data is one packed record file of JPEGs with
an offset index beside it (as RecordIO / ``.rec`` + ``.idx`` files hold them); the
``Dataset`` does the deterministic part first (read the record, decode it, resize
its shorter side, normalise) and the random part last (a crop and a flip seeded
by ``(seed, epoch, index)``). The sampler draws a new order each epoch. The record
file is written to ``--data-dir`` on the first run.

    python benchmarks/judge/epoch_index_train.py --num-workers 2 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

CLASSES = 5
SHORT_SIDE, CROP = 48, 40


def write_records(folder: Path, n: int) -> None:
    """``data.rec`` (JPEG records back to back) and ``data.idx`` (offset, length, label each), renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    index = []
    with open(tmp / "data.rec", "wb") as rec:
        for i in range(n):
            rng = np.random.default_rng(i)
            label = i % CLASSES
            h, w = int(rng.integers(64, 120)), int(rng.integers(64, 120))
            yy, xx = np.mgrid[0:h, 0:w]
            blobs = np.zeros((h, w))
            for _ in range(label + 1):
                cy, cx = rng.uniform(0, h), rng.uniform(0, w)
                blobs += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * (min(h, w) / 10) ** 2))
            img = 60 + 150 * blobs[..., None] * rng.uniform(0.6, 1.0, 3) + rng.normal(0, 10, (h, w, 3))
            buf = io.BytesIO()
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=88)
            index.append((rec.tell(), len(buf.getvalue()), label))
            rec.write(buf.getvalue())
    (tmp / "data.idx").write_text("\n".join(f"{o}\t{n_}\t{y}" for o, n_, y in index) + "\n")
    os.replace(tmp, folder)


class EpochIndexSampler(Sampler):
    """A new order each epoch (``set_epoch``); yields ``(epoch, index)`` keys."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + 1000 * self.epoch)
        for i in torch.randperm(self.n, generator=g).tolist():
            yield self.epoch, i


class RecordFile(Dataset):
    def __init__(self, folder: Path, seed: int = 0):
        self.path = folder / "data.rec"
        rows = [line.split("\t") for line in (folder / "data.idx").read_text().splitlines()]
        self.index = [(int(o), int(n), int(y)) for o, n, y in rows]
        self.seed = seed

    def __len__(self):
        return len(self.index)

    def decode(self, i: int) -> np.ndarray:
        """The deterministic part: read the record, decode, resize the shorter side, normalise."""
        offset, length, _ = self.index[i]
        with open(self.path, "rb") as f:
            f.seek(offset)
            img = Image.open(io.BytesIO(f.read(length))).convert("RGB")
        scale = SHORT_SIDE / min(img.size)
        img = img.resize((max(SHORT_SIDE, round(img.width * scale)), max(SHORT_SIDE, round(img.height * scale))),
                         Image.BILINEAR)
        x = np.asarray(img, dtype=np.float32) / 255.0
        return ((x - x.mean((0, 1))) / (x.std((0, 1)) + 1e-5)).transpose(2, 0, 1)

    def __getitem__(self, key):
        epoch, i = key
        x = self.decode(i)
        rng = np.random.default_rng([self.seed, epoch, i])
        top = int(rng.integers(0, x.shape[1] - CROP + 1))
        left = int(rng.integers(0, x.shape[2] - CROP + 1))
        x = x[:, top:top + CROP, left:left + CROP]
        if rng.random() < 0.5:
            x = x[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(x)), self.index[i][2]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 24, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(24, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=640, help="records in the file")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the record file is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="epoch_index_train_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"records_{args.size}"
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        write_records(folder, args.size)

    torch.manual_seed(args.seed)
    dataset = RecordFile(folder, seed=args.seed)
    sampler = EpochIndexSampler(len(dataset), seed=args.seed)
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                              prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

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
        sampler.set_epoch(epoch)
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
    print(json.dumps({"script": "epoch_index_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
