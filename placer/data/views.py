"""Plans, runs and reports as tables: ``to_pandas()`` and a compact HTML view for notebooks.

May import: jinja2 (HTML), pandas (only inside :meth:`Views.to_pandas`, and optional).

:class:`Views` is mixed into :class:`~placer.data.plan.Plan`,
:class:`~placer.data.run.Run`, :class:`~placer.data.report.ReportFacts` and
:class:`~placer.data.stream.StreamPlan` (and the
advise flow's ``Advised`` hands on its facts' views):

- ``obj.tables()``: every table as a list of rows (dicts), no extra dependency;
- ``obj.to_pandas(table="stages")``: one table as a ``pandas.DataFrame``
  (``stages``, ``transfers`` and ``what_if``; pandas is optional and a clear
  ``ImportError`` says how to install it);
- ``obj._repr_html_()``: what Jupyter shows, a title, the key numbers and the
  stages table, self-contained (one scoped style block, no scripts, nothing loaded) and with every string
  from the pipeline escaped.

Examples
--------
>>> from placer.data.run import Run, StageRecord
>>> run = Run(pipeline="demo <b>", placement={"a": "cpu"}, executor="inline", workers=1, makespan_s=0.5,
...           stages=[StageRecord(name="a", device="cpu", lane="cpu/0", start_s=0.0, end_s=0.5, seconds=0.5)])
>>> run.tables()["stages"][0]["seconds"]
0.5
>>> "demo &lt;b&gt;" in run._repr_html_()
True
"""

from __future__ import annotations

from typing import Any

import jinja2

#: the tables each model gives
TABLE_NAMES = ("stages", "transfers", "what_if")

_TEMPLATE = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True).from_string("""\
<div class="placer-view">
<style scoped>
.placer-view {font-family: system-ui, sans-serif; font-size: 13px; line-height: 1.4; max-width: 70em}
.placer-view .title {font-weight: 600}
.placer-view .line {color: #444}
.placer-view table {border-collapse: collapse; margin-top: 6px}
.placer-view caption {text-align: left; color: #666; caption-side: top}
.placer-view th {border-bottom: 1px solid #999; padding: 2px 8px; text-align: left}
.placer-view td {border-bottom: 1px solid #eee; padding: 2px 8px}
</style>
<div class="title">{{ title }}</div>
{% for line in lines %}<div class="line">{{ line }}</div>
{% endfor %}
{% for t in tables if t.rows %}
<table>
<caption>{{ t.caption }}</caption>
<thead><tr>{% for c in t.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in t.rows %}<tr>{% for c in t.columns %}<td>{{ fmt(row.get(c)) }}</td>{% endfor %}</tr>
{% endfor %}
</tbody></table>
{% endfor %}
{% for line in footer %}<div class="line">{{ line }}</div>
{% endfor %}
</div>""")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _seconds(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g} s"


def html(title: str, lines: list[str], tables: list[dict[str, Any]], footer: list[str] = ()) -> str:
    """The compact HTML view: a title, lines of key numbers, tables (``caption``, ``columns``, ``rows``), a footer.

    Every string is escaped (``jinja2`` autoescaping).

    Parameters
    ----------
    title : str
        The first line, in bold.
    lines : list of str
        Key numbers, one per line.
    tables : list of dict
        Each ``{"caption": str, "columns": list of str, "rows": list of dict}``;
        empty tables are left out.
    footer : list of str
        Lines after the tables (advice, warnings).
    """
    return _TEMPLATE.render(title=title, lines=lines, tables=tables, footer=list(footer), fmt=_fmt)


# -- the tables of each model ----------------------------------------------------------------------
def plan_tables(plan: Any) -> dict[str, list[dict[str, Any]]]:
    """A :class:`~placer.data.plan.Plan`'s stages (device, predicted seconds per device, reason),
    its predicted copies, and its baselines (``what_if``)."""
    devices = sorted({d for s in plan.stages for d in s.predicted_s})
    stages = [{"stage": s.name, "kind": s.kind, "device": s.device,
               **{f"predicted_s[{d}]": s.predicted_s.get(d) for d in devices},
               "copy_s": s.copy_s, "crossover_size": s.crossover_size, "pinned": s.pinned, "reason": s.reason}
              for s in plan.stages]
    transfers = [t.model_dump() for t in plan.schedule.transfers]
    what_if = [{"option": "plan", "predicted_s": plan.predicted_makespan_s, "plan_speedup": 1.0}]
    what_if += [{"option": k, "predicted_s": v,
                 "plan_speedup": (v / plan.predicted_makespan_s) if v and plan.predicted_makespan_s else None}
                for k, v in plan.baselines.items()]
    return {"stages": stages, "transfers": transfers, "what_if": what_if}


