"""What planning knows about a pipeline at a site: its measurements, cost model, devices and network.

May import: placer.data, placer.devices; placer.optimize inside :meth:`Costs.plan`.

A site (:mod:`placer.site`: this machine; :mod:`placer.cluster`: a dask cluster)
measures a pipeline and fits a cost model; :class:`Costs` holds the result, builds
the :class:`~placer.data.cost_table.CostTable` at any size (with the network between
machines when there is one) and plans over it. It sits below both sites, so that
neither imports the other to share it.
"""

from __future__ import annotations

from typing import Any

from placer.data.cost_table import CostTable
from placer.devices import Inventory


class Costs:
    """What planning knows about a pipeline at a site: measurements, model, devices, network.

    Attributes
    ----------
    inventory : Inventory
        The site's devices.
    profile : Profile
        The stages as measured (under the site's device names).
    model : CostModel
        Fitted to ``profile`` (and to any described device).
    devices : list of str
        The devices to plan over: the CPU and every accelerator with measurements.
    size : int
        The size to plan for.
    network : dict or None
        ``{"latency_s", "bandwidth_Bps"}`` between the machines devices run on (a
        cluster's workers); None on one machine.
    notes : list of str
        Where each device was profiled, what the network measured.
    described : list of str
        Devices the site lacks, predicted from a description (planned apart, see
        :meth:`plan` with ``devices``).
    no_accelerator_reason : str or None
        Why the site has no accelerator to plan over, when that is worth a warning
        on the plan (a cluster without GPU workers).
    """

    no_accelerator_reason: str | None = None
    #: how the target's predictions were made (CPU scaling), for its plan
    target_notes: list[str] = []
    #: what the site is called in a plan's reasons
    where = "this machine"

    def __init__(self, inventory: Inventory, profile: Any, model: Any, devices: list[str], size: int,
                 network: dict[str, float] | None = None, notes: list[str] | None = None,
                 described: list[str] | None = None, target: Any = None, target_model: Any = None):
        self.inventory, self.profile, self.model = inventory, profile, model
        self.devices, self.size = devices, size
        self.network, self.notes = network, list(notes or [])
        self.described = list(described or [])
        #: the described machine (a placer.target.TargetDescription) and its cost model, whose
        #: ``cpu`` is the target's CPU when the target describes one
        self.target = target
        self.target_model = target_model if target_model is not None else model

    def table(self, size: float | None = None, devices: list[str] | None = None, *,
              target: bool = False) -> CostTable:
        """The :class:`~placer.data.cost_table.CostTable` at ``size`` (default :attr:`size`) over ``devices``
        (default :attr:`devices`; with ``target``, the target's CPU and GPUs), with the network when
        there is one."""
        if target:
            return self.target_model.table(self.size if size is None else size,
                                           devices=devices or ["cpu", *self.described])
        table = self.model.table(self.size if size is None else size, devices=devices or self.devices)
        if self.network is None or len(table.devices) < 2:
            return table
        doc = table.model_dump(exclude_defaults=True)
        doc["network"] = dict(self.network)
        return CostTable.model_validate(doc)

    def predictions(self, size: float | None = None) -> dict[str, dict[str, dict]]:
        """Stage → device → the prediction (value, error, label) at ``size``, described devices included."""
        at = self.size if size is None else size
        out = {s: {d: pr.model_dump() for d, pr in devs.items()}
               for s, devs in self.model.predictions(at, self.devices).items()}
        if self.described:
            for s, devs in self.target_model.predictions(at, self.described).items():
                out.setdefault(s, {}).update({d: pr.model_dump() for d, pr in devs.items()})
        return out

    def plan(self, *, objective: str = "makespan", method: str = "auto", deadline_s: float | None = None,
             size: float | None = None, devices: list[str] | None = None, target: bool = False):
        """The best placement at ``size`` over ``devices``, with crossover sizes over the same devices
        (with ``target``: over the described target machine, its CPU included).

        Returns
        -------
        Plan
            As :func:`placer.optimize.plan`.
        """
        from placer.optimize import plan

        at = self.size if size is None else size

        def cost_at(s: float) -> CostTable:
            return self.table(s, devices, target=target)

        table = cost_at(at)
        result = plan(table, objective=objective, method=method, deadline_s=deadline_s,
                      cost_at=cost_at, size=at)
        model = self.target_model if target else self.model
        plan_precisions(result, table, self.profile, model)
        why = self.no_accelerator_reason
        if target and self.target is not None:
            result.warnings += [n for n in self.target_notes if n not in result.warnings]
        if why and len(result.devices) == 1 and not target:
            for st in result.stages:
                st.reason += f" ({self.where} has no GPU: {why})"
            result.warnings.append(f"every stage is planned on the CPU: {why}")
        return result


