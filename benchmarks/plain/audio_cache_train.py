"""Train a keyword classifier on WAV clips: an expensive, deterministic decode to log-mel features, several epochs.

An ordinary audio script: a folder of 16-bit WAV files, a ``Dataset`` that reads
one clip, trims its silence frame by frame, computes a log-mel spectrogram with
numpy's FFT and then applies a cheap random augmentation (a time shift and a
frequency mask, seeded per sample and epoch: the sampler hands each index with
its epoch). The spectrogram depends only on the file, so ``--cache`` keeps it in
a dict inside the dataset (each worker process keeps its own dict); the
augmentation runs every time. The clips are written to ``--data-dir`` on the first run.

    python benchmarks/plain/audio_cache_train.py --cache --epochs 4

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import shutil
import tempfile
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, default_collate

RATE = 16000
CLASSES = 6
N_FFT, HOP, MELS = 512, 128, 40


def write_clips(folder: Path, n: int) -> None:
    """``n`` one-second clips: a chirp whose pitch depends on the class, noise, silence around it."""
    folder.mkdir(parents=True, exist_ok=True)
    t = np.arange(RATE) / RATE
    for i in range(n):
        rng = np.random.default_rng(i)
        label = i % CLASSES
        f0 = 200 + 150 * label
        on, off = rng.integers(1000, 4000), rng.integers(12000, 15000)
        tone = np.sin(2 * np.pi * (f0 + 300 * t) * t) * (t * RATE > on) * (t * RATE < off)
        x = 0.5 * tone + rng.normal(0, 0.02, RATE)
        with wave.open(str(folder / f"clip_{i:05d}_k{label}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    (folder / "done").write_text(str(n))


def mel_filters(n_fft: int = N_FFT, mels: int = MELS) -> np.ndarray:
    def to_mel(f):
        return 2595 * np.log10(1 + f / 700)

    edges = 700 * (10 ** (np.linspace(to_mel(0), to_mel(RATE / 2), mels + 2) / 2595) - 1)
    bins = np.fft.rfftfreq(n_fft, 1 / RATE)
    fb = np.zeros((mels, len(bins)), dtype=np.float32)
    for m in range(mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        fb[m] = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    return fb


class Clips(Dataset):
    def __init__(self, folder: Path, cache: bool = False, frames: int = 96):
        self.files = sorted(folder.glob("*.wav"))
        self.fb = mel_filters()
        self.window = np.hanning(N_FFT).astype(np.float32)
        self.frames = frames
        self.cache = {} if cache else None

    def __len__(self):
        return len(self.files)

    def features(self, index: int) -> np.ndarray:
        """The clip's log-mel spectrogram (frames x mels), silence trimmed: depends on the file only."""
        with wave.open(str(self.files[index]), "rb") as w:
            x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
        x = np.append(x[0], x[1:] - 0.97 * x[:-1])  # pre-emphasis
        # trim silence: frames of 10 ms whose energy is under a threshold, one by one
        energies = [float(np.mean(x[s:s + 160] ** 2)) for s in range(0, len(x) - 160, 160)]
        loud = [k for k, e in enumerate(energies) if e > 1e-3]
        if loud:
            x = x[loud[0] * 160:(loud[-1] + 1) * 160]
        size = N_FFT + HOP // 2 * (2 * self.frames - 1)
        x = np.pad(x, (0, max(0, size - len(x))))[:size]
        starts = range(0, size - N_FFT + 1, HOP // 2)
        frames = np.stack([x[s:s + N_FFT] * self.window for s in starts])
        power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
        mel = np.log(power @ self.fb.T + 1e-6)
        mel = mel.reshape(self.frames, 2, MELS).mean(1)  # two half-hops per frame
        return ((mel - mel.mean()) / (mel.std() + 1e-5)).astype(np.float32)

    def __getitem__(self, key):
        index, epoch = key
        if self.cache is not None and index in self.cache:
            mel = self.cache[index]
        else:
            mel = self.features(index)
            if self.cache is not None:
                self.cache[index] = mel
        rng = np.random.default_rng([index, epoch])
        mel = np.roll(mel, int(rng.integers(-8, 9)), axis=0)
        lo = int(rng.integers(0, MELS - 6))
        mel = mel.copy()
        mel[:, lo:lo + int(rng.integers(0, 6))] = 0.0
        label = int(self.files[index].stem.split("_k")[-1])
        return torch.from_numpy(mel).unsqueeze(0), label


class EpochShuffle(Sampler):
    """A new order every epoch; each index comes with its epoch (to seed its augmentation)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter([(i, self.epoch) for i in torch.randperm(self.n, generator=g).tolist()])


class ThreadLoader:
    """Batches built by a pool of threads (numpy's FFT releases the GIL), in order."""

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


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((4, 4)),
        nn.Flatten(), nn.Linear(256, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256, help="clips in the dataset")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or a pool of threads")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--cache", action="store_true", help="keep each clip's spectrogram after its first decode")
    ap.add_argument("--data-dir", default=None, help="where the clips are (written on the first run)")
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
        tmp = tempfile.mkdtemp(prefix="audio_cache_train_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"clips_{args.size}"
    if not (folder / "done").exists():
        write_clips(folder, args.size)

    torch.manual_seed(args.seed)
    dataset = Clips(folder, cache=args.cache)
    sampler = EpochShuffle(len(dataset), args.seed)
    if args.worker_kind == "thread" and args.num_workers > 0:
        loader = ThreadLoader(dataset, BatchSampler(sampler, args.batch_size, drop_last=False),
                              args.num_workers, args.prefetch_factor or 2)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

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
    samples, first_batch_s, losses = 0, None, []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            losses.append(train_step((x, y)).item())
            samples += len(y)
        print(f"epoch {epoch}: loss {np.mean(losses[-len(loader):]):.4f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "audio_cache_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{losses[-1]:.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
