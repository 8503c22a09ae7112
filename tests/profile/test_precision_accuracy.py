"""Checking a lower precision's accuracy here: the TF32 emulation, emulated autocast, and the refusal
of a precision that breaks a stage (one that sums many small values)."""

from __future__ import annotations

import json

import pytest
import torch

from placer import Pipeline
from placer.precision import emulated_autocast, emulated_tf32, round_to_tf32
from placer.profile.precision import check_precisions, relative_difference
from warm_cli import run as run_placer
from seeded_cache import seeded_cache


def test_tf32_rounding_keeps_ten_mantissa_bits():
    x = torch.tensor([1.0, 1 + 2**-10, 1 + 2**-12, 1 + 3 * 2**-12, -(1 + 2**-9 + 2**-13), float("inf"), float("nan")])
    r = round_to_tf32(x)
    assert r[:5].tolist() == [1.0, 1 + 2**-10, 1.0, 1 + 2**-10, -(1 + 2**-9)]
    assert r[5] == float("inf") and torch.isnan(r[6])
    # every rounded value has its 13 low mantissa bits clear
    y = round_to_tf32(torch.randn(10_000, generator=torch.Generator().manual_seed(0)))
    assert (y.view(torch.int32) & ((1 << 13) - 1)).eq(0).all()
    assert round_to_tf32(torch.ones(3, dtype=torch.float64)).dtype == torch.float64  # only fp32 is rounded


def test_emulated_tf32_error_is_bounded_by_its_mantissa_and_below_bf16():
    """The emulated TF32 product's error against fp64 is within TF32's unit roundoff (2^-11 per input,
    so about 2^-10 relative per product term) and below bf16's (the stricter bound)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 256, generator=g), torch.randn(256, 64, generator=g)
    exact = a.double() @ b.double()
    with emulated_tf32():
        tf32 = a @ b
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = (a @ b).double()
    err = lambda y: float((y.double() - exact).norm() / exact.norm())  # noqa: E731
    assert 1e-6 < err(tf32) < 2**-10
    assert err(tf32) < err(bf16) < 2**-7
    assert err(a @ b) < 1e-6  # plain fp32 is untouched outside the block


def test_emulated_tf32_covers_the_backward_pass():
    seen = []
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    ref_grad = torch.autograd.grad(lin(x).sum(), x)[0]
    with emulated_tf32():
        grad = torch.autograd.grad(lin(x).sum(), x)[0]
    seen.append(float((grad - ref_grad).abs().max()))
    assert 0 < seen[0] < 1e-2  # the gradient's product read rounded weights


def test_emulated_autocast_gives_autocasts_numbers():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 96, generator=g), torch.randn(96, 32, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = a @ b
    with emulated_autocast("bf16"):
        emu = a @ b
    assert emu.dtype == real.dtype == torch.bfloat16
    assert relative_difference(emu, real)[1] < 2**-7  # one bf16 rounding apart at most


def test_relative_difference_uses_the_loss_and_names_it():
    assert relative_difference({"loss": torch.tensor([1.0, 2.0]), "w": torch.zeros(3)},
                               {"loss": torch.tensor([1.0, 2.02]), "w": torch.ones(3)})[0] == "loss"
    metric, d = relative_difference([torch.ones(4)], [torch.ones(4) * 2])
    assert metric == "outputs" and d == pytest.approx(0.5)
    assert relative_difference(torch.ones(2), torch.ones(3))[1] >= 1e6  # shapes differ


def summing_pipeline() -> Pipeline:
    p = Pipeline("sums", size=4096)

    @p.stage()
    def data(device):
        return torch.rand(4096, 64, generator=torch.Generator().manual_seed(0))

    @p.stage(precision=("tf32", "bf16"))
    def total(data, device):
        """Per-row partial sums (a product), accumulated over many small chunks in the product's type."""
        w = torch.full((64, 1), 1 / 64)
        acc = None
        for chunk in data.split(4):
            part = chunk @ w
            acc = part if acc is None else acc + part
        return acc

    @p.stage(precision="bf16", tolerance=0.05)
    def product(data, device):
        return data[:256] @ data[:256].T

    return p


def test_a_stage_summing_many_small_values_is_refused_bf16_and_keeps_tf32():
    checks = check_precisions(summing_pipeline())
    total = {c.precision: c for c in checks["total"]}
    assert total["bf16"].rel_error > total["bf16"].tolerance == 0.01 and not total["bf16"].ok
    assert "outputs differ by" in total["bf16"].words() and "tolerance 1.00%" in total["bf16"].words()
    assert total["tf32"].ok and total["tf32"].rel_error < 1e-4
    assert "10-bit mantissa" in total["tf32"].method
    prod = checks["product"][0]
    assert prod.precision == "bf16" and prod.ok and prod.tolerance == 0.05
    assert prod.seconds is not None and prod.fp32_seconds is not None


