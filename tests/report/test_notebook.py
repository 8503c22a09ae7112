"""Notebook views and DataFrames of plans, runs and reports."""

from __future__ import annotations

import re
import sys

import pytest

import placer
from placer.optimize import CostTable, plan
from placer.report import collect

EVIL = "<script>alert('x')</script>"


@pytest.fixture
def a_plan():
    table = CostTable.model_validate({
        "devices": {"cpu": {"kind": "cpu", "workers": 2}, "gpu": {"kind": "gpu"}},
        "link": {"h2d": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10},
                 "d2h": {"latency_s": 1e-5, "bandwidth_Bps": 2.5e10}},
        "stages": [
            {"name": "load", "kind": "cleaning", "input_bytes": 6.4e8, "output_bytes": 6.4e8, "seconds": {"cpu": 0.05}},
            {"name": EVIL, "kind": "training", "inputs": ["load"], "output_bytes": 1e6,
             "seconds": {"cpu": 4.0, "gpu": 0.1}}]})
    return plan(table)


@pytest.fixture
def a_run():
    p = placer.Pipeline(f"demo {EVIL}")
    p.add(name="make", kind="cleaning", fn=lambda device: list(range(4)))
    p.add(name="total", kind="other", fn=lambda make, device: sum(make), inputs=["make"])
    return placer.execute(p, "all=cpu", executor="inline")


def assert_safe(html: str):
    assert "<script" not in html and EVIL not in html
    assert not re.search(r"\b(src|href)=", html), "self-contained: nothing loaded from elsewhere"
    assert html.count("<table") == html.count("</table>") >= 1


def test_plan_html_escapes_names_and_shows_the_placement(a_plan):
    html = a_plan._repr_html_()
    assert_safe(html)
    assert "&lt;script&gt;" in html
    assert "predicted makespan" in html and "gpu" in html


def test_plan_to_pandas_has_a_row_per_stage_and_devices_as_columns(a_plan):
    df = a_plan.to_pandas()
    assert list(df["stage"]) == ["load", EVIL]
    assert list(df["device"]) == ["cpu", "gpu"]
    assert df.loc[1, "predicted_s[cpu]"] == pytest.approx(4.0)
    what_if = a_plan.to_pandas("what_if")
    assert "all_cpu" in set(what_if["option"])
    row = what_if.set_index("option").loc["all_cpu"]
    assert row["plan_speedup"] == pytest.approx(row["predicted_s"] / a_plan.predicted_makespan_s)
    assert len(a_plan.to_pandas("transfers")) == len(a_plan.schedule.transfers)


def test_run_views(a_run):
    html = a_run._repr_html_()
    assert_safe(html)
    assert "Run of demo &lt;script&gt;" in html and a_run.outputs_digest in html
    df = a_run.to_pandas()
    assert list(df["stage"]) == ["make", "total"]
    assert (df["seconds"] >= 0).all() and set(df["device"]) == {"cpu"}
    copies = a_run.to_pandas("transfers")
    assert copies.empty and {"src", "dst", "bytes"} <= set(copies.columns)


def test_report_facts_and_advised_views(a_run):
    from placer.advisor import Advised

    facts = collect(run=a_run)
    html = facts._repr_html_()
    assert_safe(html)
    advised = Advised(pipeline=None, size=None, profile=None, plan=None, run=a_run, facts=facts)
    assert advised._repr_html_() == html
    df = advised.to_pandas("stages")
    assert list(df["stage"]) == ["make", "total"]
    assert "measured_s[cpu]" in df.columns
    assert set(advised.to_pandas("what_if")["option"]) == {o.key for o in facts.summary.options}


def test_unknown_table_lists_the_known_ones(a_run):
    with pytest.raises(ValueError, match="use one of stages, transfers, what_if"):
        a_run.to_pandas("nope")


def test_without_pandas_the_error_names_the_install_command(a_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ImportError, match=r"pip install pandas"):
        a_run.to_pandas()
    assert a_run.tables()["stages"][0]["stage"] == "make"  # the rows need no pandas


def test_stream_plan_views():
    from placer.data.stream import Alternative, StageDecision, StreamPlan

    plan = StreamPlan(pipeline="imgs", source="images", step=EVIL, placement={"images": "cpu", EVIL: "gpu:0"},
                      predicted_samples_per_s=1200.0, bottleneck="augment",
                      stages=[StageDecision(name="augment", device="cpu", workers=2, seconds_per_batch=0.05,
                                            batches_per_s=40.0, reason="CPU-bound")],
                      baselines=[Alternative(name="num_workers=0", predicted_samples_per_s=400.0, speedup=3.0)],
                      what_if=[Alternative(name="more workers", change="4 workers", predicted_samples_per_s=1800.0,
                                           speedup=1.5)])
    assert_safe(plan._repr_html_())
    df = plan.to_pandas()
    assert list(df["stage"]) == ["augment"] and df.loc[0, "workers"] == 2
    alts = plan.to_pandas("what_if").set_index("option")
    assert alts.loc["num_workers=0", "kind"] == "baseline" and alts.loc["more workers", "speedup"] == 1.5
