"""A table read in CSV chunks: table → chunks → parse → clean → train an MLP step by step → evaluate.

Models training on a table too large to load at once. ``table`` writes ``size``
rows of CSV text (eight numeric columns with missing fields and outliers, a
categorical ``segment`` column with missing values, a 0/1 label) plus 512
held-out rows; each epoch the source yields chunks of ``batch`` rows as CSV text
(with the header); ``parse`` reads a chunk into arrays (missing numbers as NaN,
missing segments as −1); ``clean`` fills missing numbers with fixed column
medians, clamps outliers to fixed bounds, standardises with fixed column scales
and one-hot encodes the segment (a missing segment gets all zeros); the ``train``
step takes one SGD step of a 12-64-2 MLP per chunk; ``evaluate`` scores the
trained model on the held-out rows.

pandas is optional. With ``engine="pandas"`` (pandas installed), ``parse`` uses
``pandas.read_csv`` and the CPU ``clean`` uses DataFrame operations (``fillna``,
``clip``); with ``engine="numpy"`` (the default) both use numpy. ``clean`` also
has a torch implementation for the GPU. All of them parse numbers with correct
rounding and clean in float32 with the same operations (fill, clamp, one subtract
and one multiply per value), so every engine and device gives the same arrays bit
for bit.

May import: numpy, placer, pipelines.mnist_mlp; pandas and torch inside the stage
functions.
"""

from __future__ import annotations

import io

import numpy as np

from pipelines.mnist_mlp import evaluate_model, mlp
from placer import Pipeline

DEFAULT_SIZE = 20_000
HOLDOUT = 512
NUMERIC = 8
SEGMENTS = ("a", "b", "c", "d")
COLUMNS = [f"f{i}" for i in range(NUMERIC)] + ["segment", "label"]
FEATURES = NUMERIC + len(SEGMENTS)
#: per numeric column: the generator's centre and spread; cleaning uses them as fixed statistics
CENTRE = np.linspace(-2.0, 2.0, NUMERIC).astype(np.float32)
SPREAD = np.linspace(0.5, 4.0, NUMERIC).astype(np.float32)
LOW = CENTRE - np.float32(5.0) * SPREAD
HIGH = CENTRE + np.float32(5.0) * SPREAD
INV_SPREAD = (np.float32(1.0) / SPREAD).astype(np.float32)


# -- the table and its chunks --------------------------------------------------------------------
def _field(v: float) -> str:
    return "" if np.isnan(v) else f"{v:.4f}"


def _table(size: int, seed: int) -> dict:
    """CSV text of ``size`` training rows and of the held-out rows, each with its header."""
    rng = np.random.default_rng(seed)
    n = size + HOLDOUT
    z = rng.standard_normal((n, NUMERIC))
    seg = rng.integers(0, len(SEGMENTS), n)
    w = rng.standard_normal(NUMERIC)
    y = ((z @ w + 0.8 * (seg - 1.5) + 0.5 * rng.standard_normal(n)) > 0).astype(int)
    x = z * SPREAD + CENTRE
    x[rng.random((n, NUMERIC)) < 0.01] *= 100.0
    x[rng.random((n, NUMERIC)) < 0.05] = np.nan
    seg_text = np.array(SEGMENTS, dtype=object)[seg]
    seg_text[rng.random(n) < 0.03] = ""
    header = ",".join(COLUMNS)
    lines = [",".join([*(_field(v) for v in row), s, str(lab)]) for row, s, lab in zip(x.tolist(), seg_text, y)]
    return {"train": [header, *lines[:size]], "holdout": "\n".join([header, *lines[size:]])}


def _chunks(table, batch: int):
    header, rows = table["train"][0], table["train"][1:]
    for i in range(0, len(rows), batch):
        yield "\n".join([header, *rows[i:i + batch]])


# -- parse: CSV text → arrays --------------------------------------------------------------------
def _parse_numpy(chunks: str) -> dict:
    cells = np.array([line.split(",") for line in chunks.split("\n")[1:]], dtype=str).reshape(-1, len(COLUMNS))
    numeric = cells[:, :NUMERIC]
    x = np.where(numeric == "", "nan", numeric).astype(np.float64).astype(np.float32)
    seg = np.full(cells.shape[0], -1, dtype=np.int64)
    for code, name in enumerate(SEGMENTS):
        seg[cells[:, NUMERIC] == name] = code
    return {"x": x, "segment": seg, "y": cells[:, NUMERIC + 1].astype(np.int64)}


def _parse_pandas(chunks: str) -> dict:
    import pandas as pd

    # pandas 3 parses floats exactly by default (and deprecates the option); older ones need it
    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    df = pd.read_csv(io.StringIO(chunks), **exact,
                     dtype={"segment": "string", "label": "int64"}, keep_default_na=False, na_values={
                         **{c: [""] for c in COLUMNS[:NUMERIC]}})
    codes = pd.Categorical(df["segment"].replace("", pd.NA), categories=list(SEGMENTS)).codes
    return {"x": df[COLUMNS[:NUMERIC]].to_numpy(np.float64).astype(np.float32),
            "segment": np.asarray(codes, dtype=np.int64), "y": df["label"].to_numpy(np.int64)}


