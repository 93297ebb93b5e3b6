"""``GET /v1/predictions/<id>/stream``: server-sent events from the prediction's event stream.

Events ``output``, ``logs``, ``error`` and ``done``, each with the Redis entry id as ``id:``, so a
client joining late gets the whole history and ``Last-Event-ID`` resumes after it. A
``Last-Event-ID`` that is not a stream id (``<ms>-<seq>``), or one past the stream's last event
(any id but ``0-0`` while the stream is still empty, as a queued prediction's is), is refused
with 400 before the stream starts: resuming from a guess could repeat or skip output, and
following from a position no event will pass would never end. A client resuming from the
``done`` event itself is sent ``done`` again and the stream ends: every stream that starts ends
with ``done`` once the prediction is over.

When the history has expired, a finished prediction is replayed from its stored row with the
same event shapes as the live stream (outputs, then log lines, then the error and ``done``) and
ids ``0-1``, ``0-2``, …; ``Last-Event-ID`` skips those up to it. ``done`` is always sent: an
id from the expired live stream cannot be matched to a replayed event, and the client must
still learn that the prediction is over.

Who may read it: anyone holding the prediction's ``urls.stream``, a capability URL signed for
this prediction with an expiry (``tracker.stream_urls``) that needs no ``Authorization``, as a
browser's ``EventSource`` cannot send one; or, with the plain URL, the owner's bearer token. A
valid signature is enough on its own. A refused one is answered as such (401
``invalid_signature``, or 403 ``expired_signature`` for a genuine link past its expiry) unless a
bearer token came with it: then the token decides, as on the plain URL.

A live stream follows the process's one event reader (``tracker.event_hub``), so a client costs no
Redis connection. Past the process's waiter cap, or the share of it that the prediction's
account or the prediction itself may hold (``tracker.waiter_shares``), a stream is refused with 503
before it starts (nothing was stored, a retry is safe); at shutdown open streams end without
``done`` and the client resumes elsewhere with ``Last-Event-ID``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from redis.asyncio import Redis
from sse_starlette import EventSourceResponse, ServerSentEvent

from api import serving
from api.auth import bearer_token, refuse_capability, stream_capability
from api.deps import Resources, ResourcesDep
from api.errors import InvalidRequest, NotFound, Unavailable
from api.openapi import LAST_EVENT_ID, STREAM_EVENT, operation, problems
from tracker import keys, store
from tracker.event_hub import Subscription
from tracker.events import Event, EventLog, EventType, done_data, output_text
from tracker.redis_connect import is_cluster
from tracker.states import Status
from tracker.stream_urls import Signature

router = APIRouter(prefix="/v1")

PUBLIC_EVENTS = {EventType.OUTPUT, EventType.LOGS, EventType.ERROR, EventType.DONE}
_STREAM_ID = re.compile(r"[0-9]+-[0-9]+")
#: Each part of a Redis stream id is an unsigned 64-bit number; Redis refuses larger ones.
_MAX_ID_PART = 2**64 - 1


def _position(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def parse_last_event_id(header: str | None) -> str:
    """The stream position to resume after: ``"0"`` (from the start) without a header."""
    if not header:
        return "0"
    if not _STREAM_ID.fullmatch(header) or max(_position(header)) > _MAX_ID_PART:
        raise InvalidRequest(
            f"Last-Event-ID must be an event id from this stream, got {header!r}",
            errors=[{"field": "Last-Event-ID", "message": "expected <digits>-<digits>"}],
        )
    return header


async def last_event(redis: Redis, prediction_id: str) -> Event | None:
    """The last event of the prediction's stream; None while it has none."""
    last: Any = await redis.xrevrange(keys.events_key(prediction_id, is_cluster(redis)), count=1)
    return EventLog.parse(*last[0]) if last else None


def _refuse_unsent(after: str, last: Event | None) -> None:
    """An id past the stream's last event (any id but the start, on a stream with no event
    yet) was never sent: following from it would skip what comes before it, or wait for ever,
    as no event of the prediction, ``done`` included, would come after it."""
    if _position(after) == (0, 0):
        return
    if last is None or _position(after) > _position(last.id):
        raise InvalidRequest(
            f"Last-Event-ID {after!r} is past the last event of this stream",
            errors=[{"field": "Last-Event-ID", "message": "not an event of this stream"}],
        )


