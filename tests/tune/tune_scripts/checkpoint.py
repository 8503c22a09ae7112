"""Train, then save a checkpoint; skips the checkpoint while placer tune measures the script."""

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

out = sys.argv[1]
data = TensorDataset(torch.arange(640, dtype=torch.float32).reshape(-1, 1))
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
for (x,) in DataLoader(data, batch_size=8):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if os.environ.get("PLACER_TUNING") != "1":
    torch.save(model.state_dict(), out)
