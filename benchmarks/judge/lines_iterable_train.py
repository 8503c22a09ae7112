"""Train a fastText-style classifier on lines of a text file streamed by an ``IterableDataset``, sharded per worker.

An ordinary streaming script in the shape of the ``IterableDataset`` example of
torch's ``torch.utils.data`` documentation: the dataset's ``__iter__`` reads the
file line by line and asks ``get_worker_info()`` which part of it is this
worker's, so that each worker process reads its own lines. The lines are split
into blocks of ``--batch-size`` and the workers take blocks in turn (worker k
the blocks k, k + W, ...): the ``DataLoader`` takes a batch from each worker in
turn, so the batches come in the file's order whatever the number of workers.
Each line (``label<TAB>text``) is parsed, lower-cased, split into words and
word bigrams, hashed to ids; a padding ``collate_fn`` builds an ``EmbeddingBag``
input. The file is written to ``--data-dir`` on the first run.

An ``IterableDataset`` has no thread-pool form: ``--worker-kind thread`` prints
``placer.stream.ThreadLoader``'s refusal and stops.

    python benchmarks/judge/lines_iterable_train.py --num-workers 2

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

TOPICS = {
    0: "match goal team season coach league score win player transfer",
    1: "market shares bank rates inflation profit growth investors price trade",
    2: "election vote party minister parliament policy campaign law court debate",
    3: "software model chip data cloud research network device launch update",
}
COMMON = "the a of to in and for on with is was said new after over more year people time".split()
BUCKETS = 2 ** 14


def write_lines(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        label = int(rng.integers(0, len(TOPICS)))
        words = list(rng.choice(TOPICS[label].split(), int(rng.integers(3, 12))))
        words += list(rng.choice(COMMON, int(rng.integers(10, 60))))
        rng.shuffle(words)
        text = " ".join(words).capitalize() + rng.choice([".", "!", "?", "..."])
        lines.append(f"{label}\t{text}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def featurize(text: str) -> list[int]:
    words = re.findall(r"[a-z']+", text.lower())
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
    return [zlib.crc32(g.encode()) % BUCKETS for g in grams]


class LinesDataset(IterableDataset):
    """The file's lines, parsed; with worker processes, each reads its own blocks of ``block`` lines."""

    def __init__(self, path: Path, block: int):
        self.path, self.block = path, block

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        with open(self.path, encoding="utf-8") as f:
            for k, line in enumerate(f):
                if (k // self.block) % workers != worker:
                    continue
                label, _, text = line.rstrip("\n").partition("\t")
                yield featurize(text), int(label)


def collate(batch):
    """Ids of a batch concatenated, with offsets (EmbeddingBag's input), and the labels."""
    ids = [torch.tensor(x, dtype=torch.long) for x, _ in batch]
    offsets = torch.tensor([0] + [len(x) for x in ids[:-1]]).cumsum(0)
    return torch.cat(ids), offsets, torch.tensor([y for _, y in batch])


class FastText(nn.Module):
    def __init__(self, dim: int = 32, classes: int = len(TOPICS)):
        super().__init__()
        self.embed = nn.EmbeddingBag(BUCKETS, dim, mode="mean")
        self.head = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, ids, offsets):
        return self.head(self.embed(ids, offsets))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8000, help="lines in the file")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes (an IterableDataset has no thread-pool form)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the text file is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="lines_iterable_train_")
        args.data_dir = tmp
    path = Path(args.data_dir) / f"lines_{args.size}.tsv"
    if not path.exists():
        write_lines(path, args.size)

    torch.manual_seed(args.seed)
    dataset = LinesDataset(path, block=args.batch_size)
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        try:
            loader = ThreadLoader(dataset, batch_size=args.batch_size, collate_fn=collate,
                                  num_workers=args.num_workers, prefetch_factor=args.prefetch_factor or 2,
                                  pin_memory=args.pin_memory)
        except ValueError as e:
            print(f"placer.stream.ThreadLoader: {e}", file=sys.stderr)
            sys.exit(2)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collate, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = FastText()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)

    def train_step(batch):
        ids, offsets, y = batch
        loss = nn.functional.cross_entropy(model(ids, offsets), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    advice = None
    if args.placer_advice or args.placer_target:
        import placer.stream
        try:
            advised = placer.stream.advise_loader(loader, train_step, batches=20, budget_s=60, device="cpu",
                                                  epochs=args.epochs, target=args.placer_target)
        except (TypeError, ValueError, NotImplementedError) as e:
            print(f"placer.stream.advise_loader refused this loader: {e}", flush=True)
            advice = {"refused": str(e)}
        else:
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
        total, lines = 0.0, 0
        for ids, offsets, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(ids.numpy().tobytes())
            digest.update(offsets.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            loss = train_step((ids, offsets, y))
            total += loss.item() * len(y)
            lines += len(y)
            samples += len(y)
        print(f"epoch {epoch}: loss {total / lines:.4f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "lines_iterable_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
