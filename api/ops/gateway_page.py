"""The gateway's part of ``/ops``: the inference-server registry (each cluster's gateway and
its heartbeat) and a search of the request log by session, block, request id and time."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from api.ops.access import OpenedDep, SessionDep
from api.ops.filters import parse_time
from api.ops.web import page
from blocks import inference_servers, request_log

router = APIRouter(prefix="/ops", include_in_schema=False)
LOG_PAGE = 100


@router.get("/gateway")
async def gateway(request: Request, session: SessionDep, resources: OpenedDep) -> HTMLResponse:
    servers = await inference_servers.query(resources.engine, {}, limit=200)
    query = request.query_params
    search = {
        k: (query.get(k) or "").strip()[:200] for k in ("session", "block", "request", "since")
    }
    notes: list[str] = []
    logs: list[dict[str, object]] = []
    if any(search.values()):
        request_id = None
        if search["request"]:
            try:
                request_id = uuid.UUID(search["request"])
            except ValueError:
                notes.append("request: ignored (not a UUID)")
        since = parse_time(search["since"]) if search["since"] else None
        if search["since"] and since is None:
            notes.append("since: ignored (not an ISO 8601 time)")
        logs = await request_log.find(
            resources.log_engine or resources.engine,
            account_id=None,
            session_id=search["session"] or None,
            block_id=search["block"] or None,
            request_id=request_id,
            since=since,
            limit=LOG_PAGE,
        )
    return page(
        request,
        "gateway.html",
        session,
        servers=[inference_servers.render(s) for s in servers],
        search=search,
        notes=notes,
        logs=logs,
    )
