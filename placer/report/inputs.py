"""Reading the objects a report is made from, live or saved as JSON, into placer's models.

May import: json, pathlib, pydantic, placer.data, placer.devices (``Inventory`` only),
placer.errors, placer.files.

Every input becomes its typed model (:class:`~placer.data.plan.Plan`,
:class:`~placer.data.run.Run`, :class:`~placer.data.cost_table.CostTable`,
:class:`~placer.devices.Inventory`, :class:`~placer.data.measures.Prediction`,
:class:`~placer.data.report.TargetPlan`). A live model is used as it is; a mapping,
JSON text or JSON file is validated with pydantic, so a wrong, missing or renamed
field is a one-line error naming the file and the field, never a report that
silently lacks it.

Examples
--------
>>> from placer.data.run import Run
>>> run, path = load({"pipeline": "p", "placement": {}, "executor": "inline", "workers": 1,
...                   "makespan": 0.5}, Run, "run")
Traceback (most recent call last):
...
placer.report.inputs.ReportInputError: the run given is not a valid run: field makespan_s is missing
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from placer.data.cost_table import CostTable
from placer.data.measures import Prediction
from placer.data.plan import Plan
from placer.data.report import TargetPlan
from placer.data.run import Run
from placer.devices import Inventory
from placer.errors import PlacerError
from placer.files import parse_json

M = TypeVar("M", bound=BaseModel)
#: longest repr of a bad value quoted in an error
VALUE_CHARS = 40


class ReportInputError(PlacerError, ValueError):
    """A report input is missing, unreadable or of the wrong shape."""


@dataclass
class Inputs:
    """A report's inputs as placer's models, with the file each came from (None: given live)."""

    plan: Plan | None = None
    run: Run | None = None
    baselines: dict[str, Run] = field(default_factory=dict)
    costs: CostTable | None = None
    inventory: Inventory | None = None
    #: ``{stage: {device: Prediction}}`` from the cost model
    predictions: dict[str, dict[str, Prediction]] = field(default_factory=dict)
    target: TargetPlan | None = None
    #: the live pipeline (graph, docstrings, parameters); it has no saved form
    pipeline: Any = None
    #: ``plan``, ``run``, ``costs``, ``target``, ``inventory``, ``baselines.KEY`` -> the file it was read from
    files: dict[str, str] = field(default_factory=dict)


def load_inputs(*, plan: Any = None, run: Any = None, baselines: Mapping[str, Any] | None = None,
                pipeline: Any = None, costs: Any = None, inventory: Any = None,
                predictions: Mapping[str, Mapping[str, Any]] | None = None, target: Any = None) -> Inputs:
    """Every input as its model (see :func:`load`); baselines that are None are left out."""
    out = Inputs(pipeline=pipeline)
    given = {"plan": (plan, Plan, "plan"), "run": (run, Run, "run"), "costs": (costs, CostTable, "cost table"),
             "inventory": (inventory, Inventory, "inventory"), "target": (target, TargetPlan, "target plan")}
    for key, (value, model, what) in given.items():
        obj, path = load(value, model, what)
        setattr(out, key, obj)
        if path is not None:
            out.files[key] = path
    for key, value in (baselines or {}).items():
        obj, path = load(value, Run, f"{key} run")
        if obj is not None:
            out.baselines[key] = obj
            if path is not None:
                out.files[f"baselines.{key}"] = path
    for stage, per_device in (predictions or {}).items():
        out.predictions[stage] = {
            dev: load(pred, Prediction, f"prediction of {stage!r} on {dev!r}")[0]
            for dev, pred in per_device.items()
        }
    return out


def load(obj: Any, model: type[M], what: str) -> tuple[M | None, str | None]:
    """``obj`` as a ``model``, and the file it was read from (None when it was not a file).

    Parameters
    ----------
    obj : model, mapping, str, os.PathLike or None
        A live model, its ``model_dump``, JSON text, or the path of a JSON file.
    model : type
        The pydantic model to validate against.
    what : str
        Named in error messages (``"plan"``, ``"run"``, ...).

    Raises
    ------
    ReportInputError
        One line naming the file (or the object) and the first bad field.
    """
    if obj is None:
        return None, None
    if isinstance(obj, model):
        return obj, None
    if isinstance(obj, BaseModel):
        return validate(obj.model_dump(mode="json"), model, what, f"the {what} given ({type(obj).__name__})"), None
    if isinstance(obj, Mapping):
        data = json.loads(json.dumps(dict(obj), default=_default))
        return validate(data, model, what, f"the {what} given"), None
    if isinstance(obj, (str, Path)):
        text = str(obj)
        if isinstance(obj, str) and text.lstrip().startswith("{"):
            return validate(_parse(text, what, "the text given"), model, what, f"the {what} text given"), None
        path = Path(obj)
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ReportInputError(f"cannot read the {what} file {str(path)!r}: {exc.strerror}") from None
        data = _parse(text, what, str(path))
        return validate(data, model, what, f"the {what} file {str(path)!r}"), str(path)
    raise ReportInputError(
        f"the {what} must be a placer object, a mapping, or a path to its JSON file; "
        f"got {type(obj).__name__}"
    )


def validate(data: Any, model: type[M], what: str, origin: str) -> M:
    """``model.model_validate(data)``, refusing bad and unknown fields in one line naming ``origin``."""
    if model is Run:
        data = without_run_summary(data)
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        raise ReportInputError(f"{origin} is not a valid {what}: {describe(exc, data)}") from None
    except RecursionError:
        raise ReportInputError(f"{origin} is nested too deeply to be a {what}; regenerate it") from None
    extra = unknown_field(data, obj.model_dump(mode="json", by_alias=True))
    if extra is not None:
        raise ReportInputError(
            f"{origin} is not a valid {what}: field {extra} is not a field of a placer {what} "
            "(renamed or misspelt?); regenerate the file with this version of placer"
        )
    return obj


#: what ``Run.summary()`` (``placer run -o``) adds at the top of a run with streams: the
#: first stream's fields of the same names
RUN_SUMMARY_KEYS = ("samples_per_s", "batches")


def without_run_summary(data: Any) -> Any:
    """A saved run without the fields its summary copied from its first stream.

    They are dropped only when they repeat that stream's numbers; otherwise they
    stay, and are refused as unknown fields.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("streams"), list) or not data["streams"]:
        return data
    first = data["streams"][0]
    if not isinstance(first, Mapping):
        return data
    return {k: v for k, v in data.items()
            if not (k in RUN_SUMMARY_KEYS and k in first and first[k] == v)}