# -- clean: fill, clamp, standardise, one-hot ----------------------------------------------------
def _clean_numpy(parse) -> dict:
    x = np.where(np.isnan(parse["x"]), CENTRE, parse["x"])
    x = np.clip(x, LOW, HIGH)
    return {"x": _finish(x, parse["segment"]), "y": parse["y"]}


def _clean_pandas(parse) -> dict:
    import pandas as pd

    df = pd.DataFrame(parse["x"], columns=COLUMNS[:NUMERIC])
    df = df.fillna(dict(zip(df.columns, CENTRE.tolist())))
    df = df.clip(lower=pd.Series(LOW, index=df.columns), upper=pd.Series(HIGH, index=df.columns), axis=1)
    return {"x": _finish(df.to_numpy(np.float32), parse["segment"]), "y": parse["y"]}


def _finish(x: np.ndarray, segment: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    x -= CENTRE
    x *= INV_SPREAD
    onehot = (np.asarray(segment)[:, None] == np.arange(len(SEGMENTS))).astype(np.float32)
    return np.concatenate([x, onehot], 1)


def _clean_gpu(parse, device):
    import torch

    x, seg = (torch.as_tensor(parse[k]).to(device) for k in ("x", "segment"))
    centre, low, high, inv = (torch.from_numpy(a).to(x.device) for a in (CENTRE, LOW, HIGH, INV_SPREAD))
    x = torch.where(torch.isnan(x), centre, x)
    x = torch.minimum(torch.maximum(x, low), high)
    x = (x - centre) * inv
    onehot = (seg[:, None] == torch.arange(len(SEGMENTS), device=x.device)).to(torch.float32)
    return {"x": torch.cat([x, onehot], 1), "y": torch.as_tensor(parse["y"]).to(device)}


# -- the model -----------------------------------------------------------------------------------
def _init(device, lr: float, seed: int):
    import torch

    model = mlp([FEATURES, 64, 2], seed).to(device)
    model.train()
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
            "loss_sum": torch.zeros((), dtype=torch.float64, device=device), "samples": 0}


def _step(clean, state, device):
    import torch
    import torch.nn.functional as F

    x, y = (torch.as_tensor(clean[k]).to(device) for k in ("x", "y"))
    loss = F.cross_entropy(state["model"](x), y)
    state["opt"].zero_grad(set_to_none=True)
    loss.backward()
    state["opt"].step()
    state["loss_sum"] += loss.detach().to(torch.float64) * x.shape[0]
    state["samples"] += int(x.shape[0])


def _evaluate(train, table):
    import torch

    clean = _clean_numpy(_parse_numpy(table["holdout"]))
    model = train["model"].to("cpu").eval()
    loss, p_true = evaluate_model(model, torch.from_numpy(clean["x"]), torch.from_numpy(clean["y"]))
    return {"test_loss": loss, "p_true": p_true, "train_loss": train["loss_sum"].cpu() / max(train["samples"], 1)}


def pandas_available() -> bool:
    """Whether pandas can be imported (the ``pandas`` engine needs it)."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def build(size: int | None = None, *, epochs: int = 2, batch: int = 512, lr: float = 0.05, seed: int = 0,
          engine: str = "numpy") -> Pipeline:
    """The chunked table stream on ``size`` rows (default 20,000), ``batch`` rows per chunk."""
    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"stream_tabular pipeline: size (rows) must be at least 1, got {n}")
    if engine not in ("numpy", "pandas"):
        raise ValueError(f"stream_tabular pipeline: engine must be 'numpy' or 'pandas', got {engine!r}")
    if engine == "pandas" and not pandas_available():
        raise ValueError("stream_tabular pipeline: engine='pandas' needs pandas; install it or use engine='numpy'")
    p = Pipeline("stream_tabular", size=n, size_unit="rows")
    p.add(name="table", kind="other", cpu=_table, pin="cpu", params={"size": n, "seed": seed},
          doc="CSV text: rows of 8 numbers (missing fields, outliers), a segment and a label; 512 held out.")
    p.source("chunks", epochs=epochs, batch_size=batch, params={"batch": batch})(_chunks)
    p.stage("parse", kind="cleaning", device="cpu")(_parse_pandas if engine == "pandas" else _parse_numpy)
    p.stage("clean", kind="cleaning", device="cpu")(_clean_pandas if engine == "pandas" else _clean_numpy)
    p.stage("clean", device="gpu")(_clean_gpu)
    p.step("train", init=lambda device: _init(device, lr, seed))(_step)
    p.add(name="evaluate", kind="inference", fn=_evaluate, pin="cpu", inputs=["train", "table"],
          doc="Cross-entropy and true-class probability of the trained model on the held-out rows.")
    return p
