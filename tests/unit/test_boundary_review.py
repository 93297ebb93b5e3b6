"""Attacks on the trust boundaries that slipped past their first tests, each refused.

Mostly pure tests of the deciding code: the api's failure budget under concurrent made-up
tokens, the director's bound on runner-reported times; and the runner's webhook logs against a
real receiver on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from starlette.requests import Request

from api.auth import Authenticator
from api.errors import RateLimited, Unauthenticated
from api.settings import ApiSettings
from catalog.records import AccountInfo
from protocol.documents import PredictionResponse
from protocol.timings import RunnerTimes
from protocol.values import WebhookEvent
from runners.config import RunnerConfig
from runners.webhooks import WebhookDispatcher


def _request(token: str, client: str = "203.0.113.7") -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/predictions",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "client": (client, 40000),
    }
    return Request(scope)


def _made_up_token() -> str:
    return "r8_" + secrets.token_urlsafe(30)


async def test_concurrent_made_up_tokens_cost_no_more_queries_than_the_budget() -> None:
    """Requests that all arrive before the first lookup answers must not each get a query:
    the budget is what a client address may cost the database, however it times its calls."""
    burst = 5
    settings = ApiSettings(auth_failure_burst=burst, auth_failures_per_minute=1)
    queries = 0

    async def load(token: str) -> AccountInfo | None:
        nonlocal queries
        queries += 1
        return None

    auth = Authenticator(load, settings)
    # Tasks run in order, each up to its first wait, before any lookup they start answers:
    # all 50 requests are in flight at once, as they would be against a slow database.
    calls = [auth.account(_request(_made_up_token())) for _ in range(50)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, RateLimited | Unauthenticated) for o in outcomes), outcomes
    assert queries <= burst
    assert sum(isinstance(o, RateLimited) for o in outcomes) >= 50 - burst


async def test_a_valid_token_does_not_spend_the_budget_it_reserved() -> None:
    """Reserving before the query must not make a client with a good token pay for it."""
    settings = ApiSettings(auth_failure_burst=1, auth_failures_per_minute=1)
    good = _made_up_token()
    account = AccountInfo(1, "alice", True, "whsec_x")

    async def load(token: str) -> AccountInfo | None:
        return account if token == good else None

    auth = Authenticator(load, settings)
    assert await auth.account(_request(good)) == account
    # The one failure the burst allows is still there.
    try:
        await auth.account(_request(_made_up_token()))
    except Unauthenticated:
        pass
    else:  # pragma: no cover - a made-up token is never an account
        raise AssertionError("a made-up token was accepted")


async def test_a_burst_with_one_new_valid_token_is_never_refused() -> None:
    """Many requests with one token the process has not verified yet (a client opening 300
    waits at once) share one query: joining it must not spend the address's budget."""
    settings = ApiSettings(auth_failure_burst=2, auth_failures_per_minute=1)
    good = _made_up_token()
    account = AccountInfo(1, "alice", True, "whsec_x")
    queries = 0

    async def load(token: str) -> AccountInfo | None:
        nonlocal queries
        queries += 1
        return account if token == good else None

    auth = Authenticator(load, settings)
    outcomes = await asyncio.gather(
        *(auth.account(_request(good)) for _ in range(300)), return_exceptions=True
    )
    assert outcomes == [account] * 300, {type(o).__name__ for o in outcomes}
    assert queries == 1


async def test_requests_joining_a_refused_lookup_pay_for_the_failure() -> None:
    """Joining costs nothing up front, but a refused token is still a failure for each."""
    settings = ApiSettings(auth_failure_burst=3, auth_failures_per_minute=1)
    bad = _made_up_token()

    async def load(token: str) -> AccountInfo | None:
        return None

    auth = Authenticator(load, settings)
    outcomes = await asyncio.gather(
        *(auth.account(_request(bad)) for _ in range(10)), return_exceptions=True
    )
    assert all(isinstance(o, Unauthenticated) for o in outcomes), outcomes
    with pytest.raises(RateLimited):  # the budget went with the failures
        await auth.account(_request(_made_up_token()))


def test_a_nan_predict_time_cannot_pass_the_observed_bound() -> None:
    """A runner (or anyone holding a webhook URL) reporting ``NaN`` must not slip past the
    clamp to the time the director observed: ``min(nan, x)`` is ``nan``."""
    bodies = [
        b'{"id":"p","status":"succeeded","metrics":{"predict_time":NaN,"gpu_time":Infinity}}',
        b'{"id":"p","status":"succeeded","metrics":{"predict_time":1' + b"0" * 400 + b"}}",
        b'{"id":"p","status":"succeeded","metrics":{"predict_time":1,"queue_wait_time":NaN}}',
    ]
    for body in bodies:
        snapshot = PredictionResponse.model_validate_json(body)
        times = RunnerTimes.from_metrics(snapshot.metrics).within(1.5)
        for value in (times.predict_time, times.queue_wait_time, times.gpu_time):
            assert value is None or (math.isfinite(value) and 0 <= value <= 1.5), times


async def test_the_runner_does_not_log_the_secret_of_a_webhook_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A director's receiver URL ends in the attempt's secret: whoever reads the runner's
    logs must not learn it from a failed delivery (a real receiver on loopback answers 503,
    then 404, the answers a restarting director gives)."""
    answers = [503, 404]

    async def receiver(request: web.Request) -> web.Response:
        return web.Response(status=answers.pop(0))

    app = web.Application()
    app.router.add_post("/{path:.*}", receiver)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    secret, port = secrets.token_urlsafe(32), server.port
    url = f"http://127.0.0.1:{port}/runner/p1/1/{secret}?token={secret}"
    dispatcher = WebhookDispatcher(
        RunnerConfig(webhook_allow="127.0.0.0/8", webhook_max_retries=1, webhook_backoff_base=0)
    )
    await dispatcher.start()
    try:
        sender = dispatcher.sender(url, {WebhookEvent.COMPLETED}, {})
        assert sender is not None
        with caplog.at_level(logging.DEBUG, logger="runners.webhooks"):
            sender.send(WebhookEvent.COMPLETED, {"id": "p1", "status": "succeeded"})
            await dispatcher.close(timeout=30)
    finally:
        await server.close()
    assert not answers, "both answers were given"
    assert f"127.0.0.1:{port}" in caplog.text  # the logs still say where
    assert secret not in caplog.text
