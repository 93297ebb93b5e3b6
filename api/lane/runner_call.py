"""One call of a ``/run`` to a runner: Cog's synchronous ``POST /predictions``.

Over the :class:`~director.runner_client.RunnerClient` of the runner (its pooled session and
its runner token), reading answers as the director does: ``Retry-After`` by
:func:`~director.runner_client.parse_retry_after`, a Conduit runner's snapshot stream by
:class:`~director.runner_client.SnapshotFeed`. Without ``Prefer: respond-async`` the runner
answers when the prediction is over, with the prediction; with ``Accept:
application/x-ndjson`` a Conduit runner streams its snapshots instead (a stock Cog server
ignores the header and answers the finished prediction, which is then the only snapshot).

What the lane needs from an answer is its :class:`~api.lane.events.Outcome`: a refusal
(Cog's 409, a 429, a 503) is capacity, not a failure; an unreachable runner, a 5xx or a
broken answer is the call failing; anything the runner ran, and an input it refused (400,
422), is ``ok``: the runner answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pydantic

from api.lane.events import Outcome
from director.runner_client import RunnerClient, SnapshotFeed, parse_retry_after
from runners import protocol as wire
from runners.protocol import PredictionResponse, RunnerStatus
from tracker.retry import UNREACHABLE

log = logging.getLogger(__name__)

#: Only connecting is bounded: a run lasts as long as its model takes (the client's
#: disconnect ends it).
_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None)
_REFUSALS = frozenset({409, 429, 503})
#: The runner's figures passed on to the client as they are.
FORWARDED = (wire.GPU_TIME_MS, wire.CACHE_HIT, wire.CACHE_TOKENS_REUSED)


@dataclass(frozen=True, slots=True)
class RunnerTiming:
    """What the runner's timing headers say (absent ones are None)."""

    queue_wait_ms: float | None = None
    processing_s: float | None = None
    forwarded: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RunnerTiming:
        return cls(
            _number(headers.get(wire.QUEUE_WAIT_MS)),
            _number(headers.get(wire.PROCESSING_TIME)),
            {name: value for name in FORWARDED if (value := headers.get(name)) is not None},
        )


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Answer:
    """How an attempt went. With ``Outcome.OK``, ``prediction`` is the final one (sync), or
    ``feed`` yields the snapshots (streaming, until the runner ends the response)."""

    outcome: Outcome
    prediction: PredictionResponse | None = None
    feed: SnapshotFeed | None = None
    timing: RunnerTiming = field(default_factory=RunnerTiming)
    retry_after: float | None = None
    error: str | None = None


def refused(status: int, headers: Mapping[str, str], text: str) -> Answer:
    return Answer(
        Outcome.REFUSED,
        retry_after=parse_retry_after(headers.get(wire.RETRY_AFTER)),
        error=f"runner answered {status}: {text[:200]}",
    )


async def call(
    client: RunnerClient,
    prediction_id: str,
    input: Any,
    *,
    tenant: str,
    priority: str,
    stream: bool,
) -> Answer:
    """``POST /predictions`` for one attempt. ``input`` may be an ``orjson.Fragment``. With
    ``stream``, a returned ``feed`` must be closed by the caller."""
    headers = {
        wire.CONTENT_TYPE: wire.JSON,
        wire.ACCEPT: f"{wire.NDJSON}, {wire.JSON}" if stream else wire.JSON,
        wire.TENANT_ID: tenant,
        wire.PRIORITY: priority,
        **client.auth,
    }
    body = _body(prediction_id, input)
    url = client.base_url + wire.PREDICTIONS_PATH
    try:
        response = await client.session.post(
            url, data=body, headers=headers, timeout=_TIMEOUT, allow_redirects=False
        )
    except UNREACHABLE as error:
        return Answer(Outcome.FAILED, error=f"runner unreachable: {error!r}")
    timing = RunnerTiming.from_headers(response.headers)
    if response.status == 200 and response.content_type == wire.NDJSON:
        return Answer(Outcome.OK, feed=SnapshotFeed(response), timing=timing)
    try:
        text = await response.text()
    except UNREACHABLE as error:
        return Answer(Outcome.FAILED, error=f"runner answer broken off: {error!r}")
    finally:
        response.release()
    return _read(response.status, response.headers, text, timing)


def _body(prediction_id: str, input: Any) -> bytes:
    return orjson.dumps({"id": prediction_id, "input": input})


def _read(status: int, headers: Mapping[str, str], text: str, timing: RunnerTiming) -> Answer:
    if status in _REFUSALS:
        return refused(status, headers, text)
    if status in (400, 422):
        prediction = PredictionResponse(
            id=None, status=RunnerStatus.FAILED, error=f"the runner refused the input: {text}"
        )
        return Answer(Outcome.OK, prediction=prediction, timing=timing)
    if status not in (200, 201):
        return Answer(Outcome.FAILED, error=f"runner answered {status}: {text[:300]}")
    try:
        prediction = PredictionResponse.model_validate_json(text)
    except pydantic.ValidationError as error:
        return Answer(Outcome.FAILED, error=f"unreadable answer from the runner: {error}")
    if not prediction.status.is_terminal:
        return Answer(Outcome.FAILED, error=f"the runner answered {prediction.status.value}")
    return Answer(Outcome.OK, prediction=prediction, timing=timing)


async def snapshots(answer: Answer) -> AsyncIterator[PredictionResponse]:
    """An ``ok`` answer's snapshots: the feed's, or the one final prediction."""
    if answer.feed is None:
        if answer.prediction is not None:
            yield answer.prediction
        return
    async for snapshot in answer.feed.snapshots():
        yield snapshot


async def cancel_quietly(client: RunnerClient, prediction_id: str) -> None:
    """Tell the runner to stop a run nobody reads any more (best effort)."""
    try:
        async with asyncio.timeout(5):
            await client.cancel(prediction_id)
    except Exception as error:  # the run ends on its own; nothing else to do
        log.debug("cancel of %s on %s not sent: %r", prediction_id, client.base_url, error)
