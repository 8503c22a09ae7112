"""Reports: facts about a plan and its run, as HTML, Markdown or JSON.

May import: placer.report.*, placer.data, placer.entry, placer.devices (``Inventory``), placer.errors;
matplotlib inside the plotting functions. Never torch, dask or numba: a report can be
made anywhere from saved JSON.

The flow is ``collect`` (inputs → :class:`ReportFacts`) then ``write_report``
(facts → file). :func:`report` does both; the package is callable too:
``placer.report(path, ...)`` is :func:`report`. Inputs are read into placer's models
(``Plan``, ``Run``, ``CostTable``, ...) and refused, in one line naming the files, when
a field is malformed or when they are not of one pipeline.

Examples
--------
>>> facts = collect(run={"pipeline": "demo", "placement": {"a": "cpu"}, "executor": "inline",
...                      "workers": 1, "makespan_s": 0.5,
...                      "stages": [{"name": "a", "device": "cpu", "lane": "cpu/0",
...                                  "start_s": 0.0, "end_s": 0.5, "seconds": 0.5}]})
>>> facts.stages[0].measured_s
{'cpu': 0.5}
>>> facts.bottleneck.name, round(facts.bottleneck.share, 2)
('a', 1.0)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from placer.data.report import ReportFacts
from placer.entry import make_callable
from placer.report.check import MismatchedInputsError
from placer.report.collect import collect
from placer.report.inputs import ReportInputError, load
from placer.report.render import infer_format, render_html, render_json, render_markdown, write_report

__all__ = [
    "MismatchedInputsError",
    "ReportFacts",
    "ReportInputError",
    "collect",
    "infer_format",
    "load_facts",
    "render_html",
    "render_json",
    "render_markdown",
    "report",
    "write_report",
]


def report(
    path: str | os.PathLike,
    *,
    plan: Any = None,
    run: Any = None,
    baselines: Mapping[str, Any] | None = None,
    pipeline: Any = None,
    costs: Any = None,
    inventory: Any = None,
    predictions: Mapping[str, Any] | None = None,
    target: Any = None,
    format: str | None = None,
    pictures: bool = False,
    step_only: Mapping[str, float] | None = None,
) -> ReportFacts:
    """Write a report of a plan and its run to ``path``; return its facts.

    Every input may be a live object, a mapping, or the path of its saved JSON, so a
    report can be made later without running anything again. Nothing is written when
    an input is malformed or the inputs do not belong together.

    Parameters
    ----------
    path : path
        Where to write; the format is ``format`` or the suffix (``.html``, ``.md``,
        ``.json``).
    plan, run, baselines, pipeline, costs, inventory, predictions, target, step_only
        See :func:`placer.report.collect.collect`.
    format : {"html", "md", "json"}, optional
    pictures : bool
        Markdown only: write the pictures as SVG files next to the report and link them.

    Examples
    --------
    ``report("report.html", plan="plan.json", run="run.json", baselines={"all_cpu": "cpu.json"})``
    """
    fmt = infer_format(path, format)
    facts = collect(plan=plan, run=run, baselines=baselines, pipeline=pipeline, costs=costs,
                    inventory=inventory, predictions=predictions, target=target, step_only=step_only)
    write_report(facts, path, fmt, pictures_dir=pictures)
    return facts


def load_facts(path: str | os.PathLike) -> ReportFacts:
    """Read a report saved as JSON (to render it again in another format).

    Raises
    ------
    ReportInputError
        The file cannot be read, or is not a placer report (one line naming the file
        and the field).
    """
    facts, _ = load(Path(path), ReportFacts, "report")
    return facts


make_callable(__name__, report)  # ``placer.report(...)`` is report(...)