def run_tables(run: Any) -> dict[str, list[dict[str, Any]]]:
    """A :class:`~placer.data.run.Run`'s stages, copies, and its streams' throughput (``what_if``: none)."""
    stages = [{"stage": s.name, "device": s.device, "lane": s.lane, "worker": s.worker, "start_s": s.start_s,
               "end_s": s.end_s, "seconds": s.seconds, "output_bytes": s.output_bytes, "status": s.status}
              for s in run.stages]
    transfers = [{"data": t.data, "src": t.src, "dst": t.dst, "direction": t.direction, "bytes": t.bytes,
                  "start_s": t.start_s, "seconds": t.seconds, "pinned": t.pinned} for t in run.transfers]
    return {"stages": stages, "transfers": transfers, "what_if": []}


def facts_tables(facts: Any) -> dict[str, list[dict[str, Any]]]:
    """A report's stages (predicted and measured on each device), measured copies, and its
    options and what-ifs (the plan against the baselines; a stream's single changes)."""
    devices = sorted({d for s in facts.stages for d in (*s.predicted_s, *s.measured_s)})
    stages = [{"stage": s.name, "kind": s.kind, "device": s.device,
               **{f"predicted_s[{d}]": s.predicted_s.get(d) for d in devices},
               **{f"measured_s[{d}]": s.measured_s.get(d) for d in devices},
               "speedup": s.speedup, "reason": s.reason} for s in facts.stages]
    transfers = [{"data": b.label, "src": b.src, "dst": b.dst, "bytes": b.bytes, "start_s": b.start_s,
                  "seconds": b.end_s - b.start_s, "pinned": b.pinned}
                 for b in facts.timeline.measured if b.kind == "transfer"]
    what_if = [{"option": o.key, "title": o.title, "predicted_s": o.predicted_s, "measured_s": o.measured_s,
                "plan_speedup_predicted": o.plan_speedup_predicted,
                "plan_speedup_measured": o.plan_speedup_measured, "note": o.note}
               for o in facts.summary.options]
    for s in facts.streams or []:
        what_if += [{"option": o.name, "stream": f"{s.source} -> {s.step}", "change": o.change,
                     "predicted_samples_per_s": o.predicted_samples_per_s,
                     "measured_samples_per_s": o.measured_samples_per_s, "speedup": o.speedup}
                    for o in [*s.options, *s.what_if]]
    return {"stages": stages, "transfers": transfers, "what_if": what_if}


def stream_plan_tables(plan: Any) -> dict[str, list[dict[str, Any]]]:
    """A :class:`~placer.data.stream.StreamPlan`'s members (device, workers, modelled rate, reason), no
    transfers table (copies are members of the stream), and its baselines and what-ifs."""
    stages = [{"stage": s.name, "device": s.device, "workers": s.workers, "worker_kind": s.worker_kind,
               "seconds_per_batch": s.seconds_per_batch, "batches_per_s": s.batches_per_s, "reason": s.reason}
              for s in plan.stages]
    what_if = [{"option": "plan", "kind": "plan", "change": "", "predicted_samples_per_s": plan.predicted_samples_per_s,
                "measured_samples_per_s": None, "speedup": None, "bottleneck": plan.bottleneck}]
    what_if += [{"option": a.name, "kind": kind, "change": a.change, "predicted_samples_per_s": a.predicted_samples_per_s,
                 "measured_samples_per_s": a.measured_samples_per_s, "speedup": a.speedup, "bottleneck": a.bottleneck}
                for kind, alts in (("baseline", plan.baselines), ("what_if", plan.what_if)) for a in alts]
    return {"stages": stages, "transfers": [], "what_if": what_if}


