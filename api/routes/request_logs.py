"""The gateway's request log (:mod:`blocks.request_log`), at the seed's own paths:
``GET /logs/session/{session_id}``, ``/logs/request/{request_id}``, ``/logs/block/{block_id}``
and ``/logs/session_block?session_id=&block_id=``.

Each answers ``{"results": [...], "next": <cursor or null>}``, oldest first: ``since`` and
``until`` (ISO 8601) bound the time, ``limit`` the page, and ``cursor`` (the ``next`` of the
page before) continues. An account sees its own calls' entries; an admin every account's. The
packet's fields are rendered as the call sent them (text; ``frame_ptr`` as text when it is
UTF-8, else base64).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from api.deps import AccountDep, ResourcesDep
from api.errors import InvalidRequest
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from blocks import request_log
from tracker.render import iso

router = APIRouter(default_response_class=FastJSONResponse)

RESPONSES = problems(400, 401, 422, 503)


@dataclass
class LogPage:
    """The paging every log path takes."""

    since: Annotated[datetime | None, Query(description="Entries at or after (ISO 8601).")] = None
    until: Annotated[datetime | None, Query(description="Entries before (ISO 8601).")] = None
    cursor: Annotated[str | None, Query(description="The `next` of the page before.")] = None
    limit: Annotated[int, Query(ge=1, le=1000)] = 100


Page = Annotated[LogPage, Depends()]


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return base64.b64encode(value).decode()


def _render(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "request_id": str(row["request_id"]),
        "session_id": row["session_id"],
        "block_id": row["block_id"],
        "seq_no": row["seq_no"],
        "ts": iso(row["ts"]),
        "frame_ptr": _text(row["frame_ptr"]),
        "data": _text(row["data"]),
        "query_parameters": _text(row["query_parameters"]),
        "output_ptr": _text(row["output_ptr"]),
        "status": row["status"],
        "error": row["error"],
        "latency_ms": row["latency_ms"],
        "account_id": row["account_id"],
        "origin": row["origin"],
        "graph_parent": str(row["graph_parent"]) if row["graph_parent"] else None,
    }


async def _page(
    account: AccountDep, resources: ResourcesDep, page: LogPage, **filters: Any
) -> FastJSONResponse:
    since, until, cursor, limit = page.since, page.until, page.cursor, page.limit
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise InvalidRequest(f"{name} needs its UTC offset (e.g. Z)")
    after = None
    if cursor is not None:
        try:
            after = request_log.decode_cursor(cursor)
        except ValueError:
            raise InvalidRequest("The cursor is not valid.") from None
    rows = await request_log.find(
        resources.log_engine or resources.engine,
        account_id=None if account.is_admin else account.id,
        since=since,
        until=until,
        after=after,
        limit=limit + 1,
        **filters,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if rows else None
    next_cursor = (
        request_log.encode_cursor(last["ts"], last["request_id"]) if more and last else None
    )
    return FastJSONResponse({"results": [_render(row) for row in rows], "next": next_cursor})


@router.get("/logs/session/{session_id}", responses=RESPONSES, openapi_extra=operation())
async def logs_of_session(
    session_id: str,
    account: AccountDep,
    resources: ResourcesDep,
    page: Page,
) -> FastJSONResponse:
    """Every logged call of a session."""
    return await _page(account, resources, page, session_id=session_id)


@router.get("/logs/request/{request_id}", responses=RESPONSES, openapi_extra=operation())
async def logs_of_request(
    request_id: uuid.UUID,
    account: AccountDep,
    resources: ResourcesDep,
    page: Page,
) -> FastJSONResponse:
    """The entry of one call (its request id), or none."""
    return await _page(account, resources, page, request_id=request_id)


@router.get("/logs/block/{block_id}", responses=RESPONSES, openapi_extra=operation())
async def logs_of_block(
    block_id: str,
    account: AccountDep,
    resources: ResourcesDep,
    page: Page,
) -> FastJSONResponse:
    """Every logged call on a block."""
    return await _page(account, resources, page, block_id=block_id)


@router.get("/logs/session_block", responses=RESPONSES, openapi_extra=operation())
async def logs_of_session_block(
    session_id: Annotated[str, Query()],
    block_id: Annotated[str, Query()],
    account: AccountDep,
    resources: ResourcesDep,
    page: Page,
) -> FastJSONResponse:
    """Every logged call of a session on a block."""
    return await _page(account, resources, page, session_id=session_id, block_id=block_id)
