"""Train on a training split and validate on a held-out split each epoch (two DataLoaders)."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def main(epochs=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 16, generator=g)
    y = (x.sum(1) > 0).float()
    train, val = random_split(TensorDataset(x, y), [3584, 512], generator=g)
    train_loader = DataLoader(train, batch_size=16, shuffle=True)
    val_loader = DataLoader(val, batch_size=256)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        for xb, yb in train_loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb).squeeze(1), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            correct = sum(((model(xb).squeeze(1) > 0).float() == yb).sum().item() for xb, yb in val_loader)
        print(f"epoch {epoch}: val accuracy {correct / len(val):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
