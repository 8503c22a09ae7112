"""Random cost tables, for tests and benchmarks of the optimizer.

Test and benchmark helper (not part of placer). May import: placer.data.cost_table. Never torch, dask or numba.

Examples
--------
>>> import random
>>> t = random_table(random.Random(0), 6)
>>> len(t.stages), t.cpu
(6, 'cpu')
"""

from __future__ import annotations

import random

from placer.data.cost_table import CostTable

KINDS = ("cleaning", "preprocessing", "training", "inference", "other")


def random_table(
    rng: random.Random,
    n: int,
    *,
    accelerators: int = 1,
    chain: bool = False,
    max_inputs: int = 3,
    workers: int | None = None,
) -> CostTable:
    """A random pipeline of ``n`` stages with random costs, sizes and link speeds.

    Stage times span four orders of magnitude; the accelerator is anywhere from
    30x faster to 10x slower; some stages run on one device only; bytes span
    kilobytes to gigabytes; link bandwidth is 1-50 GB/s with 1-50 us latency.
    """
    devices: dict = {"cpu": {"kind": "cpu", "workers": workers or rng.choice([1, 2, 4]),
                             "price_per_hour": rng.uniform(0.05, 1.0)}}
    names = ["cpu"] + [f"gpu:{k}" for k in range(accelerators)]
    for name in names[1:]:
        devices[name] = {"kind": "gpu", "price_per_hour": rng.uniform(1.0, 4.0)}
    link = {
        d: {"latency_s": 10 ** rng.uniform(-6, -4.3), "bandwidth_Bps": 10 ** rng.uniform(9, 10.7)}
        for d in ("h2d", "d2h")
    }
    stages = []
    for i in range(n):
        if chain:
            inputs = [f"s{i - 1}"] if i else []
        else:
            k = rng.randint(0 if i else 0, min(i, max_inputs))
            inputs = [f"s{j}" for j in sorted(rng.sample(range(i), k))]
        cpu_s = 10 ** rng.uniform(-4, 0)
        seconds = {"cpu": cpu_s}
        for name in names[1:]:
            seconds[name] = cpu_s / 10 ** rng.uniform(-1, 1.5)
        roll = rng.random()
        if roll < 0.1 and accelerators:
            del seconds["cpu"]
        elif roll < 0.2:
            seconds = {"cpu": cpu_s}
        stages.append({
            "name": f"s{i}",
            "kind": rng.choice(KINDS),
            "inputs": inputs,
            "input_bytes": 10 ** rng.uniform(3, 9.3) if not inputs or rng.random() < 0.2 else 0.0,
            "output_bytes": 10 ** rng.uniform(3, 9.3),
            "seconds": seconds,
        })
    return CostTable.model_validate({"devices": devices, "link": link, "stages": stages})


def random_model(rng: random.Random, n: int, *, accelerators: int = 1, max_inputs: int = 3):
    """A random pipeline whose costs scale with size: ``size -> CostTable``.

    Each (stage, device) takes ``overhead + per_row * size`` seconds (accelerators
    have larger overheads, and per-row speeds from 10x slower to 100x faster; a
    tenth of the stages are loop-carried, slower on accelerators); each stage
    outputs ``bytes_per_row * size`` bytes.
    """
    base = random_table(rng, n, accelerators=accelerators, max_inputs=max_inputs)
    laws = []
    for st in base.stages:
        per_row = 10 ** rng.uniform(-8, -5)
        loop = rng.random() < 0.1
        law = {"cpu": (10 ** rng.uniform(-5, -3), per_row)}
        for name in base.accelerators:
            speed = 10 ** rng.uniform(-1.5, -0.5) if loop else 10 ** rng.uniform(-1, 2)
            law[name] = (10 ** rng.uniform(-4.5, -2.5), per_row / speed)
        laws.append((st, {d: law[d] for d in law if d in st.seconds}, loop,
                     10 ** rng.uniform(0, 3), 10 ** rng.uniform(0, 3) if st.input_bytes else 0.0))

    def at(size: float) -> CostTable:
        doc = base.model_dump()
        doc["size"] = size
        for entry, (st, law, loop, out_row, in_row) in zip(doc["stages"], laws):
            entry["seconds"] = {d: a + b * size for d, (a, b) in law.items()}
            entry["output_bytes"] = out_row * size
            entry["input_bytes"] = in_row * size
            entry["loop_carried"] = loop
        return CostTable.model_validate(doc)

    return at
