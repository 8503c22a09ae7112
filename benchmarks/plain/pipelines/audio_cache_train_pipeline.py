"""``audio_cache_train.py`` as a placer pipeline: the script's clips and CNN, its decode and augmentation apart.

The script's ``--cache`` keeps each clip's spectrogram (its deterministic decode)
and augments it anew every time. Here the two are the stream's two parts: the
source returns a DataLoader over the spectrograms (``Clips.features``, the clips
in the script's epoch order: ``EpochShuffle`` at the epoch it is called for), so
``StreamConfig(cache="spectrograms")`` keeps them by sample as ``--cache`` does;
the per-batch ``augment`` stage (random) runs the script's ``Clips.__getitem__`` on
a copy of the dataset whose cache holds the batch's spectrograms, which is the
script's augmentation, seeded by sample and epoch. The ``train`` step is the
script's Adam step on its CNN. The clips are written to ``data_dir`` on the first
build, as the script writes them (a folder kept between runs when ``data_dir`` is None).

    placer advise benchmarks/plain/pipelines/audio_cache_train_pipeline.py --size 256 -p epochs=4

May import: torch, placer, the script ``audio_cache_train`` (its folder is put on ``sys.path``).
"""

from __future__ import annotations

import copy
import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402

from audio_cache_train import Clips, EpochShuffle, make_model, write_clips  # noqa: E402
from placer import Pipeline  # noqa: E402


class Spectrograms(Dataset):
    """The clips' spectrograms by index, each with its index (the augmentation is seeded by it)."""

    def __init__(self, clips: Clips):
        self.clips = clips

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, index):
        return self.clips.features(index), index


def _clips(size: int, data_dir: str | None) -> Clips:
    folder = Path(data_dir or Path(tempfile.gettempdir()) / "placer-plain") / f"clips_{size}"
    if not (folder / "done").exists():
        write_clips(folder, size)
    return Clips(folder)


def _spectrograms(clips, batch_info, batch_size: int, seed: int):
    order = EpochShuffle(len(clips), seed)
    order.set_epoch(batch_info.epoch)
    return DataLoader(Spectrograms(clips), batch_size=batch_size, sampler=[i for i, _ in order], num_workers=0)


def _augment(spectrograms, clips, batch_info):
    mels, indices = (np.asarray(v) for v in spectrograms)
    view = copy.copy(clips)
    view.cache = dict(zip(indices.tolist(), mels))
    return default_collate([view[(i, batch_info.epoch)] for i in indices.tolist()])


def _init(seed: int):
    torch.manual_seed(seed)
    model = make_model()
    return {"model": model, "opt": torch.optim.Adam(model.parameters(), lr=2e-3), "losses": [],
            "digest": hashlib.blake2b(digest_size=16)}


def _train(augment, state, device):
    x, y = augment
    state["digest"].update(x.numpy().tobytes())  # the script's loop digests every batch it reads
    state["digest"].update(y.numpy().tobytes())
    loss = nn.functional.cross_entropy(state["model"](x), y)
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["losses"].append(loss.item())


def build(size: int | None = None, *, epochs: int = 4, batch_size: int = 32, data_dir: str | None = None,
          seed: int = 0) -> Pipeline:
    """The script's stream on ``size`` clips (default 256, as the script's ``--size``)."""
    n = 256 if size is None else int(size)
    p = Pipeline("audio_cache_train", size=n, size_unit="clips")
    p.add(name="clips", kind="other", cpu=_clips, pin="cpu", params={"size": n, "data_dir": data_dir},
          doc="The script's Clips dataset (WAV files; silence trimmed, log-mel spectrogram, augmentation).")
    p.source("spectrograms", kind="preprocessing", epochs=epochs, batch_size=batch_size,
             params={"batch_size": batch_size, "seed": seed})(_spectrograms)
    p.stage("augment", kind="preprocessing", device="cpu", random=True)(_augment)
    p.step("train", init=lambda device: _init(seed))(_train)
    return p
