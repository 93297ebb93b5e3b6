"""The pages of ``/ops`` (GET): overview, directors and runners, fairness, predictions and one
prediction (with "why is this waiting?" and live logs), failures and dead letters, webhooks,
the audit of actions, and the sign-in page."""

from __future__ import annotations

import html
import secrets
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.engine import RowMapping
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException

from api.deps import Resources
from api.ops import queue_view, reads, views
from api.ops.access import OpenedDep, SessionDep, safe_next, sessions
from api.ops.filters import PredictionFilter
from api.ops.overview import LATE_AFTER_MS
from api.ops.overview import overview as queue_overview
from api.ops.reads import PageKey
from api.ops.redaction import redacted
from api.ops.sign_ins import COOKIE, LOGIN_COOKIE
from api.ops.web import page, static
from api.routes.streams import last_event
from tracker.events import Event, EventType
from tracker.render import render_prediction
from tracker.states import Status

router = APIRouter(prefix="/ops", include_in_schema=False)
PAGE_SIZE = 50


@router.get("/static/{name}")
async def static_file(name: str, resources: OpenedDep) -> Response:
    found = static(name)
    if found is None:
        raise HTTPException(404, "Not Found")
    return found


@router.get("/login")
async def login_form(
    request: Request, resources: OpenedDep, next: str | None = None
) -> HTMLResponse:
    session = await sessions(resources).find(request.cookies.get(COOKIE))
    token = secrets.token_urlsafe(24)
    response = page(
        request, "login.html", session, login_csrf=token, next=safe_next(next), failed=None
    )
    response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="strict", path="/ops")
    return response


