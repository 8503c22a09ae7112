"""ETL feeding a model: transactions → clean → group-by and join → train → evaluate.

Models the common "dataframe work, then a small model" job. A table of ``size``
card transactions (default 400,000; columns user id, amount, hour, category;
5 % of amounts missing, some wild outliers) and a table of ``size // 50`` users
(id, age, tenure, region, and whether they churned; in shuffled order) arrive on
the host. Then:

* ``clean`` (row-wise): missing amounts become 0 with a flag, outliers are
  clipped, amounts are log-scaled, night-time transactions are flagged. On the
  CPU it is declared ``data_parallel``: the executor splits the rows into
  partitions and computes them with dask's threaded scheduler.
* ``features`` (group-by, then join): per-user count, mean and spread of the log
  amount, missing and night rates and category shares, joined onto the users
  table by user id and standardised. On the CPU the table is cut into row
  partitions, each partition is grouped by ``dask.delayed`` tasks on dask's
  threaded scheduler, and the partial sums are added; on a GPU the same sums are
  ``index_add_`` calls.
* ``train``: a 20-64-1 MLP predicting churn, full-batch gradient descent on the
  first 80 % of users; ``evaluate``: log-loss and churn probabilities on the rest.

Tables are float64 matrices with named column positions (the ``T_*``, ``U_*``,
``C_*`` constants), so partitions split along rows and move to a GPU as tensors.
Aggregates are float64 on every device, so partition order does not change the
result beyond :mod:`placer.digest`'s tolerance.

May import: numpy, placer; torch and dask inside the stage functions.
"""

from __future__ import annotations

import numpy as np

from placer import Pipeline

DEFAULT_SIZE = 400_000
CATEGORIES = 8
REGIONS = 5
#: rows per partition of the CPU group-by
PARTITION_ROWS = 65_536
# transactions: user, amount, hour, category
T_USER, T_AMOUNT, T_HOUR, T_CATEGORY = range(4)
# users: id, age, tenure, region, churned
U_ID, U_AGE, U_TENURE, U_REGION, U_CHURN = range(5)
# cleaned transactions: user, log amount, missing, night, category
C_USER, C_LOG, C_MISSING, C_NIGHT, C_CATEGORY = range(5)
#: per user: count, mean, std, missing and night rates, category shares, age, tenure, region one-hot
FEATURES = 5 + CATEGORIES + 2 + REGIONS


def n_users(size: int) -> int:
    """Users in a table of ``size`` transactions."""
    return max(20, size // 50)


def _user_params(users: int, seed: int):
    rng = np.random.default_rng(seed + 100)
    spend = rng.normal(3.0, 0.7, users)
    night = rng.beta(1.0, 6.0, users)
    age = rng.integers(18, 80, users).astype(np.float64)
    tenure = rng.exponential(3.0, users)
    region = rng.integers(0, REGIONS, users).astype(np.float64)
    logit = 1.5 * (spend - 3.0) - 4.0 * (night - 0.14) - 0.3 * (tenure - 3.0) + rng.normal(0, 0.5, users)
    churned = (logit > 0).astype(np.float64)
    return spend, night, age, tenure, region, churned


def _transactions(size: int, seed: int):
    users = n_users(size)
    spend, night, *_ = _user_params(users, seed)
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, size)
    amount = rng.lognormal(spend[user], 0.8)
    amount[rng.random(size) < 0.005] *= 1000.0
    amount[rng.random(size) < 0.05] = np.nan
    hour = np.where(rng.random(size) < night[user], rng.integers(0, 6, size), rng.integers(6, 24, size))
    category = rng.integers(0, CATEGORIES, size)
    return np.stack([user, amount, hour, category], 1).astype(np.float64)


def _users(size: int, seed: int):
    users = n_users(size)
    _, _, age, tenure, region, churned = _user_params(users, seed)
    table = np.stack([np.arange(users), age, tenure, region, churned], 1).astype(np.float64)
    return table[np.random.default_rng(seed + 200).permutation(users)]


