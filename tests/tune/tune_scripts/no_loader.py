"""Builds a DataLoader for later but trains on a plain list of batches."""

import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(64, 4))
loader = DataLoader(data, batch_size=8)
batches = [torch.randn(8, 4) for _ in range(8)]
model = torch.nn.Linear(4, 1)
for x in batches:
    model(x).sum().backward()
print("done")
