"""Reports: content matches the runs, escaping, self-containment, formats, saved inputs."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

import test_report_fixtures as fx
from placer import Pipeline
from placer.executor import execute
from placer.report import ReportInputError, collect, load_facts, render_html, render_markdown, report, write_report
from placer.data.report import Bar
from placer.report.render import fmt_seconds, infer_format


class Cells(HTMLParser):
    """Text of every ``<td>`` by its row's ``data-stage``/``data-option`` and its ``data-col``."""

    def __init__(self):
        super().__init__()
        self.row = None
        self.col = None
        self.cells: dict[tuple[str, str], str] = {}
        self.ids: set[str] = set()
        self.buf: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "tr":
            self.row = a.get("data-stage") or a.get("data-option")
            self.n = 0
        if tag == "td":
            self.col = a.get("data-col") or f"#{self.n}"
            self.n += 1
            self.buf = []

    def handle_endtag(self, tag):
        if tag == "td" and self.row is not None:
            self.cells[(self.row, self.col)] = "".join(self.buf).strip()
            self.col = None

    def handle_data(self, data):
        if self.col is not None:
            self.buf.append(data)


@pytest.fixture(scope="module")
def facts():
    return fx.facts()


@pytest.fixture(scope="module")
def html(facts):
    return render_html(facts)


def test_stage_table_numbers_match_the_runs_json(facts, html):
    p, chosen, run, cpu, gpu, _ = fx.inputs()
    assert any(d == "gpu-sim" for d in chosen.placement.values()), "fixture plan should use the accelerator"
    doc = json.loads(run.model_dump_json())
    cells = Cells()
    cells.feed(html)
    for rec in doc["stages"]:
        row = next(r for r in facts.stages if r.name == rec["name"])
        assert row.measured_s[rec["device"]] == rec["seconds"]
        assert cells.cells[(rec["name"], f"measured:{rec['device']}")] == fmt_seconds(rec["seconds"])
    for rec in json.loads(cpu.model_dump_json())["stages"]:
        if chosen.placement[rec["name"]] != "cpu":  # the plan's own run wins for its devices
            assert cells.cells[(rec["name"], "measured:cpu")] == fmt_seconds(rec["seconds"])
    # the summary shows the measured makespans and the plan's measured speedup over each
    assert cells.cells[("plan", "#3")] == fmt_seconds(doc["makespan_s"])
    assert cells.cells[("all_cpu", "#3")] == fmt_seconds(cpu.makespan_s)
    opt = next(o for o in facts.summary.options if o.key == "all_cpu")
    assert opt.plan_speedup_measured == pytest.approx(cpu.makespan_s / run.makespan_s)


def test_transfers_and_bytes_come_from_the_run(facts):
    _, chosen, run, *_ = fx.inputs()
    for tr in run.transfers:
        if tr.src == "host":  # a copy into a stage's device: its consumers' copy-in
            consumers = [e for e in facts.dag.edges if e.src == tr.data and e.crosses]
            assert consumers and all(e.bytes == tr.bytes and e.transfer_s == tr.seconds for e in consumers)
        row = next(r for r in facts.stages if r.name == tr.data)
        assert row.out_bytes >= tr.bytes
    crossing = {(e.src, e.dst) for e in facts.dag.edges if e.crosses}
    expected = {(e.src, e.dst) for e in facts.dag.edges
                if (chosen.placement[e.src] == "cpu") != (chosen.placement[e.dst] == "cpu")}
    assert crossing == expected and crossing


def test_every_section_is_in_the_html(html):
    cells = Cells()
    cells.feed(html)
    for section in ("summary", "bottleneck", "advice", "dag", "stages", "stage-table", "timeline", "errors",
                    "fig-dag", "fig-timeline", "fig-errors", "summary-table"):
        assert section in cells.ids, section
    assert html.count("<svg") == 3


def test_the_html_loads_nothing_from_the_network(html):
    assert "://" not in html
    assert not re.search(r"<(script|link|iframe|img|object|embed)\b", html, re.I)
    assert not re.search(r"url\((?!#)|@import", html, re.I)  # only in-page references (url(#clip))


def test_simulated_device_is_never_called_a_gpu(facts, html):
    text = re.sub(r"<[^>]+>", " ", html)
    assert "gpu-sim (simulated test device)" in text
    # never "GPU gpu-sim", "the GPU (gpu-sim)" or "gpu-sim (... GPU ...)" unless it says it is not one
    assert not re.search(r"GPU\s*\(?gpu-sim", text)
    assert not re.search(r"gpu-sim\s*\((?![^)]*not a GPU)[^)]*GPU", text)
    badges = re.findall(r'<span class="dev sim"[^>]*>([^<]*)</span>', html)
    assert badges and all(b.endswith("(simulated test device)") for b in badges)
    assert "all on the GPU" not in text  # the all-accelerator option names the simulated device
    gpu_words = [a.text for a in facts.advice if "the GPU" in a.text]
    assert not gpu_words, gpu_words


