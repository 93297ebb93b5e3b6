"""``GET /v1/predictions/<id>/stream``: server-sent events from the prediction's event stream.

Events ``output``, ``logs``, ``error`` and ``done``, each with the Redis entry id as ``id:``, so a
client joining late gets the whole history and ``Last-Event-ID`` resumes after it. When the
history has expired, a finished prediction is replayed from its stored row.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from api import serving
from api.deps import AccountDep, ResourcesDep
from tracker.events import EventLog, EventType, done_data, output_text
from tracker.states import Status

router = APIRouter(prefix="/v1")

PUBLIC_EVENTS = {EventType.OUTPUT, EventType.LOGS, EventType.ERROR, EventType.DONE}


def replay_from_row(row: Mapping[Any, Any]) -> list[ServerSentEvent]:
    output = row["output"]
    chunks = output if isinstance(output, list) else ([] if output is None else [output])
    events = [
        ServerSentEvent(output_text(chunk), event="output", id=f"0-{i + 1}")
        for i, chunk in enumerate(chunks)
    ]
    n = len(events)
    if row["error"]:
        events.append(ServerSentEvent(row["error"], event="error", id=f"0-{n + 1}"))
    events.append(ServerSentEvent(done_data(row["status"]), event="done", id=f"0-{n + 2}"))
    return events


async def follow(
    events: EventLog, prediction_id: str, after: str
) -> AsyncIterator[ServerSentEvent]:
    while True:
        for event in await events.read(prediction_id, after, block_ms=5000):
            after = event.id
            if event.type in PUBLIC_EVENTS:
                yield ServerSentEvent(event.data, event=event.type.value, id=event.id)
            if event.type is EventType.DONE:
                return


@router.get("/predictions/{prediction_id}/stream")
async def stream_prediction(
    request: Request, prediction_id: str, account: AccountDep, resources: ResourcesDep
) -> EventSourceResponse:
    row = await serving.get(resources, account, prediction_id)
    after = request.headers.get("last-event-id") or "0"
    content: Any
    if Status(row["status"]).is_terminal and not await resources.events.exists(prediction_id):
        content = iter(replay_from_row(row))
    else:
        content = follow(resources.events, prediction_id, after)
    return EventSourceResponse(
        content, ping=resources.settings.sse_ping, headers={"Cache-Control": "no-store"}
    )
