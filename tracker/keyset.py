"""Keyset (cursor) pagination, newest first, for every list the API pages: predictions, files,
models, deployments, blocks, graphs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, tuple_


@dataclass(frozen=True, slots=True)
class PageKey:
    """A keyset position in the newest-first list: (created_at, id)."""

    created_at: datetime
    id: str


def keyset_page(
    query: Select[Any],
    created_at: ColumnElement[datetime],
    id: ColumnElement[str],
    *,
    after: PageKey | None,
    before: PageKey | None,
) -> Select[Any]:
    """``query`` narrowed and ordered for one newest-first page: ``after`` pages towards
    older rows (newest first), ``before`` towards newer ones (oldest first; the caller
    reverses them), neither the newest rows."""
    # A row comparison, not ``a < x OR (a = x AND b < y)``: Postgres reads it as a range of the
    # (…, created_at, id) index and starts the page at the cursor; the OR form scans every row
    # newer than the cursor and filters, so a page cost grew with its depth (3 ms 10,000 rows
    # deep against 1.2 ms for the newest page).
    key = tuple_(created_at, id)
    if after is not None:
        return query.where(key < tuple_(after.created_at, after.id)).order_by(
            created_at.desc(), id.desc()
        )
    if before is not None:
        return query.where(key > tuple_(before.created_at, before.id)).order_by(
            created_at.asc(), id.asc()
        )
    return query.order_by(created_at.desc(), id.desc())