def _clean_cpu(transactions, clip: float):
    amount = transactions[:, T_AMOUNT]
    missing = np.isnan(amount)
    log_amount = np.log1p(np.minimum(np.where(missing, 0.0, amount), clip))
    night = transactions[:, T_HOUR] < 6
    return np.stack([transactions[:, T_USER], log_amount, missing, night, transactions[:, T_CATEGORY]], 1)


def _clean_gpu(transactions, clip: float, device):
    import torch

    amount = transactions[:, T_AMOUNT]
    missing = torch.isnan(amount)
    log_amount = torch.log1p(torch.clamp(torch.where(missing, 0.0, amount), max=clip))
    night = transactions[:, T_HOUR] < 6
    return torch.stack([transactions[:, T_USER], log_amount, missing.to(amount.dtype), night.to(amount.dtype),
                        transactions[:, T_CATEGORY]], 1)


def _partial_sums(part: np.ndarray, users: int) -> np.ndarray:
    """Per-user sums over one partition: count, Σlog, Σlog², missing, night, per category."""
    uid = part[:, C_USER].astype(np.int64)
    log_amount = part[:, C_LOG]
    present = 1.0 - part[:, C_MISSING]
    cols = [np.bincount(uid, minlength=users).astype(np.float64),
            np.bincount(uid, present * log_amount, minlength=users),
            np.bincount(uid, present * log_amount**2, minlength=users),
            np.bincount(uid, part[:, C_MISSING], minlength=users),
            np.bincount(uid, part[:, C_NIGHT], minlength=users)]
    cat = part[:, C_CATEGORY].astype(np.int64)
    shares = np.bincount(uid * CATEGORIES + cat, minlength=users * CATEGORIES).reshape(users, CATEGORIES)
    return np.concatenate([np.stack(cols, 1), shares.astype(np.float64)], 1)


def _group_cpu(clean: np.ndarray, users: int) -> np.ndarray:
    import dask

    bounds = list(range(0, clean.shape[0], PARTITION_ROWS)) + [clean.shape[0]]
    parts = [dask.delayed(_partial_sums, pure=True)(clean[a:b], users) for a, b in zip(bounds, bounds[1:])]
    total = dask.delayed(sum)(parts)
    return total.compute(scheduler="threads")


def _group_gpu(clean, users: int):
    import torch

    uid = clean[:, C_USER].to(torch.int64)
    log_amount = clean[:, C_LOG]
    present = 1.0 - clean[:, C_MISSING]
    vals = torch.stack([torch.ones_like(log_amount), present * log_amount, present * log_amount**2,
                        clean[:, C_MISSING], clean[:, C_NIGHT]], 1)
    sums = torch.zeros(users, 5, dtype=clean.dtype, device=clean.device).index_add_(0, uid, vals)
    cat = uid * CATEGORIES + clean[:, C_CATEGORY].to(torch.int64)
    shares = torch.zeros(users * CATEGORIES, dtype=clean.dtype, device=clean.device)
    shares.index_add_(0, cat, torch.ones_like(log_amount))
    return torch.cat([sums, shares.reshape(users, CATEGORIES)], 1)


def _f64(xp, a):
    return a.astype(np.float64) if xp is np else a.to(xp.float64)


def _join(xp, sums, users):
    """Per-user features joined onto the users table by id, standardised; and labels.

    ``xp`` is ``numpy`` or ``torch``: the same expressions run on either.
    """
    count = sums[:, 0]
    present = count - sums[:, 3]
    present = xp.where(present > 1.0, present, 1.0)
    mean = sums[:, 1] / present
    var = sums[:, 2] / present - mean**2
    std = xp.sqrt(xp.where(var > 0.0, var, 0.0))
    safe = xp.where(count > 1.0, count, 1.0)
    per_user = [count, mean, std, sums[:, 3] / safe, sums[:, 4] / safe]
    per_user += [sums[:, 5 + c] / safe for c in range(CATEGORIES)]
    per_user = xp.stack(per_user, 1)
    ids = users[:, U_ID].astype(np.int64) if xp is np else users[:, U_ID].to(xp.int64)
    joined = per_user[ids]  # the join: each users row picks its aggregates by id
    onehot = [_f64(xp, users[:, U_REGION] == r) for r in range(REGIONS)]
    x = xp.concatenate([joined, users[:, U_AGE : U_TENURE + 1], xp.stack(onehot, 1)], 1)
    mu = x.mean(0)
    sd = xp.sqrt(((x - mu) ** 2).mean(0))
    sd = xp.where(sd > 0.0, sd, 1.0)
    return (x - mu) / sd, users[:, U_CHURN]


