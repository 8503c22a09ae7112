"""Progress columns for long work: percent done and the time left, capped by the time budget.

May import: time, rich (inside :func:`columns`).

The profiler adds one task per profile with ``total`` steps and a ``deadline``
field (when its time budget ends). rich's own estimate of the time left assumes
every step still to come will run; a budgeted profile stops growing sizes when the
budget is spent, so the time left shown is the smaller of rich's estimate and the
budget left. Tasks of one step (``placer advise``'s other steps) show neither.
"""

from __future__ import annotations

import time
from typing import Any


def time_left(task: Any) -> float | None:
    """Seconds left for ``task``: rich's estimate, never past its ``deadline`` field (None: unknown).

    >>> class Task:
    ...     time_remaining = 90.0
    ...     fields = {"deadline": time.monotonic() + 10}
    >>> round(time_left(Task()))
    10
    """
    est = task.time_remaining
    deadline = task.fields.get("deadline")
    if deadline is not None:
        left = max(deadline - time.monotonic(), 0.0)
        est = left if est is None else min(est, left)
    return est


def columns() -> list[Any]:
    """rich columns: percent done, and ``ETA`` with :func:`time_left`, for tasks of more than one step."""
    from rich.progress import ProgressColumn, TaskProgressColumn
    from rich.text import Text

    class Percent(ProgressColumn):
        def __init__(self):
            super().__init__()
            self.inner = TaskProgressColumn()

        def render(self, task: Any) -> Any:
            return self.inner.render(task) if (task.total or 0) > 1 else Text("")

    class Left(ProgressColumn):
        max_refresh = 0.5

        def render(self, task: Any) -> Any:
            if (task.total or 0) <= 1 or task.finished:
                return Text("")
            left = time_left(task)
            if left is None:
                return Text("ETA -:--", style="progress.remaining")
            m, s = divmod(int(round(left)), 60)
            return Text(f"ETA {m}:{s:02d}", style="progress.remaining")

    return [Percent(), Left()]
