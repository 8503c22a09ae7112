"""``images_train.py`` as a placer pipeline: the script's Dataset, sampler and CNN, its loop as a stream.

The source returns the script's DataLoader as written (``ImageFolder``, batches of
``batch_size``, the epoch-shuffling sampler, no workers), set to the epoch it is
called for; placer replaces its workers with the plan's (DataLoader worker
processes: the script's ``--num-workers``). The ``train`` step is the script's
SGD step on its CNN. The images are written to ``data_dir`` on the first build,
as the script writes them (a folder kept between runs when ``data_dir`` is None).

    placer advise benchmarks/plain/pipelines/images_train_pipeline.py --size 512 -p epochs=2

May import: torch, placer, the script ``images_train`` (its folder is put on ``sys.path``).
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

from images_train import EpochShuffle, ImageFolder, make_model, write_images  # noqa: E402
from placer import Pipeline  # noqa: E402


def _images(size: int, data_dir: str | None) -> ImageFolder:
    folder = Path(data_dir or Path(tempfile.gettempdir()) / "placer-plain") / f"images_{size}"
    if not (folder / "done").exists():
        write_images(folder, size)
    return ImageFolder(folder)


def _batches(images, batch_info, batch_size: int, seed: int):
    sampler = EpochShuffle(len(images), seed)
    sampler.set_epoch(batch_info.epoch)
    return DataLoader(images, batch_size=batch_size, sampler=sampler, num_workers=0)


def _init(seed: int):
    torch.manual_seed(seed)
    model = make_model()
    model.train()
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), "losses": [],
            "digest": hashlib.blake2b(digest_size=16)}


def _train(batches, state, device):
    x, y = batches
    state["digest"].update(x.numpy().tobytes())  # the script's loop digests every batch it reads
    state["digest"].update(y.numpy().tobytes())
    loss = nn.functional.cross_entropy(state["model"](x), y)
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["losses"].append(loss.item())


def build(size: int | None = None, *, epochs: int = 2, batch_size: int = 32, data_dir: str | None = None,
          seed: int = 0) -> Pipeline:
    """The script's stream on ``size`` images (default 512, as the script's ``--size``)."""
    n = 512 if size is None else int(size)
    p = Pipeline("images_train", size=n, size_unit="images")
    p.add(name="images", kind="other", cpu=_images, pin="cpu", params={"size": n, "data_dir": data_dir},
          doc="The script's ImageFolder (PNG and JPEG files, decoded and augmented per sample).")
    p.source("batches", epochs=epochs, batch_size=batch_size,
             params={"batch_size": batch_size, "seed": seed})(_batches)
    p.step("train", init=lambda device: _init(seed))(_train)
    return p