def test_script_stage_name_is_shown_as_text_and_runs_nothing(tmp_path):
    evil = "<script>alert(1)</script>"
    p = Pipeline("<b>pipe</b>")

    @p.stage(name=evil, params={"note": "</td><script>alert(2)</script>"})
    def first(device, note):
        """<img src=x onerror=alert(3)> docs"""
        import torch

        return torch.ones(3, device=device)

    @p.stage(name="$x$ & {{ y }}", inputs={"v": evil})
    def second(v, device):
        return v * 2

    run = execute(p, "all=cpu")
    out = tmp_path / "evil.html"
    report(out, run=run, pipeline=p)
    html = out.read_text()
    assert "<script" not in html.lower()
    assert "<img" not in html.lower() and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "{{ y }}" in html  # template syntax in a name is text, not a template
    md = render_markdown(collect(run=run, pipeline=p))
    assert "<script" not in md.lower() and "&lt;script&gt;" in md


def test_markdown_has_the_same_facts_and_links_pictures(facts, tmp_path):
    path = write_report(facts, tmp_path / "r.md", pictures_dir=True)
    md = path.read_text()
    for name in ("dag", "timeline", "errors"):
        svg = tmp_path / "r_files" / f"{name}.svg"
        assert svg.is_file() and svg.read_text().lstrip().startswith("<?xml")
        assert f"](r_files/{name}.svg)" in md
    for r in facts.stages:
        for dev, secs in r.measured_s.items():
            assert fmt_seconds(secs) in md
    for a in facts.advice:
        assert a.text[:25].replace("'", "'") in md.replace("\\", "")


def test_json_round_trips_and_re_renders(facts, tmp_path):
    path = write_report(facts, tmp_path / "r.json")
    again = load_facts(path)
    assert again == facts
    doc = json.loads(path.read_text())
    assert doc["schema"] == "placer.report/1"
    assert {"meta", "summary", "dag", "stages", "timeline", "errors", "bottleneck", "advice"} <= set(doc)


def test_report_from_saved_json_files_says_the_same(tmp_path):
    p, chosen, run, cpu, gpu, costs = fx.inputs()
    files = {}
    for name, obj in {"plan": chosen, "run": run, "cpu": cpu, "costs": costs}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(obj.model_dump_json())
    saved = report(tmp_path / "r.json", plan=files["plan"], run=files["run"], baselines={"all_cpu": files["cpu"]},
                   costs=files["costs"])
    live = collect(plan=chosen, run=run, baselines={"all_cpu": cpu}, costs=costs)
    assert [r.model_dump() for r in saved.stages] == [r.model_dump() for r in live.stages]
    assert saved.summary.options == live.summary.options
    assert saved.bottleneck == live.bottleneck


@pytest.mark.parametrize(("name", "fmt"), [("a.html", "html"), ("a.HTM", "html"), ("a.md", "md"), ("a.json", "json")])
def test_format_comes_from_the_suffix(name, fmt):
    assert infer_format(name) == fmt


def test_unknown_format_says_what_to_use():
    with pytest.raises(ValueError, match=r"\.html, \.md or \.json.*--format"):
        infer_format("report.txt")
    with pytest.raises(ValueError, match="use html, md or json"):
        infer_format("report.html", "pdf")


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ReportInputError, match="needs a plan or a run"):
        collect()
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    with pytest.raises(ReportInputError, match=r"run.*run\.json.*not valid JSON"):
        collect(run=bad)
    with pytest.raises(ReportInputError, match="cannot read the plan file"):
        collect(plan=tmp_path / "missing.json")


def test_absent_device_predictions_are_marked_as_predictions():
    f = fx.facts(predictions={"train": {"gpu:0": {"value": 0.001, "rel_error": 0.3, "label": "roofline"}}})
    assert f.device("gpu:0") is not None and not f.device("gpu:0").present
    row = next(e for e in f.errors if e.device == "gpu:0")
    assert row.prediction_only and row.measured_s is None and row.label == "roofline"
    html = render_html(f)
    assert "gpu:0 (predicted)" in html and "prediction only (device absent)" in html


def test_predicted_timeline_puts_cpu_stages_on_worker_lanes(facts):
    cpu_bars = [b for b in facts.timeline.predicted if b.kind == "stage" and b.device == "cpu"]
    assert cpu_bars and all(re.fullmatch(r"cpu/\d", b.lane) for b in cpu_bars)
    by_lane: dict[str, list[Bar]] = {}
    for b in cpu_bars:
        by_lane.setdefault(b.lane, []).append(b)
    for bars in by_lane.values():  # no two stages overlap on one worker
        bars.sort(key=lambda b: b.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(bars, bars[1:]))
