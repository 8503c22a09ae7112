"""Train a small conv classifier on WAV clips recorded at mixed sample rates: resample, then ``torch.stft``, per clip.

An ordinary audio script in the shape of the torchaudio speech-commands tutorial
(load a clip, resample it to 16 kHz, a spectrogram, a small CNN, a few epochs),
without torchaudio: the clips are 16-bit WAV files at 8, 22.05, 32 and 44.1 kHz,
read with ``wave``; ``__getitem__`` mixes stereo down, resamples to 16 kHz by
linear interpolation (``np.interp``), pads or trims to one second, takes the
magnitude of ``torch.stft`` (Hann window) and its log, and normalises it. Every
step depends on the file only, so every loader setting reads the same batches.
The clips are written to ``--data-dir`` on the first run.

    python benchmarks/judge/audio_stft_train.py --num-workers 2 --persistent-workers

The last line of output is JSON: seconds, samples, samples/s, the digest of
every batch the loop read and the final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
import wave
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

TARGET_RATE = 16000
RATES = [8000, 22050, 32000, 44100]
CLASSES = 10
N_FFT, HOP = 400, 160


def write_clips(folder: Path, n: int) -> None:
    """``n`` clips of about a second, rate and channels varying, renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    for i in range(n):
        rng = np.random.default_rng(i)
        label, rate = i % CLASSES, RATES[int(rng.integers(0, len(RATES)))]
        channels = 1 + int(rng.random() < 0.3)
        length = int(rate * rng.uniform(0.8, 1.2))
        t = np.arange(length) / rate
        f0 = 180 + 90 * label
        x = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in (1, 2, 3)) * np.exp(-3 * t) * 0.4
        x = np.stack([x + rng.normal(0, 0.01, length) for _ in range(channels)], axis=1)
        with wave.open(str(tmp / f"{i:05d}_{label}.wav"), "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    os.replace(tmp, folder)


def load_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        rate, channels = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    return x.reshape(-1, channels).T, rate


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return x
    n = int(round(x.shape[-1] * target / rate))
    t_new = np.arange(n) * (rate / target)
    return np.stack([np.interp(t_new, np.arange(x.shape[-1]), ch) for ch in x]).astype(np.float32)


class SpeechClips(Dataset):
    def __init__(self, folder: Path):
        self.files = sorted(folder.glob("*.wav"))
        self.window = torch.hann_window(N_FFT)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        path = self.files[index]
        x, rate = load_wav(path)
        x = x.mean(axis=0, keepdims=True)  # to mono
        x = resample(x, rate, TARGET_RATE)[0]
        x = np.pad(x, (0, max(0, TARGET_RATE - len(x))))[:TARGET_RATE]
        spec = torch.stft(torch.from_numpy(x), N_FFT, HOP, window=self.window, return_complex=True).abs()
        spec = torch.log(spec + 1e-6)
        spec = (spec - spec.mean()) / (spec.std() + 1e-5)
        return spec.unsqueeze(0), int(path.stem.split("_")[1])


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten(), nn.Linear(128, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=320, help="clips in the folder")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--worker-kind", choices=["process", "thread"], default="process",
                    help="DataLoader worker processes, or placer's thread-pool loader (placer.stream.ThreadLoader)")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
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
        tmp = tempfile.mkdtemp(prefix="audio_stft_train_")
        args.data_dir = tmp
    folder = Path(args.data_dir) / f"speech_{args.size}"
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        write_clips(folder, args.size)

    torch.manual_seed(args.seed)
    dataset = SpeechClips(folder)
    # the shuffle's generator sits on the sampler: a DataLoader draws its workers' base seed from its own
    # generator at every pass (once in all with persistent workers), which would reorder later epochs
    shuffled = RandomSampler(dataset, generator=torch.Generator().manual_seed(args.seed))
    if args.worker_kind == "thread" and args.num_workers > 0:
        from placer.stream import ThreadLoader

        loader = ThreadLoader(dataset, batch_size=args.batch_size, sampler=shuffled,
                              num_workers=args.num_workers,
                              prefetch_factor=args.prefetch_factor or 2, pin_memory=args.pin_memory)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=shuffled,
                            num_workers=args.num_workers,
                            prefetch_factor=args.prefetch_factor if args.num_workers else None,
                            persistent_workers=args.persistent_workers and args.num_workers > 0,
                            pin_memory=args.pin_memory)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

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
        advised = placer.stream.advise_loader(loader, train_step, batches=20, budget_s=60, device="cpu",
                                              epochs=args.epochs, target=args.placer_target)
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
        print(f"epoch {epoch}: loss {total / len(dataset):.4f}", flush=True)
    seconds = time.perf_counter() - start
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"script": "audio_stft_train", "seconds": round(seconds, 4), "samples": samples,
                      "samples_per_s": round(samples / seconds, 2), "first_batch_s": round(first_batch_s, 4),
                      "digest": digest.hexdigest(), "result": float(f"{loss.item():.4g}"),
                      "threads": torch.get_num_threads(), "advice": advice}))


if __name__ == "__main__":
    main()
