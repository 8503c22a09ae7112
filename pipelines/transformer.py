"""A small transformer language model: load tokens → train (attention and MLP blocks) → evaluate.

Models a matmul-bound training job, the kind that runs on a GPU's tensor cores in a lower
precision: ``size`` sequences of ``seq`` tokens form one training batch; a decoder of
``layers`` pre-norm blocks (causal self-attention written as matrix products, and a GELU
MLP of ``4 × d_model``) predicts each next token; ``steps`` steps of SGD with momentum
train it on that batch, and a held-out quarter as many sequences is scored.

Nearly all of a step's floating-point work is matrix products (the projections, the
attention scores and their weighted sums, the MLP and the output layer, forward and
backward), so its predicted time on a GPU depends on the precision the products run in:
At the defaults (``d_model`` 1024, 256-token sequences) the products are large enough that a
step is matmul-bound on a GPU. ``train`` and ``evaluate`` allow ``tf32`` and ``bf16`` (``precision=("tf32", "bf16")``),
each checked against fp32 here before a plan may choose it (``train`` compares the loss of
each step, ``evaluate`` its outputs). Nothing runs in a lower precision unless a plan
chooses it or ``--precision`` fixes it, so every placement gives the same outputs in fp32.

The tokens follow a seeded random Markov chain (each token's successor drawn from a few
likely ones), so the model has something to learn. Everything is seeded.

May import: numpy, placer; torch inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 64
#: what the training and inference stages may run in (each checked for accuracy first)
PRECISIONS = ("tf32", "bf16")


def _load(size: int, seq: int, vocab: int, seed: int):
    """``size`` training and ``max(1, size // 4)`` held-out sequences of ``seq + 1`` tokens (int64)."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, (vocab, 4))
    n = size + max(1, size // 4)
    toks = np.empty((n, seq + 1), dtype=np.int64)
    toks[:, 0] = rng.integers(0, vocab, n)
    pick = rng.integers(0, 4, (n, seq))
    noise = rng.random((n, seq)) < 0.1
    rand = rng.integers(0, vocab, (n, seq))
    for t in range(seq):
        nxt = successors[toks[:, t], pick[:, t]]
        toks[:, t + 1] = np.where(noise[:, t], rand[:, t], nxt)
    return {"train": toks[:size], "held_out": toks[size:]}


def model(vocab: int, d_model: int, heads: int, layers: int, seq: int, seed: int):
    """A seeded decoder-only transformer (created on the CPU)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

        def forward(self, x, mask):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-2, -1)) * (d // heads) ** -0.5
            att = torch.softmax(scores.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
            x = x + self.out((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Parameter(torch.zeros(seq, d_model))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), persistent=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos[: tokens.shape[1]]
            for blk in self.blocks:
                x = blk(x, self.mask)
            return self.head(self.ln(x))

    torch.manual_seed(seed)  # nn's own initialisation, seeded; the global state is restored below
    return LM()


def _train(load, device, *, seq: int, vocab: int, d_model: int, heads: int, layers: int, steps: int,
           lr: float, seed: int):
    import torch
    import torch.nn.functional as F

    state = torch.random.get_rng_state()
    try:
        lm = model(vocab, d_model, heads, layers, seq, seed).to(device)
    finally:
        torch.random.set_rng_state(state)
    toks = torch.as_tensor(load["train"]).to(device)
    x, y = toks[:, :-1], toks[:, 1:]
    opt = torch.optim.SGD(lm.parameters(), lr=lr, momentum=0.9)
    losses = []
    lm.train()
    for _ in range(steps):
        logits = lm(x)
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach().to(torch.float64))
    lm.eval()
    return {"model": {k: v.detach().float() for k, v in lm.state_dict().items()},
            "losses": torch.stack(losses) if losses else torch.zeros(0, dtype=torch.float64, device=device)}


def _evaluate(load, train, device, *, seq: int, vocab: int, d_model: int, heads: int, layers: int, seed: int):
    import torch
    import torch.nn.functional as F

    state = torch.random.get_rng_state()
    try:
        lm = model(vocab, d_model, heads, layers, seq, seed)
    finally:
        torch.random.set_rng_state(state)
    lm.load_state_dict({k: v.cpu() for k, v in train["model"].items()})
    lm = lm.to(device).eval()
    toks = torch.as_tensor(load["held_out"]).to(device)
    with torch.no_grad():
        logits = lm(toks[:, :-1]).float()
        target = toks[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1)).to(torch.float64)
        p_true = torch.softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return {"loss": loss, "p_true": p_true.mean(0).to(torch.float64)}


def build(size: int | None = None, *, seq: int = 256, vocab: int = 4096, d_model: int = 1024, heads: int = 16,
          layers: int = 2, steps: int = 2, lr: float = 0.05, seed: int = 0) -> Pipeline:
    """The transformer pipeline: ``size`` sequences per training batch (default 64).

    The defaults are a realistic model width and context (``d_model`` 1024 in 16 heads,
    sequences of 256 tokens, a 4096-token vocabulary), at which a training step is
    matmul-bound on a GPU; only the depth (2 blocks) is kept small, since every block
    does the same work. On a 2-core CPU one step of one sequence takes seconds: tests pass
    smaller ``d_model``, ``seq`` and ``vocab``."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"transformer pipeline: size (sequences) must be at least 1, got {n}")
    if d_model % heads:
        raise ValueError(f"transformer pipeline: d_model ({d_model}) must be a multiple of heads ({heads})")
    arch = {"seq": seq, "vocab": vocab, "d_model": d_model, "heads": heads, "layers": layers, "seed": seed}
    p = Pipeline("transformer", size=n, size_unit="sequences")
    p.add(name="load", kind="other", cpu=_load, pin="cpu", params={"size": n, "seq": seq, "vocab": vocab, "seed": seed},
          doc="Seeded Markov-chain token sequences, on the host.")
    p.add(name="train", kind="training", fn=_train, inputs=["load"], precision=PRECISIONS,
          params={**arch, "steps": steps, "lr": lr},
          doc=f"{steps} SGD steps of a {layers}-block transformer (d={d_model}) on one batch.")
    p.add(name="evaluate", kind="inference", fn=_evaluate, inputs=["load", "train"], precision=PRECISIONS,
          params=arch, doc="Held-out cross-entropy and true-token probability per position.")
    return p
