"""``table_train.py`` as a placer pipeline: the script's CSV Dataset and MLP, its loop as a stream.

A one-shot stage builds the script's DataLoader as written (``CsvRows``, batches of
``batch_size``, shuffled by a generator seeded with ``seed``, no workers); the source
returns that same loader every epoch, so its generator draws each epoch's order as
the script's does. placer replaces its workers with the plan's (DataLoader worker
processes: the script's ``--num-workers``). The ``train`` step is the script's Adam
step on its MLP. The CSV is written to ``data_dir`` on the first build, as the script
writes it (a folder kept between runs when ``data_dir`` is None).

    placer advise benchmarks/plain/pipelines/table_train_pipeline.py --size 3072 -p epochs=2

May import: torch, placer, the script ``table_train`` (its folder is put on ``sys.path``).
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from placer import Pipeline  # noqa: E402
from table_train import CITIES, NUMERIC, CsvRows, write_csv  # noqa: E402


def _loader(size: int, data_dir: str | None, batch_size: int, seed: int) -> DataLoader:
    path = Path(data_dir or Path(tempfile.gettempdir()) / "placer-plain") / f"table_{size}.csv"
    if not path.exists():
        write_csv(path, size)
    return DataLoader(CsvRows(path), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed), num_workers=0)


def _rows(loader):
    return loader


def _init(features: int, seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))
    return {"model": model, "opt": torch.optim.Adam(model.parameters(), lr=1e-3), "losses": [],
            "digest": hashlib.blake2b(digest_size=16)}


def _train(rows, state, device):
    x, y = rows
    state["digest"].update(x.numpy().tobytes())  # the script's loop digests every batch it reads
    state["digest"].update(y.numpy().tobytes())
    loss = nn.functional.mse_loss(state["model"](x).squeeze(1), y)
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["losses"].append(loss.item())


def build(size: int | None = None, *, epochs: int = 2, batch_size: int = 64, data_dir: str | None = None,
          seed: int = 0) -> Pipeline:
    """The script's stream on ``size`` rows (default 3,072, as the script's ``--size``)."""
    n = 3072 if size is None else int(size)
    p = Pipeline("table_train", size=n, size_unit="rows")
    p.add(name="loader", kind="other", cpu=_loader, pin="cpu",
          params={"size": n, "data_dir": data_dir, "batch_size": batch_size, "seed": seed},
          doc="The script's DataLoader over its CsvRows (each row parsed with pandas in __getitem__).")
    p.source("rows", epochs=epochs, batch_size=batch_size)(_rows)
    # the width of CsvRows's features: a weekday, a month and a city one-hot, the numbers, tags and day
    features = 7 + 12 + len(CITIES) + len(NUMERIC) + 2
    p.step("train", init=lambda device: _init(features, seed))(_train)
    return p
