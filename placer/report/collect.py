"""Gathering a report's facts from a plan, its run, the baseline runs and the costs.

May import: networkx (through the pipeline object), placer.data, placer.devices (the
registry, for a device's kind), placer.report.{inputs,check,critical,advice,streams,kinds}. Never
torch, dask or matplotlib: facts are plain data.

Every input is optional except that a plan or a run must be given; a report says
what it knows. Inputs may be live models or their saved JSON: they are read into
placer's models first (:func:`placer.report.inputs.load_inputs`) and refused when they
do not belong together (:func:`placer.report.check.check`), so every fact below is read
from a declared field.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from placer.data.cost_table import StageCost
from placer.data.plan import Schedule, StageChoice
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
    StreamFacts,
    StreamOption,
    Summary,
    Timeline,
)
from placer.data.run import Run
from placer.data.stream import StreamPlan
from placer.devices import HOST, kind_for
from placer.report.advice import advise
from placer.report.check import check
from placer.report.critical import bottleneck
from placer.report.inputs import Inputs, ReportInputError, load_inputs
from placer.report.kinds import alias_of, is_accelerator
from placer.report.kinds import rank as kind_rank
from placer.report.streams import add_plan, stream_facts

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
    step_only: Mapping[str, float] | None = None,
    stream_plans: Sequence[StreamPlan] = (),
    option_runs: Mapping[str, Sequence[float]] | None = None,
) -> ReportFacts:
    """Build the facts of a report.

    Parameters
    ----------
    plan : Plan, mapping or path, optional
        The chosen plan (placement, per-stage explanations, baselines, predicted
        schedule).
    run : Run, mapping or path, optional
        The measured run of the plan's placement: it must have placed every stage
        where the plan does.
    baselines : mapping, optional
        Measured runs (Run, mapping or path) of the alternatives, keyed ``all_cpu``,
        ``all_gpu``, ``rule_of_thumb``.
    pipeline : Pipeline, optional
        For the graph, the stages' docstrings and parameters.
    costs : CostTable, mapping or path, optional
        For edge bytes, predicted seconds on every device and loop-carried flags
        when the plan does not carry them.
    inventory : Inventory, mapping or path, optional
        This machine's devices (the devices present) and host description.
    predictions : mapping, optional
        ``{stage: {device: Prediction}}`` (or its ``model_dump``) from the cost model.
    target : TargetPlan, mapping or path, optional
        A plan for a device this machine lacks.
    step_only : mapping, optional
        ``{step: samples per second}`` of a stream's step measured alone (fed from
        memory), when a profile measured it: the stream's bottleneck sentence and
        advice then compare the stream with it.
    option_runs : mapping, optional
        ``{option: [samples/s of each run]}`` of the first stream's plan and baselines where they ran
        more than once (``run`` and ``baselines`` then hold each one's median run, the lower middle one of
        an even count); each option's measured samples/s is then the median of its runs, and the plan's
        speed-up the ratio of the medians.
    stream_plans : sequence of StreamPlan, optional
        The plans the stream runs followed: each stream's facts then carry the
        predicted samples/s, the reasons, the plan against the usual settings
        (predicted, and measured where ``baselines`` holds a run of that name) and
        the what-if table.

    Returns
    -------
    ReportFacts

    Raises
    ------
    ReportInputError
        Neither a plan nor a run was given, or an input is malformed.
    MismatchedInputsError
        The inputs are of different pipelines or stages, or the run is not the plan's.
    """
    inputs = load_inputs(plan=plan, run=run, baselines=baselines, pipeline=pipeline, costs=costs,
                         inventory=inventory, predictions=predictions, target=target)
    if inputs.plan is None and inputs.run is None:
        raise ReportInputError("a report needs a plan or a run (or both); pass plan=... or run=...")
    check(inputs)
    ctx = _Context(inputs)
    devices = ctx.devices
    measured = ctx.measured_seconds()
    predicted = ctx.predicted_seconds()
    edges = ctx.edges()
    rows = [ctx.stage_row(n, measured, predicted, edges) for n in ctx.order]
    facts = ReportFacts(
        meta=ctx.meta(made_at),
        summary=ctx.summary(),
        dag=Dag(
            nodes=[DagNode(name=r.name, kind=r.kind, device=ctx.placement.get(r.name, r.device), doc=r.doc)
                   for r in rows],
            edges=edges,
        ),
        stages=rows,
        timeline=ctx.timeline(),
        errors=error_rows(rows, {d.name: d.present for d in devices}),
        target=inputs.target.model_copy(deep=True) if inputs.target is not None else None,
    )
    if inputs.run is not None and inputs.run.streams:
        facts.streams = [stream_facts(s, (step_only or {}).get(s.step)) for s in inputs.run.streams]
        measured = {name: r.streams[0] for name, r in inputs.baselines.items() if r.streams}
        for sp in stream_plans:
            for sf in facts.streams:
                if sf.source == sp.source:
                    add_plan(sf, sp, measured)
                    if option_runs and sp is stream_plans[0] and sf.options:
                        sf.options_runs = min(len(v) for v in option_runs.values())
                        sf.claim_runs = len(option_runs.get("plan", []))
                        median_of_runs(sf.options, option_runs)
    facts.bottleneck = bottleneck(facts)
    facts.advice = advise(facts)
    facts.summary.headline = headline(facts)
    return facts


def median_of_runs(options: Sequence[StreamOption], option_runs: Mapping[str, Sequence[float]]) -> None:
    """Each option's runs, their median as its measured samples/s, and the plan's speed-up over it: the median
    of the plan's run over the option's in each round (the k-th runs of each ran one after the other; the plan's
    rounds beyond an option's, run with the plain loop alone, are its own), or the ratio of the medians where
    an option ran once or more often than the plan. The median of an even count is the mean of the middle two.

    Runs of one round share the machine's state of that moment: on a machine whose processes run at a
    fraction of their rate for seconds at a time, the ratio of two settings' medians can claim a gain of
    half where the rounds' own ratios, and the script, show none."""
    for o in options:
        o.measured_runs = [round(x, 1) for x in option_runs.get(o.name, [])]
        if option_runs.get(o.name):
            o.measured_samples_per_s = float(statistics.median(option_runs[o.name]))
    plan = next((o for o in options if o.name == "plan"), None)
    ours = plan.measured_samples_per_s if plan is not None else None
    mine = list(option_runs.get("plan", []))
    for o in options:
        if o is plan or not ours or not o.measured_samples_per_s:
            continue
        theirs = list(option_runs.get(o.name, []))
        if 1 < len(theirs) <= len(mine) and all(x > 0 for x in theirs):
            o.plan_speedup_measured = float(statistics.median(a / b for a, b in zip(mine, theirs)))
        else:
            o.plan_speedup_measured = ours / o.measured_samples_per_s


class _Context:
    """The inputs as models, with the lookups every section needs."""

    def __init__(self, inputs: Inputs):
        self.inputs = i = inputs
        self.plan, self.run, self.costs, self.pipeline = i.plan, i.run, i.costs, i.pipeline
        #: the plan's run first, then the baselines
        self.runs: list[Run] = [r for r in [i.run, *i.baselines.values()] if r is not None]
        self.plan_stages: dict[str, StageChoice] = {s.name: s for s in (i.plan.stages if i.plan else [])}
        self.cost_stages: dict[str, StageCost] = {s.name: s for s in (i.costs.stages if i.costs else [])}
        self.placement = dict((i.plan.placement if i.plan else {}) or (i.run.placement if i.run else {}))
        self.order = self._order()
        for n in self.order:
            self.placement.setdefault(n, "cpu")
        self.devices = self._devices()
        self.kinds = {d.name: d.kind for d in self.devices}

    # -- structure ------------------------------------------------------------------------
    def _order(self) -> list[str]:
        if self.pipeline is not None:
            return list(self.pipeline.order())
        if self.cost_stages:
            return list(self.cost_stages)
        if self.plan_stages:
            return list(self.plan_stages)
        return list(self.placement)

    def inputs_of(self, name: str) -> list[str]:
        if self.pipeline is not None:
            return list(dict.fromkeys(self.pipeline.stages[name].inputs.values()))
        cost = self.cost_stages.get(name)
        return list(cost.inputs) if cost is not None else []

    def stage_kind(self, name: str) -> str:
        """The plan's kind for the stage, else the cost table's, else the pipeline's."""
        for src in (self.plan_stages.get(name), self.cost_stages.get(name)):
            if src is not None:
                return src.kind
        return self.pipeline.stages[name].kind if self.pipeline is not None else "other"

    def stage_doc(self, name: str) -> str:
        """The first line of the stage's docstring (only a live pipeline has them)."""
        return _first_line(str(self.pipeline.stages[name].doc or "")) if self.pipeline is not None else ""

    # -- devices --------------------------------------------------------------------------
    def _devices(self) -> list[DeviceInfo]:
        """Devices of this machine (inventory, runs), then planned ones it lacks."""
        out: dict[str, DeviceInfo] = {}
        inv = self.inputs.inventory
        for d in inv.devices if inv is not None else []:
            out[d.name] = DeviceInfo(name=d.name, kind=d.kind, label=d.label)
        for run in self.runs:
            for name, label in run.devices.items():
                out.setdefault(name, DeviceInfo(name=name, kind=self.planned_kind(name), label=label))
        known = bool(out)  # without an inventory or a run, presence is unknown
        specs = self.costs.devices if self.costs is not None else {}
        named = set(self.placement.values()) | set(specs)
        for row in self.plan_stages.values():
            named.update(row.predicted_s)
        for row in self.inputs.predictions.values():
            named.update(row)
        for name in sorted(n for n in named - set(out) if alias_of(n) not in out):  # gpu when gpu:0 is listed
            spec = specs.get(name)
            out[name] = DeviceInfo(name=name, kind=self.planned_kind(name), label=spec.label if spec else "",
                                   present=not known)
        return sorted(out.values(), key=lambda d: (kind_rank(d.kind), not d.present, d.name))

    def planned_kind(self, name: str) -> str:
        """A device's kind from the cost table or the plan; from its name when neither has it.

        A run records its devices' labels, not their kinds: a report made from runs
        alone (no inventory, plan or cost table) tells the kind by the name.
        """
        if self.costs is not None and name in self.costs.devices:
            return self.costs.devices[name].kind
        if self.plan is not None and name in self.plan.devices:
            return self.plan.devices[name]
        return kind_by_name(name)

    def kind(self, name: str) -> str:
        """A device's kind as the report names it (``gpu`` is ``gpu:0`` when that is listed)."""
        if name in self.kinds:
            return self.kinds[name]
        if alias_of(name) in self.kinds:
            return self.kinds[alias_of(name)]
        return self.planned_kind(name)

    def location(self, device: str) -> str:
        """Where a device's data lives: ``host`` for the CPU, else the device itself."""
        return alias_of(device) if is_accelerator(self.kind(device)) else HOST

    # -- seconds --------------------------------------------------------------------------
    def measured_seconds(self) -> dict[str, dict[str, float]]:
        """``{stage: {device: seconds}}`` from the plan's run first, then the baselines."""
        out: dict[str, dict[str, float]] = {}
        for run in self.runs:
            for rec in run.stages:
                if rec.status == "ok":
                    out.setdefault(rec.name, {}).setdefault(rec.device, float(rec.seconds))
        return out

    def predicted_seconds(self) -> dict[str, dict[str, float | None]]:
        """The cost table's seconds, overridden by the plan's, completed by the predictions."""
        out: dict[str, dict[str, float | None]] = {}
        for n in self.order:
            cost, choice = self.cost_stages.get(n), self.plan_stages.get(n)
            row: dict[str, float | None] = dict(cost.seconds) if cost is not None else {}
            row.update(choice.predicted_s if choice is not None else {})
            for dev, pred in self.inputs.predictions.get(n, {}).items():
                row.setdefault(dev, pred.value)
            out[n] = {d: (float(s) if s is not None else None) for d, s in row.items()}
        return out

    def label(self, stage: str, device: str) -> str:
        pred = self.inputs.predictions.get(stage, {}).get(device)
        return pred.label if pred is not None else "predicted"

    # -- edges ----------------------------------------------------------------------------
    def edges(self) -> list[DagEdge]:
        moved = {}
        for tr in self.run.transfers if self.run is not None else []:
            moved.setdefault((tr.data, tr.dst), tr)
        sched = {}
        for tr in self.plan.schedule.transfers if self.plan is not None else []:
            sched.setdefault((tr.data, tr.dst), tr)
        out = []
        for dst in self.order:
            for src in self.inputs_of(dst):
                a, b = self.placement.get(src, "cpu"), self.placement.get(dst, "cpu")
                crosses = self.location(a) != self.location(b)
                key = (src, self.location(b))
                rec, was_measured = (moved.get(key), True) if key in moved else (sched.get(key), False)
                nbytes = rec.bytes if rec is not None else self.output_bytes(src)
                out.append(DagEdge(src=src, dst=dst, bytes=nbytes, crosses=crosses,
                                   transfer_s=rec.seconds if rec is not None and crosses else None,
                                   measured=rec is not None and was_measured))
        return out

    def output_bytes(self, name: str) -> float | None:
        for run in self.runs:
            for rec in run.stages:
                if rec.name == name and rec.output_bytes:
                    return float(rec.output_bytes)
        cost = self.cost_stages.get(name)
        return float(cost.output_bytes) if cost is not None else None

    def out_transfers(self, name: str) -> list[tuple[float, float | None]]:
        """``(bytes, seconds)`` of each copy of the stage's output: measured, else planned."""
        if self.run is not None:
            return [(float(t.bytes or 0), float(t.seconds)) for t in self.run.transfers if t.data == name]
        if self.plan is None:
            return []
        return [(float(t.bytes or 0), float(t.seconds)) for t in self.plan.schedule.transfers
                if t.data == name and not t.external]

    # -- rows -----------------------------------------------------------------------------
    def stage_row(self, name, measured, predicted, edges) -> StageRow:
        dev = self.placement.get(name, "cpu")
        meas = measured.get(name, {})
        pred = predicted.get(name, {})
        devs = list(dict.fromkeys([*pred, *meas]))
        ins = [e for e in edges if e.dst == name and e.crosses]
        outs = self.out_transfers(name)
        speed, speed_measured = stage_speedup(dev, meas, pred, self.kinds)
        choice, cost = self.plan_stages.get(name), self.cost_stages.get(name)
        return StageRow(
            name=name,
            kind=str(self.stage_kind(name)),
            device=dev,
            doc=self.stage_doc(name),
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
            reason=choice.reason if choice is not None else "",
            crossover_size=choice.crossover_size if choice is not None else None,
            loop_carried=cost.loop_carried if cost is not None else False,
            precision=self.precision(name, choice),
        )

    def precision(self, name: str, choice: Any) -> str:
        """What the stage ran in (the run's record), else what the plan chose."""
        if self.run is not None:
            rec = next((s for s in self.run.stages if s.name == name), None)
            if rec is not None:
                return getattr(rec, "precision", "fp32") or "fp32"
        return getattr(choice, "precision", "fp32") if choice is not None else "fp32"

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
        if self.run is not None:
            for rec in self.run.stages:
                t.measured.append(Bar(lane=rec.lane if rec.workers is None else stream_lane(rec.name, rec.workers),
                                      label=rec.name, kind="stage", device=rec.device,
                                      start_s=rec.start_s, end_s=rec.end_s))
            for tr in self.run.transfers:
                t.measured.append(Bar(lane=f"link {tr.src}→{tr.dst}", label=tr.data, kind="transfer",
                                      device=tr.dst if tr.src == HOST else tr.src,
                                      start_s=tr.start_s, end_s=tr.end_s, bytes=tr.bytes,
                                      pinned=tr.pinned, src=tr.src, dst=tr.dst))
            t.measured_makespan_s = float(self.run.makespan_s)
        if self.plan is not None:
            t.predicted = predicted_bars(self.plan.schedule, self.cpu_workers(), self.kind)
            t.predicted_makespan_s = float(self.plan.predicted_makespan_s)
        return t

    def cpu_workers(self) -> int:
        for spec in self.costs.devices.values() if self.costs is not None else []:
            if spec.kind == "cpu":
                return int(spec.workers)
        return int(self.run.workers) if self.run is not None else 1

    # -- summary --------------------------------------------------------------------------
    def summary(self) -> Summary:
        plan, run = self.plan, self.run
        plan_pred = float(plan.predicted_makespan_s) if plan is not None else None
        plan_meas = float(run.makespan_s) if run is not None else None
        options = [Option(key="plan", title=OPTION_TITLES["plan"], placement=self.placement,
                          predicted_s=plan_pred, measured_s=plan_meas,
                          outputs_digest=run.outputs_digest if run is not None else None)]
        planned = plan.baselines if plan is not None else {}
        kinds = plan.devices if plan is not None else {}
        cpu_only = bool(kinds) and all(k == "cpu" for k in kinds.values())
        for key in ("all_cpu", "all_gpu", "rule_of_thumb"):
            pred = planned.get(key)
            if cpu_only and key != "all_cpu":
                pred = None  # planned without an accelerator: the baseline is all-CPU again
            base = self.inputs.baselines.get(key)
            if pred is None and base is None and key not in planned:
                continue
            meas = float(base.makespan_s) if base is not None else None
            placement = dict(base.placement) if base is not None else {}
            options.append(Option(
                key=key, title=option_title(key, placement, self.devices), placement=placement,
                predicted_s=pred, measured_s=meas,
                plan_speedup_predicted=_ratio(pred, plan_pred), plan_speedup_measured=_ratio(meas, plan_meas),
                outputs_digest=base.outputs_digest if base is not None else None,
                note="" if base is not None else not_run_note(key, placement, self.devices),
            ))
        digests = {o.outputs_digest for o in options if o.outputs_digest}
        agree = (len(digests) == 1) if len([o for o in options if o.outputs_digest]) > 1 else None
        return Summary(options=options, digests_agree=agree)

    def meta(self, made_at: str | None) -> Meta:
        plan, run, costs, inv = self.plan, self.run, self.costs, self.inputs.inventory
        host = dict(inv.host) if inv is not None else {}
        versions = dict(run.versions) if run is not None else {}
        for k in ("python", "torch", "numba"):
            if host.get(k) is not None:
                versions.setdefault(k, str(host[k]))
        versions.setdefault("placer", _placer_version())
        return Meta(
            pipeline=self.pipeline_name(), size=self.size(),
            size_unit=(costs.size_unit if costs is not None else plan.size_unit if plan is not None
                       else run.size_unit if run is not None else "rows"),
            made_at=made_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            run_started_at=run.started_at if run is not None else "", versions=versions,
            machine={k: v for k, v in host.items() if k in ("machine", "cpu_model", "cores", "hostname")},
            devices=self.devices, planning_s=plan.planning_s if plan is not None else None,
            objective=(plan.objective if plan is not None else "") or "makespan",
            executor=run.executor if run is not None else "",
            outputs_digest=run.outputs_digest if run is not None else None,
        )

    def pipeline_name(self) -> str:
        """The run's pipeline, else the live pipeline's name (a plan does not record it)."""
        return ((self.run.pipeline if self.run is not None else "")
                or (self.pipeline.name if self.pipeline is not None else "") or "pipeline")

    def size(self) -> float | None:
        """The run's size, else the plan's, else the cost table's, else the pipeline's."""
        if self.run is not None and self.run.size is not None:
            return self.run.size
        size = (self.plan.size if self.plan is not None else None) or (
            self.costs.size if self.costs is not None else None)
        if size is None and self.pipeline is not None:
            size = self.pipeline.size
        return size


# -- small pure helpers ----------------------------------------------------------------------
def kind_by_name(device: str) -> str:
    """A device's kind told by its name alone, through the device registry (``gpu`` for a
    name no registered kind knows, such as a described device).

    Only for a device no inventory, plan or cost table describes: runs record their
    devices' labels, not their kinds.
    """
    kind = kind_for(device)
    return "gpu" if kind is None else kind.name


def stream_lane(name: str, workers: int) -> str:
    """The timeline lane of a stream's stage: ``stream: augment ×2`` (it ran for the whole stream)."""
    return f"stream: {name}" + (f" ×{workers}" if workers > 1 else "")


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


def predicted_bars(schedule: Schedule, cpu_workers: int, kind: Callable[[str], str]) -> list[Bar]:
    """Bars of a simulated schedule; CPU stages go to the first free CPU worker lane.

    ``kind(device)`` is the device's kind (``cpu``, ``gpu`` or ``sim``).
    """
    bars, free_at = [], [0.0] * max(1, cpu_workers)
    for ev in sorted(schedule.stages, key=lambda e: (e.start_s, e.name)):
        lane = ev.device
        if kind(ev.device) == "cpu":
            w = min(range(len(free_at)), key=lambda i: (free_at[i] > ev.start_s + 1e-12, i))
            free_at[w] = ev.end_s
            lane = f"cpu/{w}"
        bars.append(Bar(lane=lane, label=ev.name, kind="stage", device=ev.device,
                        start_s=ev.start_s, end_s=ev.end_s))
    for tr in schedule.transfers:
        bars.append(Bar(lane=f"link {tr.src}→{tr.dst}", label=tr.data, kind="transfer",
                        device=tr.dst if tr.src == HOST else tr.src,
                        start_s=tr.start_s, end_s=tr.end_s, bytes=tr.bytes,
                        src=tr.src, dst=tr.dst))
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
    return f"The plan runs {where}{tail}." + "".join(stream_headline(s) for s in facts.streams or [])


def stream_headline(s: StreamFacts) -> str:
    """`` The stream a → b ran at 1,056 samples/s; the step waited for data 1% of the time.``"""
    return (f" The stream {s.source} → {s.step} ran at {s.samples_per_s:,.0f} samples/s; "
            f"the step waited for data {s.consumer_idle_fraction:.0%} of the time.")


def device_title(facts: ReportFacts, name: str) -> str:
    d = facts.device(name)
    return d.title if d is not None else name


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
