"""A small trainer class that builds its own DataLoader, as training frameworks do."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """Samples that take a few milliseconds each to produce (a decode that waits on I/O)."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((8,), float(i)), torch.tensor(float(i % 3))


class Trainer:
    def __init__(self, model, batch_size=8):
        self.model, self.batch_size = model, batch_size
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def train_dataloader(self):
        return DataLoader(Slow(), batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(3))

    def fit(self, epochs):
        loader = self.train_dataloader()
        for _ in range(epochs):
            for x, y in loader:
                loss = (self.model(x).squeeze(1) - y).pow(2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
        return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    print("final loss", Trainer(nn.Linear(8, 1)).fit(epochs=2))
