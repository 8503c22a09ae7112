"""Rendering facts as HTML, Markdown or JSON, through jinja2 templates.

May import: jinja2, markupsafe, urllib.parse, placer.data.report, placer.files, placer.report.{plots,advice,critical}.

HTML is one self-contained file: CSS inline, pictures as inline SVG, no script,
no font, image or style sheet fetched from anywhere. Every string that comes from
the user or from saved files (stage, pipeline and device names, docstrings,
parameters, notes, meta fields such as the machine, versions, executor and size
unit) is escaped by jinja2's autoescaping in HTML and by :func:`md_escape` in
Markdown; picture links are URL-encoded. ``tests/test_hostile.py`` renders facts
whose every string is hostile and checks that none comes through raw.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from placer.report.advice import fmt_bytes, fmt_size
from placer.report.critical import objective_words, span_word
from placer.data.report import ReportFacts
from placer.files import write_text_atomic

TEMPLATES = Path(__file__).parent / "templates"
FORMATS = ("html", "md", "json")
SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json"}
PICTURES = ("dag", "timeline", "errors")


def fmt_seconds(s: float | None) -> str:
    """``1.23 s``, ``4.56 ms``, ``12.3 µs``; ``–`` for no value."""
    if s is None:
        return "–"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_speedup(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}×" if x >= 100 else f"{x:.2f}×"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.0%}"


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_{}[]()#+!|~"})


def md_escape(text: object) -> str:
    """Markdown-safe inline text: HTML escaped, Markdown punctuation backslashed, one line."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.translate(_MD_SPECIAL)


def compact_placement(placement: Mapping[str, str]) -> str:
    """``load, clean → cpu; train → gpu:0``."""
    by: dict[str, list[str]] = {}
    for stage, dev in placement.items():
        by.setdefault(dev, []).append(stage)
    return "; ".join(f"{', '.join(v)} → {d}" for d, v in by.items())


def _environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(secs=fmt_seconds, nbytes=fmt_bytes, speedup=fmt_speedup, pct=fmt_pct,
                       size=fmt_size, placement=compact_placement, md=md_escape, span_word=span_word,
                       objective_words=objective_words)
    return env


def table_devices(facts: ReportFacts) -> list[str]:
    """Devices that get predicted/measured columns in the stage table, CPU first."""
    used = {d for r in facts.stages for d in (*r.predicted_s, *r.measured_s)}
    ordered = [d.name for d in facts.meta.devices if d.name in used]
    return ordered + sorted(used - set(ordered))


def pictures(facts: ReportFacts) -> dict[str, str]:
    """The pictures as standalone SVG documents: graph, timeline, errors, and one per stream (``stream0``, ...)."""
    from placer.report import plots

    out = {"dag": plots.dag_svg(facts), "timeline": plots.timeline_svg(facts), "errors": plots.errors_svg(facts)}
    for i, _ in enumerate(facts.streams or []):
        out[f"stream{i}"] = plots.stream_svg(facts, i)
    return out


def render_html(facts: ReportFacts, figures: Mapping[str, str] | None = None) -> str:
    """One self-contained HTML page."""
    from placer.report.plots import inline_svg

    figures = figures if figures is not None else pictures(facts)
    inline = {k: Markup(inline_svg(v, k)) for k, v in figures.items()}
    return _environment(True).get_template("report.html.j2").render(
        f=facts, figs=inline, devices=table_devices(facts), css=Markup((TEMPLATES / "report.css").read_text()),
        stream_css=Markup((TEMPLATES / "stream.css").read_text()) if facts.streams else "")


def render_markdown(facts: ReportFacts, links: Mapping[str, str] | None = None) -> str:
    """Markdown with the same facts; ``links`` maps picture names to relative file paths."""
    return _environment(False).get_template("report.md.j2").render(
        f=facts, links=dict(links or {}), devices=table_devices(facts))


def render_json(facts: ReportFacts) -> str:
    return facts.to_json() + "\n"


def infer_format(path: str | os.PathLike, fmt: str | None = None) -> str:
    """The format asked for, else the one the file's suffix names.

    Raises
    ------
    ValueError
        An unknown format, or a suffix that names none (the message says which to use).
    """
    if fmt is not None:
        f = fmt.lower().lstrip(".")
        f = "md" if f == "markdown" else f
        if f not in FORMATS:
            raise ValueError(f"unknown report format {fmt!r}; use html, md or json")
        return f
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"cannot tell the report format from {str(path)!r}; name the file .html, .md or .json, "
            "or pass --format html|md|json"
        )
    return SUFFIXES[suffix]


def write_report(facts: ReportFacts, path: str | os.PathLike, fmt: str | None = None, *,
                 pictures_dir: bool = False) -> Path:
    """Write the report in its format (atomically); return its path.

    Parameters
    ----------
    pictures_dir : bool
        Markdown only: also write the pictures as SVG files in ``<name>_files/`` next to
        the report and link them.
    """
    path = Path(path)
    f = infer_format(path, fmt)
    if f == "json":
        return write_text_atomic(path, render_json(facts))
    if f == "html":
        return write_text_atomic(path, render_html(facts))
    links = {}
    if pictures_dir:
        folder = path.with_name(f"{path.stem}_files")
        for name, svg in pictures(facts).items():
            write_text_atomic(folder / f"{name}.svg", svg)
            links[name] = quote(f"{folder.name}/{name}.svg")  # a link target: spaces, brackets encoded
    return write_text_atomic(path, render_markdown(facts, links))
