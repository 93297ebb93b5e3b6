"""``X-Priority: high | normal | low`` on the create endpoints: how urgent this prediction is.

It overrides the deployment's priority and is forwarded to the runner as it is; an unknown
value is refused (422) rather than silently run at the default.

``high`` is an entitlement (:func:`front.admission.honoured`): it is honoured only for an
account allowed it or on a deployment that allows it; anyone else's ``high`` is quietly run at
the default (the deployment's priority), as if the header were absent, not refused: a client
written for an entitled account keeps working. ``low`` and ``normal`` are never held back:
asking for less is harmless.
"""

from __future__ import annotations

from api.errors import InvalidInput
from tracker.priority import Priority, parse_priority

HEADER = "X-Priority"


def parse_priority_header(value: str | None) -> Priority | None:
    """The requested priority, or None without the header (the deployment's applies)."""
    if value is None:
        return None
    priority = parse_priority(value)
    if priority is None:
        allowed = ", ".join(Priority)
        raise InvalidInput(
            f"{HEADER} must be one of {allowed}, got {value!r}",
            errors=[{"field": HEADER, "message": f"must be one of {allowed}"}],
        )
    return priority
