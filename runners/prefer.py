"""The request headers that say how long a start may take and how to answer it, read one way
by every runner host (a single runner, a model pool).

``Prefer`` is RFC 7240's: a comma-separated list of preferences, names case-insensitive, the
first of a name counting, parameters after ``;`` ignored. ``respond-async`` asks for 202 at once
(Cog); ``wait=<seconds>`` bounds the start as ``X-Conduit-Deadline: <seconds>`` does, which wins
when both are sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from protocol.headers import DEADLINE, PREFER, RESPOND_ASYNC
from runners.control_errors import InvalidFieldError

WAIT = "wait"


def preferences(header: str | None) -> dict[str, str]:
    """``Prefer``'s preferences, by lower-cased name, each with its value ('' without one)."""
    found: dict[str, str] = {}
    for part in (header or "").split(","):
        name, _, value = part.split(";", 1)[0].partition("=")
        name = name.strip().lower()
        if name and name not in found:
            found[name] = value.strip().strip('"')
    return found


def respond_async(headers: Mapping[str, str]) -> bool:
    """Whether the request prefers 202 at once (``Prefer: respond-async``)."""
    return RESPOND_ASYNC in preferences(headers.get(PREFER))


def deadline(headers: Mapping[str, str]) -> float | None:
    """Seconds the start may take (queue + load + run): ``X-Conduit-Deadline``, else
    ``Prefer: wait``; None without either. A value that is not a non-negative number is
    refused (:class:`~runners.control_errors.InvalidFieldError` naming the header)."""
    given = seconds(headers.get(DEADLINE), DEADLINE)
    if given is None:
        given = seconds(preferences(headers.get(PREFER)).get(WAIT), PREFER)
    return given


def seconds(value: str | None, name: str, negative: bool = False) -> float | None:
    """A header's number of seconds; None when it is absent or blank."""
    if value is None or not value.strip():
        return None
    try:
        parsed = float(value.strip())
    except ValueError:
        parsed = math.nan
    if not math.isfinite(parsed) or (parsed < 0 and not negative):
        raise InvalidFieldError(name, f"{name} must be a number of seconds")
    return parsed