@router.get("")
async def overview(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    rows, redis_problem = await queue_overview(resources)
    return page(
        request,
        "overview.html",
        session,
        rows=rows,
        redis_problem=redis_problem,
        late_after_s=LATE_AFTER_MS // 1000,
    )


@router.get("/workers")
async def workers(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    return page(request, "workers.html", session, w=await views.workers(resources))


@router.get("/fairness")
async def fairness(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    return page(
        request,
        "fairness.html",
        session,
        shares=await views.fairness(resources),
        collisions=await views.shard_collisions(resources),
    )


def _cursor(value: str | None) -> PageKey | None:
    if not value:
        return None
    at, _, prediction_id = value.partition("~")
    try:
        return PageKey(datetime.fromisoformat(at), prediction_id)
    except ValueError:
        return None


@router.get("/predictions")
async def predictions(
    request: Request, session: SessionDep, resources: OpenedDep, cursor: str | None = None
) -> HTMLResponse:
    where, notes = PredictionFilter.parse(request.query_params)
    rows = await reads.list_predictions(resources.reads, where, _cursor(cursor), PAGE_SIZE + 1)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    next_cursor = f"{rows[-1]['created_at'].isoformat()}~{rows[-1]['id']}" if more else None
    count = await reads.count_predictions(resources.reads, where)
    return page(
        request,
        "predictions.html",
        session,
        rows=rows,
        where=where,
        notes=notes,
        count=count,
        cap=reads.COUNT_CAP,
        next_cursor=next_cursor,
        statuses=[s.value for s in Status],
    )


@router.get("/predictions/confirm")
async def confirm_bulk(
    request: Request, session: SessionDep, resources: OpenedDep, action: str = Query(...)
) -> HTMLResponse:
    where, notes = PredictionFilter.parse(request.query_params)
    if action not in ("retry_all", "cancel_all"):
        raise HTTPException(404, "Not Found")
    count = await reads.count_predictions(resources.reads, where, cap=1_000_000)
    return page(
        request, "confirm.html", session, action=action, where=where, notes=notes, count=count
    )


async def _prediction(resources: Resources, prediction_id: str) -> RowMapping:
    row = await reads.prediction(resources.engine, prediction_id)
    if row is None:
        raise HTTPException(404, "Not Found")
    return row


@router.get("/predictions/{prediction_id}")
async def prediction(
    request: Request, prediction_id: str, session: SessionDep, resources: OpenedDep
) -> HTMLResponse:
    row = await _prediction(resources, prediction_id)
    relatives = await reads.relatives(resources.engine, row)
    deliveries = await reads.deliveries_of(resources.engine, prediction_id)
    names = resources.settings.ops_redact
    rendered = render_prediction(row, resources.links(request))
    return page(
        request,
        "prediction.html",
        session,
        p=row,
        input=redacted(row["input"], names),
        output=rendered["output"],
        metrics=rendered.get("metrics") or {},
        relatives=relatives,
        deliveries=deliveries,
        finished=Status(row["status"]).is_terminal,
    )


@router.get("/predictions/{prediction_id}/why")
async def why(
    request: Request, prediction_id: str, session: SessionDep, resources: OpenedDep
) -> HTMLResponse:
    row = await _prediction(resources, prediction_id)
    waiting = None
    if not Status(row["status"]).is_terminal:
        waiting = await views.why_waiting(resources, row)
    return page(request, "why.html", session, p=row, waiting=waiting)


async def _log_lines(events: AsyncIterator[Any]) -> AsyncIterator[ServerSentEvent]:
    """Each log line as an escaped HTML fragment (the page swaps it in); ``done`` at the end,
    on which the page closes the stream (``sse-close``), so it never reconnects and repeats."""
    async for event in events:
        if event.type is EventType.LOGS:
            lines = "".join(
                f'<div class="line">{html.escape(line)}</div>'
                for line in event.data.splitlines() or [""]
            )
            yield ServerSentEvent(lines, event="logs", id=event.id)
        elif event.type is EventType.DONE:
            yield ServerSentEvent("", event="done", id=event.id)
            return


async def _follow(subscription: Any) -> AsyncIterator[Any]:
    try:
        async for event in subscription:
            yield event
    finally:
        subscription.close()


async def _stored(row: Any) -> AsyncIterator[Any]:
    """A finished prediction's logs from its row, as events (its stream has expired)."""
    yield Event("0-1", EventType.LOGS, row["logs"] or "")
    yield Event("0-2", EventType.DONE, row["status"])


@router.get("/predictions/{prediction_id}/logs")
async def logs(
    request: Request, prediction_id: str, session: SessionDep, resources: OpenedDep
) -> EventSourceResponse:
    row = await _prediction(resources, prediction_id)
    source: AsyncIterator[Any]
    if (
        Status(row["status"]).is_terminal
        and await last_event(resources.redis, prediction_id) is None
    ):
        source = _stored(row)  # its event stream has expired: the row has the logs
    else:
        subscription = resources.hub.subscribe(prediction_id, "0", row["account_id"])
        if subscription is None:
            raise HTTPException(503, "This server holds its most waiting clients; retry shortly.")
        source = _follow(subscription)
    return EventSourceResponse(
        _log_lines(source), ping=resources.settings.sse_ping, headers={"Cache-Control": "no-store"}
    )


@router.get("/failed")
async def failed(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    groups = await reads.failed_groups(resources.reads)
    targets = await reads.deployables(resources.reads)
    streams = [s for t in targets for s in views.target_streams(t)]
    lengths, letters = await queue_view.dead_letters(resources.redis, streams)
    return page(
        request,
        "failed.html",
        session,
        groups=groups,
        window=reads.FAILED_WINDOW,
        dead_lengths=lengths,
        letters=letters,
    )


@router.get("/webhooks")
async def webhooks(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    pending = await reads.webhook_deliveries(resources.engine, "pending")
    failing = await reads.webhook_deliveries(resources.engine, "failed")
    return page(request, "webhooks.html", session, pending=pending, failing=failing)


@router.get("/actions")
async def actions(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    rows = await reads.recent_actions(resources.engine)
    return page(request, "actions.html", session, rows=rows)


@router.get("/actions/{action_id}")
async def action(
    request: Request, action_id: int, session: SessionDep, resources: OpenedDep
) -> HTMLResponse:
    row = await reads.action(resources.engine, action_id)
    if row is None:
        raise HTTPException(404, "Not Found")
    return page(request, "action.html", session, a=row)
