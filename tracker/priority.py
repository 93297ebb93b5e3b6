"""How urgent a prediction is, as runners read it from ``X-Priority``.

A deployment has a default (``normal`` unless configured); a create request may override it
with its own ``X-Priority`` header. Runners that queue use it to order their queue; a stock Cog
server ignores it.
"""

from __future__ import annotations

import enum


class Priority(enum.StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


def parse_priority(value: str) -> Priority | None:
    """The priority ``value`` names (any case, surrounding blanks ignored), or None."""
    try:
        return Priority(value.strip().lower())
    except ValueError:
        return None
