"""``Cancel-After: <duration>``: a client's deadline for a prediction.

Durations are Go-style, as Replicate's clients send them: a sequence of ``<number><unit>`` with
units ``ms``, ``s``, ``m``, ``h`` (``30s``, ``5m``, ``1h30m``, ``1.5h``); a bare number means
seconds. Past the deadline before it starts, a prediction is ``aborted`` (never run); while it
runs, it is canceled.
"""

from __future__ import annotations

import re
from datetime import timedelta

from api.errors import InvalidRequest

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DEADLINE = timedelta(days=7)


def parse_cancel_after(value: str | None) -> timedelta | None:
    if value is None:
        return None
    text = value.strip().lower()
    seconds: float
    try:
        seconds = float(text)
    except ValueError:
        parts = _PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise _invalid(value) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    try:
        duration = timedelta(seconds=seconds)
    except (ValueError, OverflowError):  # nan, inf, or beyond what a timedelta holds
        raise _invalid(value) from None
    if not timedelta(0) < duration <= MAX_DEADLINE:
        raise _invalid(value)
    return duration


def _invalid(value: str) -> InvalidRequest:
    return InvalidRequest(
        f"Cancel-After must be a duration like 30s, 5m or 1h (at most 7 days), got {value!r}",
        errors=[{"field": "Cancel-After", "message": "not a valid duration"}],
    )
