"""Run a residual CNN over a folder of small images stored as one ``.npy``: inference bound by the model, not the data.

An ordinary batch-inference script in the shape of the "evaluate a trained
classifier over a test set" examples (``model.eval()``, ``torch.inference_mode``,
a ``DataLoader`` over a light dataset): the images sit in one ``uint8`` ``.npy``
array loaded once; ``__getitem__`` only converts one image to float and normalises
it, while the model (a small ResNet: a stem and three stages of two residual
blocks each, 32-128 channels, on 32x32 images) costs far more per batch. The
loop should never wait for data. The array is written to ``--data-dir`` on the
first run.

    python benchmarks/judge/model_bound_infer.py --threads 2

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and a checksum of the predictions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CLASSES = 10
MEAN = np.array([0.49, 0.48, 0.45], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.25, 0.24, 0.26], dtype=np.float32).reshape(3, 1, 1)


def write_array(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npy")
    np.save(tmp, images)
    tmp.replace(path)


class TestImages(Dataset):
    def __init__(self, path: Path):
        self.images = np.load(path)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i].astype(np.float32).transpose(2, 0, 1) / 255.0
        return torch.from_numpy((x - MEAN) / STD), i


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, widths=(32, 64, 128)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for k, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if k == 0 else 2), BasicBlock(w, w)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, CLASSES)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=768, help="images in the array")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the images")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the array is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="model_bound_infer_")
        args.data_dir = tmp
    path = Path(args.data_dir) / f"test_images_{args.size}.npy"
    if not path.exists():
        write_array(path, args.size)

    torch.manual_seed(args.seed)
    dataset = TestImages(path)
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers,
                              prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = ResNet().eval()

    def predict(batch):
        x, _ = batch
        with torch.inference_mode():
            return model(x).argmax(1)

    advice = None
    if args.placer_advice or args.placer_target:
        import placer.stream
        advised = placer.stream.advise_loader(loader, predict, batches=20, budget_s=60, device="cpu",
                                              epochs=args.epochs, target=args.placer_target)
        print(advised)
        loader = advised.loader()
        torch.set_num_threads(advised.recommended.settings.torch_threads)
        advice = {**advised.recommended.settings.as_dict(), "seconds": round(advised.seconds, 2),
                  "claimed_speedup": round(advised.speedup, 3),
                  "change": advised.change,
                  "cache": bool(advised.cache is not None and advised.cache.recommended)}

    digest = hashlib.blake2b(digest_size=16)
    counts = np.zeros(CLASSES, dtype=np.int64)
    checksum, samples, first_batch_s = 0, 0, None
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for x, idx in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(idx.numpy().tobytes())
            pred = predict((x, idx))
            counts += np.bincount(pred.numpy(), minlength=CLASSES)
            checksum += int((pred * (idx + 1)).sum())
            samples += len(idx)
        print(f"pass {epoch}: predicted classes {counts.tolist()}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "model_bound_infer", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": checksum,
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
