"""Each item needs a slow decode that depends on its index alone (a wait on storage and some numpy work),
then a random gain drawn from torch's global generator (an augmentation), and the loop reads the dataset
over several epochs: the decode's output may be kept inside the Dataset, and pays from the second epoch.

With ``--random`` the slow work itself draws from torch's global generator (noise added as it is read),
so no part of it may be kept. Prints a JSON line with the digest of every batch it read.
"""

import argparse
import hashlib
import json
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Clips(Dataset):
    def __init__(self, n: int, noisy: bool):
        self.n, self.noisy = n, noisy

    def __len__(self):
        return self.n

    def decode(self, i):
        time.sleep(0.003)
        x = np.random.default_rng(i).standard_normal(4096).astype(np.float32)
        spectrum = np.abs(np.fft.rfft(x.reshape(16, 256), axis=1))
        return np.log1p(spectrum[:, :8]).ravel()

    def decode_with_noise(self, i):
        time.sleep(0.003)
        return torch.randn(128) + i

    def __getitem__(self, i):
        x = self.decode_with_noise(i) if self.noisy else torch.from_numpy(self.decode(i))
        return x * (1 + 0.1 * torch.rand(())), i


def make(dataset, seed):
    return DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed))


ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=4)
ap.add_argument("--random", action="store_true")
ap.add_argument("--rebuild", action="store_true", help="build the loader again each epoch, and a validation one")
args = ap.parse_args()
torch.manual_seed(0)
train = Clips(64, args.random)
loader = make(train, 3)
model = torch.nn.Linear(128, 1)
digest = hashlib.sha256()
for epoch in range(args.epochs):
    if args.rebuild:
        loader = make(train, 3 + epoch)
    for x, idx in loader:
        digest.update(x.numpy().tobytes() + idx.numpy().tobytes())
        model(x).sum().backward()
    if args.rebuild:
        for x, idx in make(Clips(16, args.random), 0):
            digest.update(x.numpy().tobytes())
print(json.dumps({"digest": digest.hexdigest()}))
