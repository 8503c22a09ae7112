"""Train a small CNN on webdataset-style tar shards: ``key.jpg`` and ``key.cls`` members, a map-style index over them.

An ordinary script in the shape of a webdataset dataset read by position (as
``wids``' indexed shards do): a few ``.tar`` shards whose samples are pairs of
members sharing a key (``000123.jpg``, ``000123.cls``), as ``webdataset``'s
``ShardWriter`` writes them. The ``Dataset`` lists every shard's members once
with ``tarfile`` and keeps, per sample, the shard and the offsets of its two
members; ``__getitem__`` seeks into the shard, reads the JPEG's bytes, decodes
them with PIL, resizes, crops and flips (seeded by the sample's index, so every
loader setting reads the same batches). The shards are written to
``--data-dir`` on the first run.

    python benchmarks/judge/tar_shards_train.py --num-workers 2

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
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

CLASSES = 8
SIDE = 64
CROP = 56


def write_shards(folder: Path, n: int, shards: int) -> None:
    """``n`` samples in ``shards`` tar files (``shard-000000.tar`` ...), written to a folder renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    per = -(-n // shards)
    for s in range(shards):
        with tarfile.open(tmp / f"shard-{s:06d}.tar", "w") as tar:
            for i in range(s * per, min(n, (s + 1) * per)):
                rng = np.random.default_rng(i)
                label = i % CLASSES
                h, w = int(rng.integers(72, 128)), int(rng.integers(72, 128))
                yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
                angle = np.pi * label / CLASSES
                wave = np.sin(2 * np.pi * 6 * (xx * np.cos(angle) + yy * np.sin(angle)))
                rgb = 128 + 80 * wave[..., None] * rng.uniform(0.5, 1.0, 3) + rng.normal(0, 12, (h, w, 3))
                buf = io.BytesIO()
                Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
                for name, data in ((f"{i:06d}.jpg", buf.getvalue()), (f"{i:06d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, folder)


class TarShards(Dataset):
    """Samples of webdataset shards by position: (shard, offset and size of the .jpg, of the .cls)."""

    def __init__(self, folder: Path, seed: int = 0):
        self.shards = sorted(folder.glob("shard-*.tar"))
        self.samples = []
        for s, path in enumerate(self.shards):
            members: dict[str, dict[str, tuple[int, int]]] = {}
            with tarfile.open(path) as tar:
                for m in tar.getmembers():
                    key, _, ext = m.name.partition(".")
                    members.setdefault(key, {})[ext] = (m.offset_data, m.size)
            for key in sorted(members):
                self.samples.append((s, members[key]["jpg"], members[key]["cls"]))
        self.seed = seed

    def __len__(self):
        return len(self.samples)

    def read(self, shard: int, where: tuple[int, int]) -> bytes:
        with open(self.shards[shard], "rb") as f:
            f.seek(where[0])
            return f.read(where[1])

    def __getitem__(self, index):
        shard, jpg, cls = self.samples[index]
        img = Image.open(io.BytesIO(self.read(shard, jpg))).convert("RGB")
        label = int(self.read(shard, cls).decode())
        img = img.resize((SIDE, SIDE), Image.BILINEAR)
        rng = np.random.default_rng([self.seed, index])
        top, left = (int(v) for v in rng.integers(0, SIDE - CROP + 1, 2))
        x = np.asarray(img, dtype=np.float32)[top:top + CROP, left:left + CROP] / 127.5 - 1.0
        if rng.random() < 0.5:
            x = x[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), label


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 12, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(12, 24, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(24, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1280, help="samples in the shards")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the shards are (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="tar_shards_train_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"shards_{args.size}_{args.shards}"
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        write_shards(folder, args.size, args.shards)

    torch.manual_seed(args.seed)
    dataset = TarShards(folder, seed=args.seed)
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
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)

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
    print(json.dumps({"script": "tar_shards_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
