"""Classify documents with a small embedding model: a Python tokenizer and vocabulary, then inference.

An ordinary text script: a corpus file of one document per line, a vocabulary
built once (words, then word pieces for the rest, WordPiece style), a ``Dataset``
that lowercases, splits and maps each document to ids in ``__getitem__`` (pure
Python: it holds the GIL), dict batches (``input_ids``, ``length``) and a model
that embeds, pools and classifies under ``torch.no_grad()``. The corpus is
written to ``--data-dir`` on the first run.

    python benchmarks/plain/text_infer.py --num-workers 2

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and a checksum of the predictions.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, default_collate

MAX_LEN = 256
TOKEN = re.compile(r"\w+|[^\w\s]")


def write_corpus(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    stems = ["".join(rng.choice(letters, rng.integers(2, 6))) for _ in range(600)]
    ends = ["", "s", "ed", "ing", "er", "ly", "ness", "tion"]
    lines = []
    for _ in range(n):
        words = []
        for _ in range(rng.integers(80, 220)):
            w = stems[int(rng.zipf(1.3)) % len(stems)] + ends[rng.integers(0, len(ends))]
            words.append(w.capitalize() if rng.random() < 0.1 else w)
            if rng.random() < 0.08:
                words.append(rng.choice([",", ".", ";", "!"]))
        lines.append(" ".join(words))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


class Tokenizer:
    """Words in the vocabulary stay whole; others split greedily into the longest known pieces."""

    def __init__(self, texts, size: int = 2000):
        counts = collections.Counter(w for t in texts for w in TOKEN.findall(t.lower()))
        self.itos = ["<pad>", "<unk>"] + [w for w, _ in counts.most_common(size)]
        pieces = {w[:k] for w in counts for k in range(1, min(len(w), 4) + 1)}
        pieces |= {"##" + w[k:] for w in counts for k in range(1, len(w)) if len(w) - k <= 4}
        self.itos += sorted(pieces - set(self.itos))
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def pieces(self, word: str) -> list[int]:
        if word in self.stoi:
            return [self.stoi[word]]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.stoi:
                    out.append(self.stoi[piece])
                    break
                end -= 1
            else:
                return [1]
            start = end
        return out

    def encode(self, text: str) -> list[int]:
        return [i for w in TOKEN.findall(text.lower()) for i in self.pieces(w)]


class Documents(Dataset):
    def __init__(self, path: Path, tokenizer: Tokenizer):
        self.lines = path.read_text().splitlines()
        self.tok = tokenizer

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        ids = self.tok.encode(self.lines[i])[:MAX_LEN]
        length = len(ids)
        ids = ids + [0] * (MAX_LEN - length)
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "length": length}


class ThreadLoader:
    """Batches built by a pool of threads, in order."""

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


class Classifier(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, ids, length):
        pooled = self.embed(ids).sum(1) / length.clamp(min=1).unsqueeze(1)
        return self.head(pooled)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="documents in the corpus")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the corpus")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or a pool of threads")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the corpus is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="text_infer_")
        args.data_dir = tmp
    path = Path(args.data_dir) / f"corpus_{args.size}.txt"
    if not path.exists():
        write_corpus(path, args.size)

    torch.manual_seed(args.seed)
    lines = path.read_text().splitlines()
    tokenizer = Tokenizer(lines[:1000])
    dataset = Documents(path, tokenizer)
    if args.worker_kind == "thread" and args.num_workers > 0:
        loader = ThreadLoader(dataset, BatchSampler(SequentialSampler(dataset), args.batch_size, drop_last=False),
                              args.num_workers, args.prefetch_factor or 2)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = Classifier(len(tokenizer.itos)).eval()

    def predict(batch):
        with torch.no_grad():
            return model(batch["input_ids"], batch["length"]).argmax(1)

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
    counts = np.zeros(5, dtype=np.int64)
    samples, first_batch_s = 0, None
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for batch in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(batch["input_ids"].numpy().tobytes())
            counts += np.bincount(predict(batch).numpy(), minlength=5)
            samples += len(batch["length"])
        print(f"pass {epoch}: predicted classes {counts.tolist()}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "text_infer", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": int(counts @ np.arange(1, 6)),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
