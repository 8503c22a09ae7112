"""Classify reviews with a tiny transformer encoder: a Hugging-Face-style tokenising ``map`` and a padding collator.

An ordinary inference script in the shape of the Hugging Face ``datasets`` +
``transformers`` examples, in pure Python: the data is a list of dict examples
(``{"text": ..., "label": ...}``, read from a JSON-lines file), a ``tokenize``
function applied to each example as ``Dataset.with_transform`` applies it (in
``__getitem__``; a WordPiece-style tokenizer: lower-casing, punctuation split,
greedy longest-match subwords, ``[CLS]``/``[SEP]``, truncation), and a collate
function that pads each batch to its longest example as
``DataCollatorWithPadding`` does, returning a dict of ``input_ids``,
``attention_mask`` and ``labels``. The model (an embedding, a two-layer
``nn.TransformerEncoder``, a classifier on ``[CLS]``) runs in eval mode under
``torch.no_grad``. The reviews are written to ``--data-dir`` on the first run.

    python benchmarks/judge/hf_map_infer.py --num-workers 2

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and a checksum of the predictions.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import unicodedata
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WORDS = ("the a this that movie film plot actor actress scene story ending music camera director script "
         "great terrible wonderful boring brilliant awful touching predictable stunning weak charming "
         "overlong beautifully poorly surprisingly utterly quite really never always again").split()
MAX_LENGTH = 128


def write_reviews(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        words = rng.choice(WORDS, int(rng.integers(8, 90)))
        text = " ".join(w + ("," if rng.random() < 0.1 else "") for w in words).capitalize() + "!"
        if rng.random() < 0.3:
            text += f" Rated {int(rng.integers(1, 11))}/10 -- (seen {int(rng.integers(1990, 2024))})."
        lines.append(json.dumps({"idx": i, "text": text, "label": int("great" in words or "brilliant" in words)}))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


class WordPieceTokenizer:
    """Lower-case, split on spaces and punctuation, then greedy longest-match subwords (``##`` continuations)."""

    def __init__(self, texts: list[str], vocab_size: int = 400):
        counts = collections.Counter(w for t in texts for w in self.pre_tokenize(t))
        pieces = collections.Counter()
        for w, c in counts.items():
            for k in range(1, len(w) + 1):
                pieces[w[:k]] += c
                if k > 1:
                    pieces["##" + w[k - 1:]] += c
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        chars = sorted({ch for w in counts for ch in w} | {"##" + ch for w in counts for ch in w})
        rest = [p for p, _ in pieces.most_common() if p not in chars][:vocab_size]
        self.vocab = {p: k for k, p in enumerate(specials + chars + rest)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = 0, 1, 2, 3

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        """BERT's basic tokenizer, character by character: drop control characters, lower-case, strip accents,
        split on whitespace and on every punctuation character."""
        words, current = [], []
        for ch in unicodedata.normalize("NFD", text.lower()):
            cat = unicodedata.category(ch)
            if ch == "\ufffd" or (cat.startswith("C") and ch not in "\t\n\r") or cat == "Mn":
                continue
            if ch.isspace():
                if current:
                    words.append("".join(current))
                    current = []
            elif cat.startswith("P") or (33 <= ord(ch) <= 47 or 58 <= ord(ch) <= 64):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
        return words

    def word_pieces(self, word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk_id]
            start = end
        return ids

    def __call__(self, text: str, truncation: bool = True, max_length: int = MAX_LENGTH) -> dict:
        ids = [self.cls_id]
        for w in self.pre_tokenize(text):
            ids += self.word_pieces(w)
        ids = ids[:max_length - 1] if truncation else ids
        ids.append(self.sep_id)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


class ExamplesDataset(Dataset):
    """A list of dict examples with a transform applied on access (``datasets.Dataset.with_transform``)."""

    def __init__(self, examples: list[dict], transform=None):
        self.examples, self.transform = examples, transform

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        example = self.examples[i]
        return self.transform(example) if self.transform else example


class PadCollator:
    """Pad to the batch's longest example (``DataCollatorWithPadding``), returning a dict of tensors."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for k, f in enumerate(features):
            ids[k, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[k, :len(f["attention_mask"])] = 1
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.tensor([f["labels"] for f in features])}


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, layers: int = 2, classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.position = nn.Embedding(MAX_LENGTH, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.encoder(self.embed(input_ids) + self.position(pos), src_key_padding_mask=attention_mask == 0)
        return self.head(h[:, 0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048, help="reviews in the file")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the reviews")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the reviews are (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="hf_map_infer_")
        args.data_dir = tmp
    path = Path(args.data_dir) / f"reviews_{args.size}.jsonl"
    if not path.exists():
        write_reviews(path, args.size)

    torch.manual_seed(args.seed)
    examples = [json.loads(line) for line in path.read_text().splitlines()]
    tokenizer = WordPieceTokenizer([e["text"] for e in examples[:500]])

    def tokenize(example):
        enc = tokenizer(example["text"], truncation=True, max_length=MAX_LENGTH)
        return {**enc, "labels": example["label"]}

    dataset = ExamplesDataset(examples, transform=tokenize)
    collate = PadCollator(tokenizer.pad_id)
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, collate_fn=collate,
                              num_workers=args.num_workers, prefetch_factor=args.prefetch_factor or 2,
                              pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collate, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = TinyEncoder(len(tokenizer.vocab)).eval()

    def predict(batch):
        with torch.no_grad():
            return model(batch["input_ids"], batch["attention_mask"]).argmax(1)

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
    correct, checksum = 0, 0
    samples, first_batch_s = 0, None
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for batch in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(batch["input_ids"].numpy().tobytes())
            digest.update(batch["attention_mask"].numpy().tobytes())
            digest.update(batch["labels"].numpy().tobytes())
            pred = predict(batch)
            correct += int((pred == batch["labels"]).sum())
            checksum += int((pred * (torch.arange(len(pred)) + samples + 1)).sum())
            samples += len(pred)
        print(f"pass {epoch}: agreement with labels {correct / samples:.3f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "hf_map_infer", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": checksum,
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
