"""Train and validate a CNN each epoch on a ``random_split`` of one dataset, with a ``Compose`` chain of transforms.

An ordinary script in the shape of the PyTorch "training a classifier" tutorials
that split one dataset into train and validation ``Subset``s with
``torch.utils.data.random_split`` (a seeded generator) and describe the sample's
processing as a ``transforms.Compose`` chain, written here without torchvision:
decode first (the dataset holds PNG-encoded bytes in one pickled blob file, as
some dataset archives do), convert to float, normalise, pad and crop at random,
and flip at random last. Random steps take the sample's own generator (seeded
by its index, so every loader setting reads the same batches); the validation
chain stops after normalising. Each epoch trains on the training subset
(shuffled) and then evaluates on the validation subset. The blob file is written
to ``--data-dir`` on the first run.

    python benchmarks/judge/split_compose_train.py --num-workers 2 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read (training and validation) and the final validation accuracy.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pickle
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, random_split

CLASSES = 6
SIDE = 40
MEAN, STD = 0.45, 0.25


def write_blobs(path: Path, n: int) -> None:
    """``n`` PNG-encoded 40x40 RGB images and their labels in one pickle."""
    images, labels = [], []
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    for i in range(n):
        rng = np.random.default_rng(i)
        label = i % CLASSES
        ring = np.abs(np.hypot(yy - rng.uniform(0.3, 0.7), xx - rng.uniform(0.3, 0.7)) - 0.1 - 0.05 * label) < 0.04
        img = rng.normal(90, 30, (SIDE, SIDE, 3)) + ring[..., None] * rng.integers(80, 160, 3)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "PNG")
        images.append(buf.getvalue())
        labels.append(label)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps({"data": images, "labels": labels}))
    tmp.replace(path)


class Compose:
    """``transforms.Compose``: each callable in turn, ``t(x, rng)``."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x, rng):
        for t in self.transforms:
            x = t(x, rng)
        return x


def decode_png(blob, rng):
    return np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))


def to_float(img, rng):
    return img.astype(np.float32).transpose(2, 0, 1) / 255.0


def normalize(x, rng):
    return (x - MEAN) / STD


class RandomCrop:
    def __init__(self, size: int, padding: int):
        self.size, self.padding = size, padding

    def __call__(self, x, rng):
        x = np.pad(x, ((0, 0), (self.padding, self.padding), (self.padding, self.padding)), mode="reflect")
        top, left = (int(v) for v in rng.integers(0, x.shape[1] - self.size + 1, 2))
        return x[:, top:top + self.size, left:left + self.size]


def random_horizontal_flip(x, rng):
    return x[:, :, ::-1] if rng.random() < 0.5 else x


class Blobs(Dataset):
    def __init__(self, path: Path, seed: int = 0):
        blob = pickle.loads(path.read_bytes())
        self.data, self.labels = blob["data"], blob["labels"]
        self.seed = seed
        self.train_transform = Compose([decode_png, to_float, normalize, RandomCrop(36, 4), random_horizontal_flip])
        self.val_transform = Compose([decode_png, to_float, normalize, lambda x, rng: x[:, 2:38, 2:38]])
        self.train = True

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        rng = np.random.default_rng([self.seed, index])
        transform = self.train_transform if self.train else self.val_transform
        x = transform(self.data[index], rng)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), self.labels[index]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 9 * 9, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1600, help="images in the blob file")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--val-fraction", type=float, default=0.2)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the blob file is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="split_compose_train_")
        args.data_dir = tmp
    path = Path(args.data_dir) / f"blobs_{args.size}.pkl"
    if not path.exists():
        write_blobs(path, args.size)

    torch.manual_seed(args.seed)
    full = Blobs(path, seed=args.seed)
    val_full = Blobs(path, seed=args.seed)
    val_full.train = False
    n_val = int(len(full) * args.val_fraction)
    train_set, val_indices = random_split(full, [len(full) - n_val, n_val],
                                          generator=torch.Generator().manual_seed(args.seed))
    val_set = torch.utils.data.Subset(val_full, val_indices.indices)

    def make_loader(dataset, shuffle):
        # the shuffle's generator sits on the sampler: a DataLoader draws its workers' base seed from its own
        # generator at every pass (once in all with persistent workers), which would reorder later epochs
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(args.seed)) if shuffle else None
        if args.worker_kind == "thread" and args.num_workers > 0:
            from placer.stream import ThreadLoader

            return ThreadLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                num_workers=args.num_workers,
                                prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
        return DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                          num_workers=args.num_workers,
                          prefetch_factor=args.prefetch_factor if args.num_workers else None,
                          persistent_workers=args.persistent_workers and args.num_workers > 0,
                          pin_memory=args.pin_memory)

    loader = make_loader(train_set, shuffle=True)
    val_loader = make_loader(val_set, shuffle=False)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

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
    samples, first_batch_s, accuracy = 0, None, 0.0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for x, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            total += train_step((x, y)).item() * len(y)
            samples += len(y)
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                digest.update(x.numpy().tobytes())
                digest.update(y.numpy().tobytes())
                correct += int((model(x).argmax(1) == y).sum())
                samples += len(y)
        accuracy = correct / len(val_set)
        print(f"epoch {epoch}: train loss {total / len(train_set):.4f} val accuracy {accuracy:.3f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "split_compose_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": round(accuracy, 4),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
