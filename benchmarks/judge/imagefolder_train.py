"""Train a small CNN on a folder of JPEG/PNG files, one folder per class, the torchvision classification way.

An ordinary image-classification script in the shape of torchvision's classification
reference (``references/classification/train.py``): an ``ImageFolder``-like dataset
(``root/<class>/<file>``, classes sorted, samples as ``(path, class_index)``), an
image opened and decoded with PIL in ``__getitem__``, a ``RandomResizedCrop`` and a
horizontal flip (written here, without torchvision), ``ToTensor`` and ``Normalize``,
a CNN trained with SGD, momentum and weight decay and a step learning-rate schedule.
The crop and the flip draw from a generator seeded by the sample's index, so every
loader setting reads the same batches. The images (sizes vary) are written to
``--data-dir`` on the first run.

    python benchmarks/judge/imagefolder_train.py --num-workers 2 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

CLASSES = ["circle", "square", "stripes", "dots", "cross"]
CROP = 48
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def write_images(root: Path, n: int) -> None:
    """``n`` images of varying size in ``root/<class>/``, JPEG and PNG, written to a folder renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    for c in CLASSES:
        (tmp / c).mkdir()
    for i in range(n):
        rng = np.random.default_rng(i)
        label = i % len(CLASSES)
        h, w = int(rng.integers(96, 176)), int(rng.integers(96, 176))
        yy, xx = np.mgrid[0:h, 0:w]
        cy, cx = h / 2 + rng.normal(0, 6), w / 2 + rng.normal(0, 6)
        if label == 0:
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 < (min(h, w) / 3) ** 2
        elif label == 1:
            mask = (abs(yy - cy) < h / 4) & (abs(xx - cx) < w / 4)
        elif label == 2:
            mask = (xx // 6) % 2 == 0
        elif label == 3:
            mask = ((yy // 8) % 2 == 0) & ((xx // 8) % 2 == 0)
        else:
            mask = (abs(yy - cy) < 5) | (abs(xx - cx) < 5)
        color = rng.integers(60, 256, 3)
        img = rng.normal(40, 20, (h, w, 3)) + mask[..., None] * color
        ext = "jpg" if i % 3 else "png"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(tmp / CLASSES[label] / f"img_{i:05d}.{ext}")
    os.replace(tmp, root)


def pil_loader(path: Path) -> Image.Image:
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class ImageFolderLike(Dataset):
    """``root/<class>/<image>`` as torchvision's ImageFolder lists it: classes sorted, samples sorted."""

    def __init__(self, root: Path, train: bool = True, seed: int = 0):
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.class_to_idx = {c: k for k, c in enumerate(self.classes)}
        self.samples = [(p, self.class_to_idx[c]) for c in self.classes for p in sorted((root / c).iterdir())
                        if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
        self.train = train
        self.seed = seed

    def __len__(self):
        return len(self.samples)

    def random_resized_crop(self, img: Image.Image, rng: random.Random, size: int = CROP,
                            scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> Image.Image:
        """torchvision's RandomResizedCrop: ten tries at an area and aspect ratio, else a centre crop."""
        width, height = img.size
        area = width * height
        log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = rng.randint(0, height - h)
                left = rng.randint(0, width - w)
                return img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return img.resize((size, size), Image.BILINEAR, box=(left, top, left + side, top + side))

    def __getitem__(self, index):
        path, target = self.samples[index]
        img = pil_loader(path)
        rng = random.Random(self.seed * 1_000_003 + index)
        img = self.random_resized_crop(img, rng)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(x.transpose(2, 0, 1).copy()), target


def make_model(classes: int) -> nn.Module:
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(block(3, 16), nn.MaxPool2d(2), block(16, 32), nn.MaxPool2d(2), block(32, 32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=640, help="images in the folder")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the image folder is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="imagefolder_train_")
        args.data_dir = tmp
    root = Path(args.data_dir) / f"imagefolder_{args.size}"
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        write_images(root, args.size)

    torch.manual_seed(args.seed)
    dataset = ImageFolderLike(root, train=True, seed=args.seed)
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
    model = make_model(len(dataset.classes))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, args.epochs // 2 + 1), gamma=0.1)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    def train_step(batch):
        x, y = batch
        loss = criterion(model(x), y)
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
        model.train()
        total = 0.0
        for x, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            loss = train_step((x, y))
            total += loss.item() * len(y)
            samples += len(y)
        sched.step()
        print(f"epoch {epoch}: loss {total / len(dataset):.4f} lr {sched.get_last_lr()[0]:.4g}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "imagefolder_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
