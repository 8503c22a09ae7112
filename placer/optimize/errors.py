"""Errors raised while reading cost tables and planning.

May import: placer.errors.
"""

from __future__ import annotations

from placer.errors import PlacerError


class CostTableError(PlacerError, ValueError):
    """A cost table is malformed: the message names the stage or field and the fix."""


class InfeasibleError(PlacerError, ValueError):
    """No placement satisfies the constraints (devices, memory, pins, deadline)."""
