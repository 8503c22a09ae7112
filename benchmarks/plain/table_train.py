"""Train an MLP on rows of a CSV file, each row parsed with pandas in ``__getitem__``.

An ordinary tabular script: the CSV is read once with ``pandas.read_csv``; the
``Dataset`` takes one row with ``df.iloc[i]`` and turns it into features (a parsed
date, a one-hot city, scaled numbers, a count of tags) the way such scripts often
do, one row at a time in Python. The CSV is written to ``--data-dir`` on the first run.

    python benchmarks/plain/table_train.py --num-workers 2 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CITIES = [f"city_{k:02d}" for k in range(24)]
NUMERIC = [f"x{k}" for k in range(8)]


def write_csv(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    days = rng.integers(0, 3 * 365, n)
    df = pd.DataFrame({
        "id": np.arange(n),
        "date": [(datetime.date(2022, 1, 1) + datetime.timedelta(days=int(d))).isoformat() for d in days],
        "city": rng.choice(CITIES, n),
        **{c: rng.normal(k, 1 + k, n).round(4) for k, c in enumerate(NUMERIC)},
        "tags": [";".join(rng.choice(list("abcdefgh"), rng.integers(0, 6))) for _ in range(n)],
    })
    df["target"] = (df["x0"] * 0.5 - df["x3"] * 0.1 + (days % 7) * 0.2 + rng.normal(0, 0.1, n)).round(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(path)


class CsvRows(Dataset):
    def __init__(self, path: Path):
        self.df = pd.read_csv(path)
        self.mean = self.df[NUMERIC].mean()
        self.std = self.df[NUMERIC].std()
        self.city_index = {c: k for k, c in enumerate(CITIES)}

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        row = self.df.iloc[i]
        date = datetime.date.fromisoformat(row["date"])
        weekday = np.zeros(7, dtype=np.float32)
        weekday[date.weekday()] = 1.0
        month = np.zeros(12, dtype=np.float32)
        month[date.month - 1] = 1.0
        city = np.zeros(len(CITIES), dtype=np.float32)
        city[self.city_index[row["city"]]] = 1.0
        numbers = ((row[NUMERIC] - self.mean) / self.std).to_numpy(dtype=np.float32)
        tags = row["tags"] if isinstance(row["tags"], str) else ""
        extra = np.array([len(tags.split(";")) if tags else 0, date.day / 31.0], dtype=np.float32)
        x = np.concatenate([weekday, month, city, numbers, extra])
        return torch.from_numpy(x), torch.tensor(row["target"], dtype=torch.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=3072, help="rows in the CSV")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--data-dir", default=None, help="where the CSV is (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="table_train_")
        args.data_dir = tmp
    path = Path(args.data_dir) / f"table_{args.size}.csv"
    if not path.exists():
        write_csv(path, args.size)

    torch.manual_seed(args.seed)
    dataset = CsvRows(path)
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed), num_workers=args.num_workers,
                              prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed), num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    features = dataset[0][0].numel()
    model = nn.Sequential(nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train_step(batch):
        x, y = batch
        loss = nn.functional.mse_loss(model(x).squeeze(1), y)
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
        print(f"epoch {epoch}: mse {total / len(dataset):.4f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "table_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
