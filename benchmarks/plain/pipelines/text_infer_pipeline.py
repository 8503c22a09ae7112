"""``text_infer.py`` as a placer pipeline: the script's tokenizer, Dataset and classifier, its loop as a stream.

A one-shot stage reads the corpus and builds the script's vocabulary and
``Documents`` (tokenised in ``__getitem__``, pure Python); the source returns the
script's DataLoader as written (in order, no workers), whose workers placer replaces
with the plan's (DataLoader worker processes: the script's ``--num-workers``). The
``predict`` step is the script's inference, its model made (seeded as the script
seeds it) on the first batch, since it needs the vocabulary's size; it counts the
predicted classes. The corpus is written to ``data_dir`` on the first build, as the
script writes it (a folder kept between runs when ``data_dir`` is None).

    placer advise benchmarks/plain/pipelines/text_infer_pipeline.py --size 4096

May import: numpy, torch, placer, the script ``text_infer`` (its folder is put on ``sys.path``).
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from placer import Pipeline  # noqa: E402
from text_infer import Classifier, Documents, Tokenizer, write_corpus  # noqa: E402


def _documents(size: int, data_dir: str | None) -> Documents:
    path = Path(data_dir or Path(tempfile.gettempdir()) / "placer-plain") / f"corpus_{size}.txt"
    if not path.exists():
        write_corpus(path, size)
    return Documents(path, Tokenizer(path.read_text().splitlines()[:1000]))


def _batches(documents, batch_size: int):
    return DataLoader(documents, batch_size=batch_size, num_workers=0)


def _init():
    return {"model": None, "counts": np.zeros(5, dtype=np.int64), "digest": hashlib.blake2b(digest_size=16)}


def _predict(batches, documents, state, device, seed: int):
    if state["model"] is None:
        torch.manual_seed(seed)
        state["model"] = Classifier(len(documents.tok.itos)).eval()
    state["digest"].update(batches["input_ids"].numpy().tobytes())  # the script's loop digests every batch
    with torch.no_grad():
        classes = state["model"](batches["input_ids"], batches["length"]).argmax(1)
    state["counts"] += np.bincount(classes.numpy(), minlength=5)


def build(size: int | None = None, *, epochs: int = 1, batch_size: int = 64, data_dir: str | None = None,
          seed: int = 0) -> Pipeline:
    """The script's stream on ``size`` documents (default 4,096, as the script's ``--size``)."""
    n = 4096 if size is None else int(size)
    p = Pipeline("text_infer", size=n, size_unit="documents")
    p.add(name="documents", kind="other", cpu=_documents, pin="cpu", params={"size": n, "data_dir": data_dir},
          doc="The script's Documents: the corpus and its vocabulary (tokenised per document in __getitem__).")
    p.source("batches", epochs=epochs, batch_size=batch_size, params={"batch_size": batch_size})(_batches)
    p.step("predict", kind="inference", init=_init, params={"seed": seed})(_predict)
    return p