def _features_cpu(clean, users):
    sums = _group_cpu(clean, users.shape[0])
    x, y = _join(np, sums, users)
    return {"x": x.astype(np.float32), "y": y.astype(np.float32)}


def _features_gpu(clean, users, device):
    import torch

    sums = _group_gpu(clean, users.shape[0])
    x, y = _join(torch, sums, users)
    return {"x": x.to(torch.float32), "y": y.to(torch.float32)}


def _train(features, device, epochs: int, lr: float, seed: int):
    import torch
    import torch.nn.functional as F

    x, y = features["x"], features["y"]
    n_train = max(1, int(0.8 * x.shape[0]))
    g = torch.Generator().manual_seed(seed)
    d = x.shape[1]
    params = {"w1": torch.randn(d, 64, generator=g) / d**0.5, "b1": torch.zeros(64),
              "w2": torch.randn(64, generator=g) / 8.0, "b2": torch.zeros(())}
    params = {k: v.to(x.device).requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.SGD(params.values(), lr=lr, momentum=0.9)
    for _ in range(epochs):
        logits = torch.relu(x[:n_train] @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
        loss = F.binary_cross_entropy_with_logits(logits, y[:n_train])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in params.items()}


def _evaluate(features, train, device):
    import torch
    import torch.nn.functional as F

    x, y = features["x"], features["y"]
    n_train = max(1, int(0.8 * x.shape[0]))
    logits = torch.relu(x[n_train:] @ train["w1"] + train["b1"]) @ train["w2"] + train["b2"]
    return {"log_loss": F.binary_cross_entropy_with_logits(logits, y[n_train:]),
            "churn_prob": torch.sigmoid(logits)}


def build(size: int | None = None, *, clip: float = 5000.0, epochs: int = 100, lr: float = 0.1,
          seed: int = 0) -> Pipeline:
    """The ETL pipeline over ``size`` transactions (default 400,000)."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"etl_dask pipeline: size (transactions) must be at least 1, got {n}")
    p = Pipeline("etl_dask", size=n, size_unit="transactions")
    p.add(name="transactions", kind="other", cpu=_transactions, pin="cpu", params={"size": n, "seed": seed},
          doc="Card transactions (user, amount, hour, category) with gaps and outliers, on the host.")
    p.add(name="users", kind="other", cpu=_users, pin="cpu", params={"size": n, "seed": seed},
          doc="Users table (id, age, tenure, region, churned), shuffled.")
    p.add(name="clean", kind="cleaning", cpu=_clean_cpu, gpu=_clean_gpu, inputs=["transactions"],
          params={"clip": clip}, data_parallel=True,
          doc="Fill and flag missing amounts, clip, log-scale, flag night hours.")
    p.add(name="features", kind="cleaning", cpu=_features_cpu, gpu=_features_gpu, inputs=["clean", "users"],
          doc="Group by user (dask partitions on the CPU), join onto users, standardise.")
    p.add(name="train", kind="training", fn=_train, inputs=["features"],
          params={"epochs": epochs, "lr": lr, "seed": seed},
          doc="Full-batch gradient descent of a 20-64-1 churn MLP.")
    p.add(name="evaluate", kind="inference", fn=_evaluate, inputs=["features", "train"],
          doc="Log-loss and churn probabilities of held-out users.")
    return p