#: a precision not allowed is pointed out when predicted at least this many times faster
MUCH_FASTER = 2.0


def plan_precisions(result: Any, table: CostTable, profile: Any, model: Any = None) -> None:
    """Give ``result`` (a Plan) each stage's planned precision, the what-if times per precision and
    the reason with both numbers (predicted time, measured difference); with ``model``, a note for
    a stage that allows no lower precision where one is predicted :data:`MUCH_FASTER` or more."""
    by = {st.name: st for st in table.stages}
    for ch in result.stages:
        sc = by.get(ch.name)
        if sc is None:
            continue
        if not sc.precision_s:
            _not_allowed(result, ch, profile, model)
            continue
        ch.precision_s = {d: dict(t) for d, t in sc.precision_s.items()}
        ch.precision = sc.precision.get(ch.device, "fp32")
        if ch.precision != "fp32":
            result.precision[ch.name] = ch.precision
        words = precision_reason(ch.name, ch.device, ch.precision, ch.precision_s.get(ch.device, {}), profile)
        if words:
            ch.reason = f"{ch.reason}; {words}" if ch.reason else words


def precision_reason(stage: str, device: str, chosen: str, times: dict[str, float], profile: Any) -> str:
    """Why ``stage`` runs in ``chosen`` on ``device``: both numbers for the chosen precision, and why each
    other allowed one was not chosen."""
    sp = profile.stages.get(stage) if profile is not None else None
    checks = {c.precision: c for c in getattr(sp, "precision_checks", [])}
    fp32 = times.get("fp32")
    parts = []
    if chosen != "fp32" and fp32:
        share = _tensor_share(sp)
        txt = f"{chosen} on {device}: {_ms(times[chosen])} against {_ms(fp32)} in fp32"
        if share is not None:
            txt += f", predicted from {share:.0%} tensor-core FLOPs"
        if chosen in checks:
            txt += f"; {checks[chosen].words()}"
        else:
            txt += " (fixed by --precision; accuracy not checked)"
        parts.append(txt)
    for p, c in checks.items():
        if p == chosen:
            continue
        if not c.ok:
            parts.append(f"{p} not chosen: {c.words()}")
        elif p in times and fp32:
            parts.append(f"{p} not chosen: {_ms(times[p])} against {_ms(fp32)} in fp32 on {device}")
        else:
            parts.append(f"{p} not chosen: no prediction for it on {device}")
    return "; ".join(parts)


def _not_allowed(result: Any, ch: Any, profile: Any, model: Any) -> None:
    ratio = getattr(model, "precision_ratio", None)
    if ratio is None:
        return
    r = ratio(ch.name, ch.device, "bf16", result.size)
    if r and r > 0 and 1.0 / r >= MUCH_FASTER:
        result.precision_notes.append(
            f"allow bf16 on {ch.name!r} (precision=(\"bf16\",) on the stage, or --precision auto) for a predicted "
            f"{1.0 / r:.1f}x on {ch.device}; placer measures its accuracy here before choosing it")


def _tensor_share(sp: Any) -> float | None:
    if sp is None or not sp.work:
        return None
    w = max(sp.work, key=lambda w: w.size).work
    return w.tensor_flops / w.flops if w.flops > 0 and w.tensor_flops > 0 else None


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


__all__ = ["Costs", "plan_precisions"]
