"""Gathering a report's facts from a plan, its run, the baseline runs and the costs.

May import: networkx (through the pipeline object), placer.report.{facts,inputs,
critical,advice}. Never torch, dask or matplotlib: facts are plain data.

Every input is optional except that a plan or a run must be given; a report says
what it knows. Inputs may be live objects or their saved JSON (see
:func:`placer.report.inputs.as_data`).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

from placer.report.advice import advise
from placer.report.critical import bottleneck
from placer.data.report import (
    Bar,
    Dag,
    DagEdge,
    DagNode,
    DeviceInfo,
    ErrorRow,
    Meta,
    Option,
    ReportFacts,
    StageRow,
    Summary,
    TargetPlan,
    Timeline,
)
from placer.report.inputs import ReportInputError, as_data, option_seconds

OPTION_TITLES = {
    "plan": "chosen plan",
    "all_cpu": "all on the CPU",
    "all_gpu": "all on the GPU",
    "rule_of_thumb": "rule of thumb",
}
#: parameters longer than this are shortened in the table
PARAM_CHARS = 60


def collect(
    *,
    plan: Any = None,
    run: Any = None,
    baselines: Mapping[str, Any] | None = None,
    pipeline: Any = None,
    costs: Any = None,
    inventory: Any = None,
    predictions: Mapping[str, Mapping[str, Any]] | None = None,
    target: Any = None,
    made_at: str | None = None,
) -> ReportFacts:
    """Build the facts of a report.

    Parameters
    ----------
    plan : Plan, mapping or path, optional
        The chosen plan (placement, per-stage explanations, baselines, predicted
        schedule).
    run : Run, mapping or path, optional
        The measured run of the plan's placement.
    baselines : mapping, optional
        Measured runs of the alternatives, keyed ``all_cpu``, ``all_gpu``,
        ``rule_of_thumb``.
    pipeline : Pipeline, optional
        For the graph, the stages' docstrings and parameters.
    costs : CostTable, mapping or path, optional
        For edge bytes, predicted seconds on every device and loop-carried flags
        when the plan does not carry them.
    inventory : Inventory, mapping or path, optional
        This machine's devices (the devices present) and host description.
    predictions : mapping, optional
        ``{stage: {device: {"value", "rel_error", "label"}}}`` from the cost model.
    target : mapping, optional
        A :class:`~placer.data.report.TargetPlan` for a device this machine lacks.

    Returns
    -------
    ReportFacts

    Raises
    ------
    ReportInputError
        Neither a plan nor a run was given, or an input is malformed.
    """
    P, R, C, inv = as_data(plan, "plan"), as_data(run, "run"), as_data(costs, "cost table"), as_data(inventory, "inventory")
    B = {k: as_data(v, f"{k} run") for k, v in (baselines or {}).items() if v is not None}
    if P is None and R is None:
        raise ReportInputError("a report needs a plan or a run (or both); pass plan=... or run=...")
    if C is None and P is not None and isinstance(P.get("costs"), Mapping):
        C = P["costs"]
    ctx = _Context(P, R, B, C, inv, pipeline, predictions or {})
    placement = ctx.placement
    devices = ctx.devices()
    dev_kind = {d.name: d.kind for d in devices}
    measured = ctx.measured_seconds()
    predicted = ctx.predicted_seconds()
    edges = ctx.edges(dev_kind)
    rows = [ctx.stage_row(n, measured, predicted, edges, dev_kind) for n in ctx.order]
    timeline = ctx.timeline()
    summary = ctx.summary()
    errors = error_rows(rows, {d.name: d.present for d in devices})
    facts = ReportFacts(
        meta=ctx.meta(devices, made_at),
        summary=summary,
        dag=Dag(
            nodes=[DagNode(name=r.name, kind=r.kind, device=placement.get(r.name, r.device), doc=r.doc) for r in rows],
            edges=edges,
        ),
        stages=rows,
        timeline=timeline,
        errors=errors,
        target=TargetPlan.model_validate(as_data(target, "target plan")) if target is not None else None,
    )
    facts.bottleneck = bottleneck(facts)
    facts.advice = advise(facts)
    facts.summary.headline = headline(facts)
    return facts


class _Context:
    """The inputs as plain data, with the lookups every section needs."""

    def __init__(self, P, R, B, C, inv, pipeline, predictions):
        self.P, self.R, self.B, self.C, self.inv = P, R, B, C, inv
        self.pipeline = pipeline
        self.predictions = predictions
        self.plan_stages = {s["name"]: s for s in (P or {}).get("stages", []) if isinstance(s, Mapping)}
        self.cost_stages = {s["name"]: s for s in (C or {}).get("stages", [])}
        self.placement = dict((P or {}).get("placement") or (R or {}).get("placement") or {})
        self.order = self._order()
        for n in self.order:
            self.placement.setdefault(n, "cpu")

    # -- structure ------------------------------------------------------------------------
    def _order(self) -> list[str]:
        if self.pipeline is not None:
            return list(self.pipeline.order())
        if self.cost_stages:
            return list(self.cost_stages)
        if self.plan_stages:
            return list(self.plan_stages)
        return list(self.placement)

    def inputs(self, name: str) -> list[str]:
        if self.pipeline is not None:
            return list(dict.fromkeys(self.pipeline.stages[name].inputs.values()))
        return list(self.cost_stages.get(name, {}).get("inputs", []))

    def stage_attr(self, name: str, key: str, default: Any = None) -> Any:
        for src in (self.plan_stages.get(name, {}), self.cost_stages.get(name, {})):
            if src.get(key) is not None:
                return src[key]
        if self.pipeline is not None and key in ("kind", "doc"):
            return getattr(self.pipeline.stages[name], key)
        return default

    # -- devices --------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        """Devices of this machine (inventory, runs), then planned ones it lacks."""
        out: dict[str, DeviceInfo] = {}
        for d in (self.inv or {}).get("devices", []):
            out[d["name"]] = DeviceInfo(name=d["name"], kind=d["kind"], label=d.get("label", ""))
        for run in [self.R, *self.B.values()]:
            for name, label in (run or {}).get("devices", {}).items():
                out.setdefault(name, DeviceInfo(name=name, kind=kind_of(name), label=label))
        known = bool(out)  # without an inventory or a run, presence is unknown
        specs = (self.C or {}).get("devices", {})
        named = set(self.placement.values()) | set(specs)
        for row in self.plan_stages.values():
            named.update((row.get("predicted_s") or {}).keys())
        for row in self.predictions.values():
            named.update(row.keys())
        for name in sorted(named - set(out) - ({"gpu"} if "gpu:0" in out else set())):
            spec = specs.get(name, {})
            out[name] = DeviceInfo(name=name, kind=spec.get("kind", kind_of(name)),
                                   label=spec.get("label", ""), present=not known)
        rank = {"cpu": 0, "gpu": 1, "sim": 2}
        return sorted(out.values(), key=lambda d: (rank[d.kind], not d.present, d.name))

    # -- seconds --------------------------------------------------------------------------
    def measured_seconds(self) -> dict[str, dict[str, float]]:
        """``{stage: {device: seconds}}`` from the plan's run first, then the baselines."""
        out: dict[str, dict[str, float]] = {}
        for run in [self.R, *self.B.values()]:
            for rec in (run or {}).get("stages", []):
                if rec.get("status", "ok") == "ok":
                    out.setdefault(rec["name"], {}).setdefault(rec["device"], float(rec["seconds"]))
        return out

    def predicted_seconds(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for n in self.order:
            row = dict(self.cost_stages.get(n, {}).get("seconds") or {})
            row.update(self.plan_stages.get(n, {}).get("predicted_s") or {})
            for dev, pred in (self.predictions.get(n) or {}).items():
                row.setdefault(dev, _value(pred))
            out[n] = {d: (float(s) if s is not None else None) for d, s in row.items()}
        return out

    def label(self, stage: str, device: str) -> str:
        pred = (self.predictions.get(stage) or {}).get(device)
        if isinstance(pred, Mapping) and pred.get("label"):
            return str(pred["label"])
        labels = self.plan_stages.get(stage, {}).get("labels") or {}
        return str(labels.get(device, "predicted"))

    # -- edges ----------------------------------------------------------------------------
    def edges(self, dev_kind: Mapping[str, str]) -> list[DagEdge]:
        moved = {}
        for tr in (self.R or {}).get("transfers", []):
            moved.setdefault((tr["data"], tr["dst"]), tr)
        sched = {}
        for tr in ((self.P or {}).get("schedule") or {}).get("transfers", []):
            sched.setdefault((tr["data"], tr["dst"]), tr)
        out = []
        for dst in self.order:
            for src in self.inputs(dst):
                a, b = self.placement.get(src, "cpu"), self.placement.get(dst, "cpu")
                crosses = location(a, dev_kind) != location(b, dev_kind)
                key = (src, location(b, dev_kind))
                rec, was_measured = (moved.get(key), True) if key in moved else (sched.get(key), False)
                nbytes = rec.get("bytes") if rec else None
                if nbytes is None:
                    nbytes = self.output_bytes(src)
                out.append(DagEdge(src=src, dst=dst, bytes=nbytes, crosses=crosses,
                                   transfer_s=rec.get("seconds") if rec and crosses else None,
                                   measured=bool(rec) and was_measured))
        return out

    def output_bytes(self, name: str) -> float | None:
        for run in [self.R, *self.B.values()]:
            for rec in (run or {}).get("stages", []):
                if rec["name"] == name and rec.get("output_bytes"):
                    return float(rec["output_bytes"])
        b = self.cost_stages.get(name, {}).get("output_bytes")
        return float(b) if b is not None else None

    # -- rows -----------------------------------------------------------------------------
    def stage_row(self, name, measured, predicted, edges, dev_kind) -> StageRow:
        dev = self.placement.get(name, "cpu")
        meas = measured.get(name, {})
        pred = predicted.get(name, {})
        devs = list(dict.fromkeys([*pred, *meas]))
        ins = [e for e in edges if e.dst == name and e.crosses]
        outs = _out_transfers(name, self.R, self.P)
        speed, speed_measured = stage_speedup(dev, meas, pred, dev_kind)
        plan_row = self.plan_stages.get(name, {})
        return StageRow(
            name=name,
            kind=str(self.stage_attr(name, "kind", "other")),
            device=dev,
            doc=_first_line(str(self.stage_attr(name, "doc", "") or "")),
            params=self.params(name),
            predicted_s={d: pred.get(d) for d in devs if d in pred},
            measured_s={d: meas.get(d) for d in devs if d in meas},
            labels={d: self.label(name, d) for d in pred},
            in_bytes=sum(e.bytes or 0 for e in ins),
            in_s=_sum_or_none(e.transfer_s for e in ins),
            out_bytes=sum(t[0] for t in outs),
            out_s=_sum_or_none(t[1] for t in outs),
            speedup=speed,
            speedup_measured=speed_measured,
            reason=str(plan_row.get("reason") or ""),
            crossover_size=_float_or_none(plan_row.get("crossover_size")),
            loop_carried=bool(self.stage_attr(name, "loop_carried", False)),
        )

    def params(self, name: str) -> dict[str, str]:
        if self.pipeline is None:
            return {}
        out = {}
        for k, v in self.pipeline.stages[name].params.items():
            text = repr(v)
            out[str(k)] = text if len(text) <= PARAM_CHARS else text[: PARAM_CHARS - 1] + "…"
        return out

    # -- timeline -------------------------------------------------------------------------
    def timeline(self) -> Timeline:
        t = Timeline()
        if self.R is not None:
            for rec in self.R.get("stages", []):
                t.measured.append(Bar(lane=rec["lane"], label=rec["name"], kind="stage", device=rec["device"],
                                      start_s=rec["start_s"], end_s=rec["end_s"]))
            for tr in self.R.get("transfers", []):
                t.measured.append(Bar(lane=f"link {tr['src']}→{tr['dst']}", label=tr["data"], kind="transfer",
                                      device=tr["dst"] if tr["src"] == "host" else tr["src"],
                                      start_s=tr["start_s"], end_s=tr["end_s"], bytes=tr["bytes"],
                                      pinned=tr.get("pinned"), src=tr["src"], dst=tr["dst"]))
            t.measured_makespan_s = float(self.R["makespan_s"])
        sched = (self.P or {}).get("schedule")
        if sched:
            t.predicted = predicted_bars(sched, self.cpu_workers())
            t.predicted_makespan_s = _float_or_none(sched.get("makespan_s"))
        if self.P is not None and self.P.get("predicted_makespan_s") is not None:
            t.predicted_makespan_s = float(self.P["predicted_makespan_s"])
        return t

    def cpu_workers(self) -> int:
        for spec in (self.C or {}).get("devices", {}).values():
            if spec.get("kind") == "cpu":
                return int(spec.get("workers", 1))
        return int((self.R or {}).get("workers", 1))

    # -- summary --------------------------------------------------------------------------
    def summary(self) -> Summary:
        plan_pred = _float_or_none((self.P or {}).get("predicted_makespan_s"))
        plan_meas = _float_or_none((self.R or {}).get("makespan_s"))
        options = [Option(key="plan", title=OPTION_TITLES["plan"], placement=self.placement,
                          predicted_s=plan_pred, measured_s=plan_meas,
                          outputs_digest=(self.R or {}).get("outputs_digest"))]
        planned = (self.P or {}).get("baselines") or {}
        kinds = (self.P or {}).get("devices") or {}
        cpu_only = bool(kinds) and all(k == "cpu" for k in kinds.values())
        for key in ("all_cpu", "all_gpu", "rule_of_thumb"):
            pred, placement = option_seconds(planned.get(key))
            if cpu_only and key != "all_cpu":
                pred = None  # planned without an accelerator: the baseline is all-CPU again
            run = self.B.get(key)
            if pred is None and run is None and key not in planned:
                continue
            meas = _float_or_none((run or {}).get("makespan_s"))
            placement = placement or dict((run or {}).get("placement") or {})
            options.append(Option(
                key=key, title=option_title(key, placement, self.devices()), placement=placement, predicted_s=pred, measured_s=meas,
                plan_speedup_predicted=_ratio(pred, plan_pred), plan_speedup_measured=_ratio(meas, plan_meas),
                outputs_digest=(run or {}).get("outputs_digest"),
                note="" if run is not None else not_run_note(key, placement, self.devices()),
            ))
        digests = {o.outputs_digest for o in options if o.outputs_digest}
        agree = (len(digests) == 1) if len([o for o in options if o.outputs_digest]) > 1 else None
        return Summary(options=options, digests_agree=agree)

    def meta(self, devices: list[DeviceInfo], made_at: str | None) -> Meta:
        R, P = self.R or {}, self.P or {}
        host = dict((self.inv or {}).get("host") or {})
        versions = dict(R.get("versions") or {})
        for k in ("python", "torch", "numba"):
            if host.get(k) is not None:
                versions.setdefault(k, str(host[k]))
        versions.setdefault("placer", _placer_version())
        name = R.get("pipeline") or (self.pipeline.name if self.pipeline is not None else None) or P.get("pipeline") or "pipeline"
        size = R.get("size") if R.get("size") is not None else (P.get("size") or (self.C or {}).get("size"))
        if size is None and self.pipeline is not None:
            size = self.pipeline.size
        return Meta(
            pipeline=str(name), size=size, size_unit=str((self.C or {}).get("size_unit") or "rows"),
            made_at=made_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            run_started_at=str(R.get("started_at") or ""), versions=versions,
            machine={k: v for k, v in host.items() if k in ("machine", "cpu_model", "cores", "hostname")},
            devices=devices, planning_s=_float_or_none(P.get("planning_s")),
            objective=str(P.get("objective") or "makespan"), executor=str(R.get("executor") or ""),
            outputs_digest=R.get("outputs_digest"),
        )


# -- small pure helpers ----------------------------------------------------------------------
def kind_of(device: str) -> str:
    """The kind of a device from its name (``cpu``, ``gpu-sim`` → ``sim``, else ``gpu``)."""
    if device == "cpu":
        return "cpu"
    return "sim" if device == "gpu-sim" else "gpu"


def location(device: str, dev_kind: Mapping[str, str]) -> str:
    """Where a device's data lives: ``host`` for the CPU, else the device itself."""
    return "host" if dev_kind.get(device, kind_of(device)) == "cpu" else ("gpu:0" if device == "gpu" else device)


def stage_speedup(device: str, meas: Mapping[str, float], pred: Mapping[str, float | None],
                  dev_kind: Mapping[str, str]) -> tuple[float | None, bool]:
    """CPU seconds over the chosen device's seconds; measured when both were measured."""
    cpu = next((d for d, k in dev_kind.items() if k == "cpu"), "cpu")
    if device == cpu:
        return 1.0, cpu in meas
    if cpu in meas and device in meas and meas[device] > 0:
        return meas[cpu] / meas[device], True
    a, b = pred.get(cpu), pred.get(device)
    if a is not None and b:
        return a / b, False
    return None, False


def error_rows(rows: list[StageRow], present: Mapping[str, bool]) -> list[ErrorRow]:
    """Predicted against measured seconds, per stage and device."""
    out = []
    for r in rows:
        for dev, pred in r.predicted_s.items():
            if pred is None:
                continue
            meas = r.measured_s.get(dev)
            err = (pred - meas) / meas if meas else None
            out.append(ErrorRow(stage=r.name, device=dev, predicted_s=pred, measured_s=meas, rel_error=err,
                                label=r.labels.get(dev, "predicted"),
                                prediction_only=not present.get(dev, False)))
    return out


def predicted_bars(schedule: Mapping[str, Any], cpu_workers: int) -> list[Bar]:
    """Bars of a simulated schedule; CPU stages go to the first free CPU worker lane."""
    bars, free_at = [], [0.0] * max(1, cpu_workers)
    for ev in sorted(schedule.get("stages", []), key=lambda e: (e["start_s"], e["name"])):
        lane = ev["device"]
        if kind_of(ev["device"]) == "cpu":
            w = min(range(len(free_at)), key=lambda i: (free_at[i] > ev["start_s"] + 1e-12, i))
            free_at[w] = ev["end_s"]
            lane = f"cpu/{w}"
        bars.append(Bar(lane=lane, label=ev["name"], kind="stage", device=ev["device"],
                        start_s=ev["start_s"], end_s=ev["end_s"]))
    for tr in schedule.get("transfers", []):
        bars.append(Bar(lane=f"link {tr['src']}→{tr['dst']}", label=tr["data"], kind="transfer",
                        device=tr["dst"] if tr["src"] == "host" else tr["src"],
                        start_s=tr["start_s"], end_s=tr["end_s"], bytes=tr.get("bytes"),
                        src=tr["src"], dst=tr["dst"]))
    return bars


def option_title(key: str, placement: Mapping[str, str], devices: list[DeviceInfo]) -> str:
    """The option's name; an option on the simulated device says so and is not called GPU."""
    sim = sorted({d.name for d in devices if d.kind == "sim"} & set(placement.values()))
    if key == "all_gpu" and sim:
        return f"all on {sim[0]} (simulated test device)"
    if key == "rule_of_thumb" and sim:
        return f"rule of thumb (accelerator: {sim[0]}, simulated)"
    return OPTION_TITLES[key]


def not_run_note(key: str, placement: Mapping[str, str], devices: list[DeviceInfo]) -> str:
    """Why a baseline has no measurement."""
    present = {d.name for d in devices if d.present}
    missing = sorted({d for d in placement.values() if d not in present and d != "gpu"})
    if key in ("all_gpu", "rule_of_thumb") and not any(d.kind != "cpu" and d.present for d in devices):
        return "not run: this machine has no GPU"
    if missing:
        return f"not run: {', '.join(missing)} absent here (predicted only)"
    return "not run"


def headline(facts: ReportFacts) -> str:
    """One sentence: where the plan runs things and how it compares with the CPU."""
    on = {}
    for r in facts.stages:
        on.setdefault(r.device, []).append(r.name)
    where = "; ".join(f"{', '.join(names)} on {device_title(facts, d)}" for d, names in on.items())
    cpu = next((o for o in facts.summary.options if o.key == "all_cpu"), None)
    plan = facts.summary.options[0]
    if cpu is not None and cpu.plan_speedup_measured is not None:
        cmp = f"measured {cpu.plan_speedup_measured:.2f}× the speed of all-CPU"
    elif cpu is not None and cpu.plan_speedup_predicted is not None:
        cmp = f"predicted {cpu.plan_speedup_predicted:.2f}× the speed of all-CPU"
    else:
        cmp = ""
    secs = plan.measured_s if plan.measured_s is not None else plan.predicted_s
    tail = f" ({secs:.3g} s{', ' + cmp if cmp else ''})" if secs is not None else ""
    return f"The plan runs {where}{tail}."


def device_title(facts: ReportFacts, name: str) -> str:
    d = facts.device(name)
    return d.title if d is not None else name


def _out_transfers(name: str, R, P) -> list[tuple[float, float | None]]:
    recs = [t for t in (R or {}).get("transfers", []) if t["data"] == name]
    if R is None:
        recs = [t for t in ((P or {}).get("schedule") or {}).get("transfers", [])
                if t["data"] == name and not t.get("external")]
    return [(float(t.get("bytes") or 0), _float_or_none(t.get("seconds"))) for t in recs]


def _value(pred: Any) -> float | None:
    if isinstance(pred, Mapping):
        return _float_or_none(pred.get("value"))
    return _float_or_none(pred)


def _float_or_none(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _sum_or_none(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _placer_version() -> str:
    try:
        from importlib.metadata import version

        return version("placer")
    except Exception:
        return "unknown"
