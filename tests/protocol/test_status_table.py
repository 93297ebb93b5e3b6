"""The one status table: every answer a Conduit runner, a model pool host and stock Cog give a
prediction request reads as one verdict, and the director (a start) and the synchronous lane
(a ``/run`` call) make the same thing of it -- accepted, the client's bad input, capacity, or
the runner failing -- first from the table alone, then through both clients against a real
loopback server that answers with the runners' own refusals."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from lane.events import Outcome
from lane.runner_call import Answer, answer_of
from lane.runner_call import call as lane_call
from protocol.answers import Refusal, Verdict, read
from protocol.client import RunnerClient
from protocol.errors import (
    CannotServe,
    InputRejected,
    OutOfTime,
    RunnerError,
    RunnerRefused,
    error_for,
)
from protocol.outcomes import RunAnswer
from runners.errors import (
    AtCapacityError,
    BackendUnreachableError,
    CooldownError,
    DeadlineExceededError,
    DeadlineUnmeetableError,
    LoadFailedError,
    ModelNotLoadedError,
    ModelTooLargeError,
    NotReadyError,
    NotRunningError,
    QueueFullError,
    RateLimit,
    RateLimitedError,
    RequestRefused,
    UnknownSlotError,
)
from runners.problems import refusal
from runners.request_errors import (
    InputValidationError,
    InternalOnlyError,
    UnauthorizedError,
    UnsupportedEncodingError,
    ValidationIssue,
    WebhookRefusedError,
)

#: What each side may make of an answer, in words both share.
ACCEPTED, BAD_INPUT, CAPACITY, RUNNER_FAILED = "accepted", "bad input", "capacity", "failed"


@dataclass(frozen=True)
class Row:
    """One answer a runner gives to a prediction request."""

    sender: str
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]
    verdict: Verdict
    meaning: str

    @property
    def text(self) -> str:
        return self.body.decode()

    def response(self) -> web.Response:
        return web.Response(
            body=self.body, status=self.status, content_type=self.content_type, headers=self.headers
        )


def _refused(sender: str, error: RequestRefused, verdict: Verdict, meaning: str) -> Row:
    """A runner's own refusal, rendered as its HTTP shell renders it."""
    response = refusal(error)
    assert isinstance(response.body, bytes)
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-type"}
    content_type = response.content_type
    return Row(sender, error.status, response.body, content_type, headers, verdict, meaning)


def _literal(
    sender: str, status: int, body: Any, verdict: Verdict, meaning: str, **headers: str
) -> Row:
    return Row(sender, status, orjson.dumps(body), "application/json", headers, verdict, meaning)


_RATE = RateLimit(limit=10, remaining=0, window=60.0, reset_at=time.time() + 30, retry_after=30)
_COG_BUSY = {"error": "At capacity - all prediction slots busy", "status": "failed"}
_COG_SETUP = {"error": "Setup has not finished yet.", "status": "failed"}
_FASTAPI_422 = {"detail": [{"loc": ["body", "input", "n"], "msg": "bad", "type": "value_error"}]}
_SPEC_FULL = {"error": {"code": "queue_full", "message": "Queue depth 16/16", "queueDepth": 16}}

ROWS: list[Row] = [
    # A single Conduit runner.
    _refused("conduit", AtCapacityError(), Verdict.REFUSED, CAPACITY),
    _refused("conduit", QueueFullError(16, 16, 120.0, 3), Verdict.REFUSED, CAPACITY),
    _refused("conduit", RateLimitedError("7", _RATE), Verdict.REFUSED, CAPACITY),
    _refused("conduit", NotReadyError(), Verdict.REFUSED, CAPACITY),
    _refused("conduit", ModelNotLoadedError("m"), Verdict.REFUSED, CAPACITY),
    _refused(
        "conduit",
        InputValidationError([ValidationIssue("n", "must be an integer")]),
        Verdict.INPUT_REJECTED,
        BAD_INPUT,
    ),
    _refused("conduit", WebhookRefusedError("webhook refused"), Verdict.INPUT_REJECTED, BAD_INPUT),
    _refused("conduit", UnauthorizedError(), Verdict.UNAUTHORIZED, RUNNER_FAILED),
    _refused("conduit", InternalOnlyError("attach"), Verdict.UNAUTHORIZED, RUNNER_FAILED),
    _refused("conduit", NotRunningError("p1"), Verdict.NOT_RUNNING, RUNNER_FAILED),
    _refused("conduit", UnsupportedEncodingError("gzip"), Verdict.BROKEN, RUNNER_FAILED),
    # A model pool host.
    _refused("pool", QueueFullError(4, 4, 0.0, 1), Verdict.REFUSED, CAPACITY),
    _refused("pool", CooldownError("m", 5.0, "it crashed"), Verdict.REFUSED, CAPACITY),
    _refused("pool", LoadFailedError("m", 2.0), Verdict.REFUSED, CAPACITY),
    _refused("pool", ModelTooLargeError("m", None), Verdict.CANNOT_SERVE, RUNNER_FAILED),
    _refused("pool", DeadlineUnmeetableError("m", None), Verdict.OUT_OF_TIME, RUNNER_FAILED),
    _refused("pool", DeadlineExceededError("m", None), Verdict.OUT_OF_TIME, RUNNER_FAILED),
    _refused("pool", UnknownSlotError("m", None), Verdict.BROKEN, RUNNER_FAILED),
    _refused("pool", BackendUnreachableError("no answer"), Verdict.BROKEN, RUNNER_FAILED),
    # Stock Cog (coglet), and a runner that speaks the runner API spec's 503.
    _literal("cog", 409, _COG_BUSY, Verdict.REFUSED, CAPACITY),
    _literal("cog", 503, _COG_SETUP, Verdict.REFUSED, CAPACITY, **{"Retry-After": "2"}),
    _literal("cog", 422, _FASTAPI_422, Verdict.INPUT_REJECTED, BAD_INPUT),
    _literal("cog", 400, {"detail": "Invalid JSON"}, Verdict.INPUT_REJECTED, BAD_INPUT),
    _literal("cog", 500, {"detail": "Internal Server Error"}, Verdict.BROKEN, RUNNER_FAILED),
    _literal("cog", 502, {}, Verdict.BROKEN, RUNNER_FAILED),
    _literal("spec", 503, _SPEC_FULL, Verdict.REFUSED, CAPACITY, **{"Retry-After": "5"}),
]


