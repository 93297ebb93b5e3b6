"""The predictions page's filter: read from the query string (so a view is a bookmark), turned
into SQL conditions that the migrations' indexes serve, and written back into links.

Every value is a bound parameter; none is ever part of the SQL text. Unknown or malformed
values are dropped with a note rather than refused: the page shows what it understood.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from tracker.states import Status

#: Longest filter value kept (an error text to search for, a model name).
MAX_VALUE = 300
STATUSES = tuple(status.value for status in Status)


def parse_time(value: str) -> datetime | None:
    """An ISO 8601 time (UTC unless it says); None when it is not one."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PredictionFilter:
    status: str = ""
    #: ``owner/name`` of a model.
    model: str = ""
    #: A deployable: ``dp-owner/name`` (a deployment) or ``vp-<version id>`` (a version).
    target: str = ""
    #: An account's name.
    account: str = ""
    #: ``api``, ``gateway``, ``ops``…
    source: str = ""
    #: Created at or after / before, ISO 8601 (UTC unless it says).
    since: str = ""
    until: str = ""
    #: Text the error contains (case-insensitive); implies failed predictions.
    error: str = ""

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> tuple[PredictionFilter, list[str]]:
        """The filter in ``query``, and notes on what was ignored."""
        notes: list[str] = []
        values: dict[str, str] = {}
        for field in fields(cls):
            value = (query.get(field.name) or "").strip()
            if len(value) > MAX_VALUE or "\x00" in value:
                notes.append(f"{field.name}: ignored (too long or not text)")
                continue
            values[field.name] = value
        if values.get("status") and values["status"] not in STATUSES:
            notes.append(f"status: ignored ({values['status']!r} is not a status)")
            values["status"] = ""
        for name in ("since", "until"):
            if values.get(name) and parse_time(values[name]) is None:
                notes.append(f"{name}: ignored (not an ISO 8601 time)")
                values[name] = ""
        return cls(**values), notes

    def as_dict(self) -> dict[str, str]:
        """The fields that are set, as a query string has them."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    def query(self, **extra: str) -> str:
        return urlencode({**self.as_dict(), **{k: v for k, v in extra.items() if v}})

    def without(self, name: str) -> PredictionFilter:
        return replace(self, **{name: ""})

    def sql(self, account_id: int | None) -> tuple[list[str], dict[str, Any]]:
        """Conditions on ``predictions p`` and their parameters. ``account_id`` is the
        account named by ``account`` (looked up by the caller; -1 when there is none)."""
        where: list[str] = []
        params: dict[str, Any] = {}
        status = "failed" if self.error else self.status
        if status:
            where.append("p.status = :status")
            params["status"] = status
        if self.model:
            where.append("p.model = :model")
            params["model"] = self.model
        if self.target:
            where.append("p.target = :target")
            params["target"] = self.target
        if account_id is not None:
            where.append("p.account_id = :account_id")
            params["account_id"] = account_id
        if self.source:
            where.append("p.source = :source")
            params["source"] = self.source
        if self.since:
            where.append("p.created_at >= :since")
            params["since"] = parse_time(self.since)
        if self.until:
            where.append("p.created_at < :until")
            params["until"] = parse_time(self.until)
        if self.error:
            where.append("p.error ILIKE :error")
            params["error"] = "%" + _like_escaped(self.error) + "%"
        return where, params


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