# -- the HTML of each model ------------------------------------------------------------------------
def _columns(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> list[str]:
    return [c for c in (rows[0] if rows else {}) if c not in drop]


def plan_html(plan: Any) -> str:
    t = plan_tables(plan)
    base = ", ".join(f"{k.replace('_', ' ')} {_seconds(v)}" for k, v in plan.baselines.items())
    lines = [f"predicted makespan {_seconds(plan.predicted_makespan_s)} at size {_fmt(plan.size)} "
             f"{plan.size_unit}" + (f"; {base}" if base else ""),
             f"placement: " + ", ".join(f"{k}={v}" for k, v in plan.placement.items())]
    return html(f"Plan ({plan.objective}, {plan.method} search)", lines,
                [{"caption": "stages", "columns": _columns(t["stages"]), "rows": t["stages"]}],
                [f"warning: {w}" for w in plan.warnings])


def run_html(run: Any) -> str:
    t = run_tables(run)
    lines = [f"makespan {_seconds(run.makespan_s)} ({run.executor}, {run.workers} workers); "
             f"{len(run.transfers)} copies, {sum(x.bytes for x in run.transfers):,} bytes",
             f"outputs digest {run.outputs_digest}"]
    lines += [f"stream {s.source} -> {s.step}: {s.samples_per_s:,.1f} samples/s over {s.batches} batches"
              for s in run.streams]
    footer = [f"failed at {run.failed_stage}: {run.error}"] if run.error else []
    return html(f"Run of {run.pipeline}", lines,
                [{"caption": "stages", "columns": _columns(t["stages"], ("worker",) if not any(
                    r["worker"] for r in t["stages"]) else ()), "rows": t["stages"]}], footer)


def stream_plan_html(plan: Any) -> str:
    t = stream_plan_tables(plan)
    lines = [f"predicted {plan.predicted_samples_per_s:,.1f} samples/s ({plan.objective.replace('_', ' ')}); "
             f"bottleneck {plan.bottleneck}",
             f"prefetch {plan.settings.prefetch}, pin_memory {plan.settings.pin_memory}, "
             f"cache {plan.settings.cache or 'none'}"]
    return html(f"Stream plan {plan.source} -> {plan.step} ({plan.pipeline})", lines,
                [{"caption": "stages", "columns": _columns(t["stages"]), "rows": t["stages"]},
                 {"caption": "baselines and what-ifs", "columns": _columns(t["what_if"]), "rows": t["what_if"]}],
                plan.reasons)


def facts_html(facts: Any) -> str:
    t = facts_tables(facts)
    lines = [facts.summary.headline] + ([facts.bottleneck.sentence] if facts.bottleneck else [])
    tables = [{"caption": "plan and alternatives", "columns": _columns(t["what_if"]), "rows": t["what_if"]},
              {"caption": "stages", "columns": _columns(t["stages"]), "rows": t["stages"]}]
    return html(f"{facts.meta.pipeline} at size {_fmt(facts.meta.size)} {facts.meta.size_unit}", lines, tables,
                [f"- {a.text}" for a in facts.advice])


_VIEWS = {"Plan": (plan_tables, plan_html), "Run": (run_tables, run_html),
          "ReportFacts": (facts_tables, facts_html), "StreamPlan": (stream_plan_tables, stream_plan_html)}
#: the columns of a table with no rows (an empty DataFrame still says what it would hold)
_EMPTY = {
    "stages": ["stage", "device", "seconds"],
    "transfers": ["data", "src", "dst", "bytes", "start_s", "seconds"],
    "what_if": ["option", "predicted_s", "measured_s"],
}


def _views_of(obj: Any):
    for cls in type(obj).__mro__:
        if cls.__name__ in _VIEWS:
            return _VIEWS[cls.__name__]
    raise TypeError(f"{type(obj).__name__} has no table views")


def to_pandas(rows: list[dict[str, Any]], columns: list[str] | None = None):
    """``rows`` as a ``pandas.DataFrame`` (``columns`` when there are none); an ImportError naming the
    install command without pandas."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("to_pandas() needs pandas, which placer does not install by itself: "
                          "pip install pandas (or pip install 'placer[pandas]')") from exc
    return pd.DataFrame.from_records(rows) if rows else pd.DataFrame(columns=columns or [])


class Views:
    """Tables, ``to_pandas()`` and a notebook view (``_repr_html_``) for a plan, a run or a report."""

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """Every table (``stages``, ``transfers``, ``what_if``) as a list of rows."""
        return _views_of(self)[0](self)

    def to_pandas(self, table: str = "stages"):
        """One table as a ``pandas.DataFrame`` (pandas is optional: ``pip install pandas``).

        Parameters
        ----------
        table : {"stages", "transfers", "what_if"}
            ``stages``: one row per stage (device, predicted and measured seconds,
            reason); ``transfers``: one row per copy; ``what_if``: the plan against its
            alternatives (a stream's single changes too).

        Raises
        ------
        ImportError
            pandas is not installed (the message says how to install it).
        ValueError
            An unknown table name (the message lists the known ones).
        """
        tables = self.tables()
        if table not in tables:
            raise ValueError(f"unknown table {table!r}; use one of {', '.join(tables)}")
        return to_pandas(tables[table], _EMPTY.get(table))

    def _repr_html_(self) -> str:
        return _views_of(self)[1](self)