async def _over(done: Event) -> AsyncIterator[ServerSentEvent]:
    """For a client that resumes from ``done`` itself: the end, told again."""
    yield ServerSentEvent(done.data, event=done.type.value, id=done.id)


def replay_from_row(row: Mapping[Any, Any], after: str = "0") -> Iterator[ServerSentEvent]:
    output = row["output"]
    chunks = output if isinstance(output, list) else ([] if output is None else [output])
    events: list[tuple[str, str]] = [("output", output_text(chunk)) for chunk in chunks]
    events += [("logs", line) for line in (row["logs"] or "").splitlines()]
    if row["error"]:
        events.append(("error", orjson.dumps({"detail": row["error"]}).decode()))
    events.append(("done", done_data(row["status"])))
    seen = (0, 0) if after == "0" else _position(after)
    for i, (kind, data) in enumerate(events, start=1):
        if kind == "done" or (0, i) > seen:
            yield ServerSentEvent(data, event=kind, id=f"0-{i}")


_EXP_DOC = "Part of urls.stream: when the link expires (unix seconds). Sent with sig."
_SIG_DOC = "Part of urls.stream: its signature, which makes a bearer token unnecessary."


async def _readable(
    request: Request, resources: Resources, prediction_id: str, exp: str | None, sig: str | None
) -> Mapping[Any, Any]:
    """The prediction, if the request may read it (see the module's docstring)."""
    verdict = await stream_capability(resources.stream_signer, prediction_id, exp, sig)
    if verdict is Signature.VALID:
        row = await store.get(resources.engine, prediction_id)
        if row is None:  # signed once, and since deleted
            raise NotFound(f"Prediction {prediction_id} not found")
        return row
    if verdict is not None and bearer_token(request) is None:
        refuse_capability(verdict)
    account = await resources.auth.account(request)
    try:
        return await serving.get(resources, account, prediction_id)
    except NotFound:  # a training streams as a prediction does
        return await serving.get(resources, account, prediction_id, kind="training")


async def follow(subscription: Subscription) -> AsyncIterator[ServerSentEvent]:
    """The subscription's events until ``done``; it ends early, with no ``done``, when the
    process shuts down (the client resumes elsewhere with ``Last-Event-ID``)."""
    try:
        async for event in subscription:
            if event.type in PUBLIC_EVENTS:
                yield ServerSentEvent(event.data, event=event.type.value, id=event.id)
            if event.type is EventType.DONE:
                return
    finally:
        subscription.close()


def _live(
    resources: Resources, row: Mapping[Any, Any], after: str, last: Event | None
) -> AsyncIterator[ServerSentEvent]:
    """The live stream after ``after``, its stream's ``last`` event read just now."""
    _refuse_unsent(after, last)
    if last is not None and last.type is EventType.DONE and _position(after) >= _position(last.id):
        return _over(last)
    subscription = resources.hub.subscribe(row["id"], after, row["account_id"])
    if subscription is None:
        raise Unavailable(
            "This server holds its most waiting clients, in all or for this account or "
            "prediction; retry shortly."
        )
    return follow(subscription)


@router.get(
    "/predictions/{prediction_id}/stream",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "Server-sent events: output, logs, error and done, each with an id.",
            "content": {"text/event-stream": {"itemSchema": STREAM_EVENT}},
        },
        **problems(400, 401, 403, 404, 503),
    },
    openapi_extra=operation(LAST_EVENT_ID, anonymous=True),
)
async def stream_prediction(
    request: Request,
    prediction_id: str,
    resources: ResourcesDep,
    exp: str | None = Query(None, description=_EXP_DOC),
    sig: str | None = Query(None, description=_SIG_DOC),
) -> EventSourceResponse:
    row = await _readable(request, resources, prediction_id, exp, sig)
    after = parse_last_event_id(request.headers.get("last-event-id"))
    last = await last_event(resources.redis, prediction_id)
    content: AsyncIterator[ServerSentEvent] | Iterator[ServerSentEvent]
    if Status(row["status"]).is_terminal and last is None:  # the history expired
        content = replay_from_row(row, after)
    else:
        content = _live(resources, row, after, last)
    return EventSourceResponse(
        content, ping=resources.settings.sse_ping, headers={"Cache-Control": "no-store"}
    )