def _ids(row: Row) -> str:
    return f"{row.sender}-{row.status}-{row.verdict}"


def _director(error: BaseException | None) -> str:
    """What the director makes of a start's outcome (None: accepted)."""
    if error is None:
        return ACCEPTED
    if isinstance(error, InputRejected):
        return BAD_INPUT
    if isinstance(error, RunnerRefused):
        return CAPACITY
    assert isinstance(error, RunnerError | OutOfTime | CannotServe), error
    return RUNNER_FAILED


def _lane(answer: Answer) -> str:
    """What the lane makes of a call's answer."""
    if answer.outcome is Outcome.REFUSED:
        return CAPACITY
    if answer.outcome in (Outcome.FAILED, Outcome.UNAUTHORIZED):
        # A runner refusing the api's token failed as a runner does (the lane also takes it
        # out of service at once): never the caller's input, never capacity.
        return RUNNER_FAILED
    assert answer.outcome is Outcome.OK
    assert answer.prediction is not None or answer.feed is not None
    if answer.prediction is not None and "refused the input" in (answer.prediction.error or ""):
        return BAD_INPUT
    return ACCEPTED


@pytest.mark.parametrize("row", ROWS, ids=_ids)
def test_each_answer_reads_as_one_verdict_both_sides_share(row: Row) -> None:
    headers = CIMultiDict({"Content-Type": row.content_type, **row.headers})
    reading = read(row.status, headers, row.text)
    assert reading.verdict is row.verdict, reading
    assert _director(error_for(reading, row.text)) == row.meaning
    assert _lane(answer_of(RunAnswer(reading, text=row.text))) == row.meaning
    if "Retry-After" in row.headers:
        assert reading.retry_after == float(row.headers["Retry-After"])


def test_refusals_are_told_apart() -> None:
    reasons = {}
    for row in ROWS:
        if row.verdict is Verdict.REFUSED:
            headers = CIMultiDict({"Content-Type": row.content_type, **row.headers})
            reasons[(row.sender, row.status, row.text[:40])] = read(row.status, headers, row.text)
    by_reason = {reading.refusal for reading in reasons.values()}
    assert by_reason == set(Refusal)


def test_only_a_2xx_is_accepted_and_any_other_status_is_covered() -> None:
    for status in range(200, 300):
        assert read(status, CIMultiDict(), "").verdict is Verdict.ACCEPTED
    for status in (*range(300, 600),):
        verdict = read(status, CIMultiDict(), "{}").verdict
        assert verdict is not Verdict.ACCEPTED
        assert verdict is not Verdict.UNREACHABLE


# --- both clients against a loopback runner ---------------------------------------------------


@dataclass
class Loopback:
    answer: Callable[[], web.Response]


_FINISHED = {"id": "p1", "status": "succeeded", "output": "ok", "logs": "", "metrics": {}}


@pytest.fixture
async def runner() -> AsyncIterator[tuple[Loopback, RunnerClient]]:
    state = Loopback(lambda: web.json_response({}, status=500))

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return state.answer()

    app = web.Application()
    app.router.add_put("/predictions/{id}", answer)
    app.router.add_post("/predictions", answer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield state, RunnerClient(str(server.make_url("/")), session)
    await server.close()


async def _start(client: RunnerClient) -> BaseException | None:
    try:
        await client.start("p1", {}, "http://127.0.0.1:1/hook", tenant="7", deadline=30.0)
    except (RunnerError, InputRejected, OutOfTime, CannotServe) as error:
        return error
    return None


async def _call(client: RunnerClient) -> Answer:
    return await lane_call(client, "p1", {}, tenant="7", priority="normal", stream=False)


async def test_the_director_and_the_lane_agree_on_every_answer(
    runner: tuple[Loopback, RunnerClient],
) -> None:
    state, client = runner
    for row in ROWS:
        state.answer = row.response
        director, lane = _director(await _start(client)), _lane(await _call(client))
        assert (director, lane) == (row.meaning, row.meaning), row
    # Accepted: a start's 202, a synchronous call's finished prediction.
    state.answer = lambda: web.json_response({"status": "starting"}, status=202)
    assert _director(await _start(client)) == ACCEPTED
    state.answer = lambda: web.json_response(_FINISHED)
    assert _lane(await _call(client)) == ACCEPTED


async def test_a_pool_that_cannot_hold_the_model_is_not_the_clients_bad_input(
    runner: tuple[Loopback, RunnerClient],
) -> None:
    state, client = runner
    state.answer = _refused(
        "pool", ModelTooLargeError("big", None), Verdict.CANNOT_SERVE, ""
    ).response
    error = await _start(client)
    assert isinstance(error, CannotServe) and error.code == "model_too_large"
    answer = await _call(client)
    assert answer.outcome is Outcome.FAILED
    assert answer.prediction is None
    assert "model_too_large" in (answer.error or "")
