"""The JSON files placer writes and reads, each with a pydantic model and so a JSON Schema.

May import: pydantic, placer.data.

``placer schema NAME`` prints :func:`json_schema` of one of :data:`DOCUMENTS`; the
schemas are also kept under ``docs/schemas/`` (a test checks they are current).

==============  ==============================================  =====================================
name            file                                            model
==============  ==============================================  =====================================
``profile``     ``placer profile -o``, ``--json``; read by      :class:`ProfileDocument`
                ``placer plan --profile``
``costs``       ``placer plan --save-costs``; read by           :class:`~placer.data.cost_table.CostTable`
                ``placer plan --costs``
``plan``        ``placer plan -o``, ``--json``                  :class:`~placer.data.plan.Plan`
``run``         ``placer run -o``, ``--json``                   :class:`~placer.data.run.Run`
``report``      ``placer advise -o report.json``; ``report.json``  :class:`~placer.data.report.ReportFacts`
                of ``advise --save``
``stream-plan`` ``placer plan --json`` of a pipeline with       :class:`~placer.data.stream.StreamPlan`
                streams
==============  ==============================================  =====================================

A profile has one shape, printed or saved: :class:`ProfileDocument` holds the
measurements as :class:`~placer.data.profile.Profile` under ``profile`` (what
``placer plan --profile`` reads back) and, beside them, the fitted model's account
of every stage on every device at the requested size.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from placer.data.cost_table import CostTable
from placer.data.plan import Plan
from placer.data.profile import Profile
from placer.data.report import ReportFacts
from placer.data.run import Run
from placer.data.stream import StreamPlan

PROFILE_DOCUMENT = "placer.profile-document/1"


class ProfileDocument(BaseModel):
    """What ``placer profile --json`` prints and ``placer profile -o FILE`` saves.

    Attributes
    ----------
    size : int or float or None
        The size the predictions in ``stages`` are for.
    labels : dict of str to str
        What ``measured``, ``predicted`` and ``roofline`` mean.
    stages : dict
        Stage → device → the measured points, first call, memory, output bytes,
        the fit (``model``) and the ``prediction`` at ``size``.
    transfer : dict
        Accelerator → its measured host↔device transfer model.
    described_transfer : dict
        A described (absent) device → its transfer model from the description.
    coverage : dict
        Stage → what was measured and what was extrapolated, with the error estimate.
    load : dict
        The load average seen while profiling.
    profile : Profile
        The measurements themselves (schema ``placer.profile/1``).
    """

    schema_: Literal["placer.profile-document/1"] = Field(PROFILE_DOCUMENT, alias="schema")
    pipeline: str
    size: int | float | None = None
    size_unit: str = "rows"
    fingerprint: str
    machine: dict[str, Any] = Field(default_factory=dict)
    devices: list[str] | dict[str, Any] = Field(default_factory=list)
    budget_s: float | None = None
    elapsed_s: float = 0.0
    sizes: list[int] = Field(default_factory=list)
    measured_sizes: list[int] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    stages: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)
    transfer: dict[str, Any] = Field(default_factory=dict)
    described_transfer: dict[str, Any] = Field(default_factory=dict)
    coverage: dict[str, Any] = Field(default_factory=dict)
    load: dict[str, float | None] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    profile: Profile

    model_config = {"populate_by_name": True}


def profile_document(prof: Profile, model: Any, size: int | float | None) -> dict[str, Any]:
    """The :class:`ProfileDocument` of ``prof`` as JSON-ready data.

    Parameters
    ----------
    prof : Profile
        The measurements.
    model : CostModel
        The cost model fitted to ``prof`` (:mod:`placer.costmodel`): its
        ``summary(size)``, ``devices`` and ``described`` devices are used.
    size : int or float or None
        The size to predict at.
    """
    return {
        "schema": PROFILE_DOCUMENT,
        "pipeline": prof.pipeline,
        "size": size,
        "size_unit": prof.size_unit,
        "fingerprint": prof.fingerprint,
        "machine": prof.machine,
        "devices": model.devices,
        "budget_s": prof.budget_s,
        "elapsed_s": prof.elapsed_s,
        "sizes": prof.sizes,
        "measured_sizes": prof.measured_sizes,
        "labels": {
            "measured": "a measurement on this machine at this size",
            "predicted": "a fit to measurements on this machine, at a size not measured",
            "roofline": "a roofline prediction for a device this machine lacks (not a measurement)",
        },
        "stages": model.summary(size),
        "transfer": {d: tm.model_dump(mode="json") for d, tm in prof.transfer.items()},
        "described_transfer": {
            d: desc.transfer.model_dump(mode="json", exclude={"links": {"__all__": {"__all__": {"points"}}}})
            for d, desc in model.described.items() if desc.transfer is not None
        },
        "coverage": {n: sp.coverage for n, sp in prof.stages.items()},
        "load": prof.machine_load,
        "notes": prof.notes,
        "profile": prof.model_dump(mode="json", by_alias=True),
    }


#: ``placer schema NAME`` → the model of that file
DOCUMENTS: dict[str, type[BaseModel]] = {
    "profile": ProfileDocument, "costs": CostTable, "plan": Plan, "run": Run, "report": ReportFacts,
    "stream-plan": StreamPlan,
}


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the file ``name`` (a key of :data:`DOCUMENTS`).

    Parameters
    ----------
    name : str
        ``profile``, ``costs``, ``plan``, ``run``, ``report`` or ``stream-plan``.

    Raises
    ------
    KeyError
        An unknown name (the message lists the known ones).

    Examples
    --------
    >>> json_schema("plan")["title"], "placement" in json_schema("plan")["required"]
    ('Plan', True)
    """
    if name not in DOCUMENTS:
        raise KeyError(f"no schema {name!r}; use one of {', '.join(DOCUMENTS)}")
    doc = DOCUMENTS[name].model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **doc}
