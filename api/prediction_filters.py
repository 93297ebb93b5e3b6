"""The filters of ``GET /v1/predictions``: ``created_after``, ``created_before``, ``source``.

A filter the list cannot honour is refused (400 naming it), never dropped: a sync job that
asks for what is new since its last run must not be handed all of history instead. The
filters ride along in the ``next`` and ``previous`` links, so every page is filtered alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from api.errors import InvalidRequest

#: Where predictions come from: Replicate's ``api`` and ``web``, and Conduit's lane (``sync``).
SOURCES = frozenset({"api", "web", "sync"})


@dataclass(frozen=True, slots=True)
class PredictionFilters:
    created_after: datetime | None = None
    created_before: datetime | None = None
    source: str | None = None

    def query(self) -> str:
        """The filters as a query string (``a=…&``), or ``""`` when there are none."""
        pairs = [
            (name, value.isoformat() if isinstance(value, datetime) else value)
            for name, value in (
                ("created_after", self.created_after),
                ("created_before", self.created_before),
                ("source", self.source),
            )
            if value is not None
        ]
        return urlencode(pairs) + "&" if pairs else ""


def parse_filters(params: Mapping[str, str | None]) -> PredictionFilters:
    """The filters of a list request's query, or :class:`InvalidRequest` naming the bad one."""
    source = params.get("source")
    if source is not None and source not in SOURCES:
        expected = ", ".join(sorted(SOURCES))
        raise _invalid("source", f"must be one of {expected}")
    return PredictionFilters(
        _timestamp(params, "created_after"), _timestamp(params, "created_before"), source
    )


def _timestamp(params: Mapping[str, str | None], name: str) -> datetime | None:
    value = params.get(name)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        # A "+" left unencoded in a query string arrives as a space.
        hint = " (send a '+' in a query string as %2B)" if " " in value else ""
        raise _invalid(name, f"must be an ISO 8601 date or date-time{hint}") from None
    # No offset given: UTC, as every time the API answers is.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field} {message}.", errors=[{"field": field, "message": message}])
