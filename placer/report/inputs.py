"""Reading the objects a report is made from, whether live or saved as JSON.

May import: json, pathlib, placer.errors. Plans, runs, cost tables and profiles are read through
their JSON form (``model_dump(mode="json")``), so a report made later from saved
files says exactly what a report made right after the run says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from placer.errors import PlacerError


class ReportInputError(PlacerError, ValueError):
    """A report input is missing, unreadable or of the wrong shape."""


def as_data(obj: Any, what: str) -> dict[str, Any] | None:
    """A plain ``dict`` from a pydantic model, a mapping, a JSON file path or JSON text.

    Parameters
    ----------
    obj : pydantic model, mapping, str, os.PathLike or None
    what : str
        Named in error messages (``"plan"``, ``"run"``, ...).
    """
    if obj is None:
        return None
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, Mapping):
        return json.loads(json.dumps(dict(obj), default=_default))
    if isinstance(obj, (str, Path)):
        text = str(obj)
        if isinstance(obj, str) and text.lstrip().startswith("{"):
            return _parse(text, what, "the text given")
        path = Path(obj)
        try:
            return _parse(path.read_text(), what, str(path))
        except OSError as exc:
            raise ReportInputError(f"cannot read the {what} file {str(path)!r}: {exc.strerror}") from None
    raise ReportInputError(
        f"the {what} must be a placer object, a mapping, or a path to its JSON file; "
        f"got {type(obj).__name__}"
    )


def _parse(text: str, what: str, source: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportInputError(f"the {what} in {source} is not valid JSON ({exc}); fix or regenerate it") from None
    if not isinstance(data, dict):
        raise ReportInputError(f"the {what} in {source} must be a JSON object, got {type(data).__name__}")
    return data


def _default(o: Any) -> Any:
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if isinstance(o, Path):
        return str(o)
    return repr(o)


def require(data: Mapping[str, Any], key: str, what: str) -> Any:
    """``data[key]``, or a :class:`ReportInputError` naming the missing field."""
    if key not in data:
        raise ReportInputError(f"the {what} has no field {key!r}; is it a placer {what} saved as JSON?")
    return data[key]


def option_seconds(value: Any) -> tuple[float | None, dict[str, str]]:
    """Predicted seconds and placement of a plan baseline, whatever its shape.

    A baseline may be a number of seconds or an object with a placement and its
    predicted makespan (``predicted_makespan_s``, ``makespan_s`` or ``predicted_s``).
    """
    if value is None:
        return None, {}
    if isinstance(value, (int, float)):
        return float(value), {}
    if isinstance(value, Mapping):
        seconds = None
        for key in ("predicted_makespan_s", "makespan_s", "predicted_s", "seconds", "value"):
            if isinstance(value.get(key), (int, float)):
                seconds = float(value[key])
                break
        placement = value.get("placement") or {}
        return seconds, {str(k): str(v) for k, v in placement.items()}
    return None, {}