def describe(exc: ValidationError, data: Any) -> str:
    """The first problem of a validation error, naming its field, on one line."""
    errors = exc.errors()
    first = errors[0]
    where = field_path(first["loc"], data)
    if first["type"] == "missing":
        text = f"field {where} is missing"
    else:
        msg = first["msg"].removeprefix("Value error, ").splitlines()[0]
        got = first.get("input")
        if isinstance(got, (str, int, float, bool)) or got is None:
            shown = repr(got)
            msg += f" (got {shown[:VALUE_CHARS - 1] + '…' if len(shown) > VALUE_CHARS else shown})"
        text = f"field {where}: {msg}" if where else msg
    more = len(errors) - 1
    return text + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def field_path(loc: tuple, data: Any) -> str:
    """``stages[2].seconds (stage 'train')``: a pydantic location, naming the list item it is in."""
    text, node, item, prev = "", data, "", ""
    for key in loc:
        if isinstance(key, int):
            text += f"[{key}]"
            node = node[key] if isinstance(node, list) and -len(node) <= key < len(node) else None
            if isinstance(node, Mapping) and isinstance(node.get("name"), str):
                item = f" ({_singular(prev)} {node['name']!r})"
        else:
            text += f".{key}" if text else str(key)
            prev = str(key)
            node = node.get(key) if isinstance(node, Mapping) else None
    return text + item


def unknown_field(data: Any, dumped: Any, path: str = "") -> str | None:
    """The first key of ``data`` that its validated model does not have (``dumped`` is its dump)."""
    if isinstance(data, Mapping) and isinstance(dumped, Mapping):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in dumped:
                return where
            found = unknown_field(value, dumped[key], where)
            if found is not None:
                return found
    elif isinstance(data, list) and isinstance(dumped, list) and len(data) == len(dumped):
        for i, (value, dump) in enumerate(zip(data, dumped)):
            found = unknown_field(value, dump, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _singular(key: str) -> str:
    return key[:-1] if key.endswith("s") else key


def _parse(text: str | bytes, what: str, source: str) -> dict[str, Any]:
    try:
        data = parse_json(text, f"the {what} in {source}")
    except PlacerError as exc:
        raise ReportInputError(str(exc)) from None
    if not isinstance(data, dict):
        raise ReportInputError(f"the {what} in {source} must be a JSON object, got {type(data).__name__}")
    return data


def _default(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return o.model_dump(mode="json")
    if isinstance(o, Path):
        return str(o)
    return repr(o)