def test_the_plan_refuses_bf16_to_the_summing_stage_and_says_why(tmp_path, monkeypatch):
    """End to end here: profile, check, plan for the H200: the summing stage is not given bf16 on any
    device, and its reason names the measured difference and the tolerance."""
    from placer.site import LocalSite

    monkeypatch.setenv("PLACER_CACHE_DIR", str(seeded_cache(tmp_path)))
    costs = LocalSite(cache=False).costs(summing_pipeline(), size=None, budget_s=2.0, describe="h200")
    checks = {c.precision: c for c in costs.profile.stages["total"].precision_checks}
    assert not checks["bf16"].ok and checks["tf32"].ok
    plan = costs.plan(target=True)
    total = next(s for s in plan.stages if s.name == "total")
    assert total.precision != "bf16" and plan.precision.get("total") != "bf16"
    assert "bf16 not chosen: outputs differ by" in total.reason and "(tolerance 1.00%)" in total.reason
    assert all("bf16" in times for times in total.precision_s.values())  # the what-if still lists it


def test_work_counted_under_autocast_has_two_byte_elementwise_ops_and_fp32_list_ops():
    """Elementwise ops that consume a product's output move half the bytes under bf16 autocast (more
    than halving the products' own bytes gives), while a layer norm after it stays in fp32."""
    from placer.costmodel.counts import count_work
    from placer.profile.precision import counted_under, work_ratios

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 128, generator=g), torch.randn(128, 512, generator=g)

    def chain():  # one product, then elementwise work on its output
        y = x @ w
        for _ in range(6):
            y = torch.nn.functional.gelu(y) * 0.5 + y
        return y

    def normed():  # the same, through layer norm (on autocast's fp32 list) each time
        y = x @ w
        for _ in range(6):
            y = torch.nn.functional.layer_norm(y, (512,)) * 0.5 + y
        return y

    fp32 = counted_under(chain, "fp32")
    low = work_ratios(fp32, counted_under(chain, "bf16"))
    halving = (fp32.bytes - fp32.tensor_bytes / 2) / fp32.bytes
    assert low["bytes_ratio"] < 0.65 < halving  # the products' outputs and their consumers in bf16
    assert low["ops_ratio"] >= 1.0  # autocast's casts are kernels too
    n32 = counted_under(normed, "fp32")
    assert work_ratios(n32, counted_under(normed, "bf16"))["bytes_ratio"] > 0.85  # layer norm keeps fp32
    _, plain = count_work(chain, repeats=1)
    assert plain.bytes == fp32.bytes  # counting in fp32 changes nothing


def test_the_check_keeps_the_counted_ratios_for_bf16_only():
    checks = check_precisions(summing_pipeline())
    total = {c.precision: c for c in checks["total"]}
    # each small product casts its chunk and its weights first: under autocast this stage moves more
    assert total["bf16"].bytes_ratio > 1.2 and total["bf16"].ops_ratio > 1.2 and total["bf16"].calls_ratio > 1.2
    assert total["tf32"].bytes_ratio is None  # TF32 moves fp32 bytes: nothing to count


@pytest.mark.slow
def test_a_saved_profile_carries_the_checks_and_plans_precisions(tmp_path):
    """`placer profile -o FILE` checks the declared precisions and saves them; `placer plan --profile FILE`
    then plans them (the summing stage refused bf16, with the reason) without running anything."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).read_text()
    start, end = src.index("def summing_pipeline"), src.index("def test_a_stage_summing_many_small_values")
    mod = tmp_path / "sums.py"
    mod.write_text("import torch\nfrom placer import Pipeline\n\n" + src[start:end]
                   + "\n\ndef build(size=None):\n    return summing_pipeline()\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PLACER_CACHE_DIR": str(seeded_cache(tmp_path / "cache"))}

    def cli(*args):
        return run_placer([*args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)

    saved = tmp_path / "profile.json"
    got = cli("profile", str(mod), "--budget-s", "3", "-o", str(saved))
    assert got.returncode == 0, got.stderr
    from placer.data.profile import Profile

    checks = {c.precision: c for c in Profile.load(saved).stages["total"].precision_checks}
    assert set(checks) == {"tf32", "bf16"} and not checks["bf16"].ok
    plan = cli("plan", "--profile", str(saved), "--target", "h200", "--json")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    total = next(s for s in doc["stages"] if s["name"] == "total")
    assert total["precision_s"] and "bf16 not chosen: outputs differ by" in total["reason"]
    wrong = cli("profile", str(mod), "--precision", "total=bf16")
    assert wrong.returncode != 0 and "takes auto only" in wrong.stderr
