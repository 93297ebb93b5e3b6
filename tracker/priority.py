"""How urgent a prediction is: the runner contract's ``X-Priority`` values, as predictions and
deployments store them.

A deployment has a default (``normal`` unless configured); a create request may override it
with its own ``X-Priority`` header. Runners that queue use it to order their queue; a stock Cog
server ignores it. The enum is the contract's own (``protocol.values.Priority``): the value a
prediction stores is the value its runner reads, so there is one list of them.
"""

from __future__ import annotations

from protocol.values import Priority

__all__ = ["Priority", "parse_priority"]


def parse_priority(value: str) -> Priority | None:
    """The priority ``value`` names (any case, surrounding blanks ignored), or None: the public
    API refuses what a runner would quietly read as ``normal``."""
    try:
        return Priority(value.strip().lower())
    except ValueError:
        return None
