"""A webhook can never drive a runner: loopback is no credential, and no sender calls Cog routes.

Real runners on 127.0.0.1 (aiohttp test servers), called from loopback as anything on their
host could call them:

- Without a runner token, shutdown, cancel, attach and a streaming takeover are refused to every
  peer, loopback included, unless ``CONDUIT_RUNNER_TRUST_LOOPBACK`` opts in; even then a
  request that carries a webhook delivery's marks is refused.
- A runner's own webhook sender refuses a webhook naming a Cog route on any host (another
  runner's ``/shutdown``): 422 before anything runs, and the other runner keeps running.
- A body sent with a ``Content-Encoding`` is refused unread: 415 problem+json naming the header.
"""

from __future__ import annotations

import asyncio
import gzip
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from protocol.headers import bearer
from runners.config import RunnerConfig
from runners.models.echo import EchoModel
from runners.server import SERVICE, create_app
from runners.service import RunnerService
from tests.fixtures.runner_calls import call

DEADLINE = 10.0
TOKEN = secrets.token_urlsafe(24)
STREAM = {"Prefer": "respond-async", "Accept": "application/x-ndjson, application/json"}
ATTACH = {**STREAM, "If-Match": "*"}
ASYNC = {"Prefer": "respond-async"}
SLOW = {"input": {"prompt": "x", "n": 1, "delay": 60}}


@dataclass
class Runner:
    url: str
    service: RunnerService


Start = Callable[..., Awaitable[Runner]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    servers: list[TestServer] = []

    async def start_runner(**settings: Any) -> Runner:
        defaults = {"webhook_backoff_base": 0.001, "webhook_timeout": 5.0, "shutdown_grace": 1.0}
        app = create_app(EchoModel(), 2, RunnerConfig(**{**defaults, **settings}))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server(auto_decompress=False)  # as run_app serves it
        servers.append(server)
        runner = Runner(f"http://127.0.0.1:{server.port}", app[SERVICE])
        assert await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
        return runner

    yield start_runner
    for server in servers:
        await server.close()


def internal_calls(url: str) -> list[tuple[str, str, Any, dict[str, str]]]:
    """Every internal call against a running prediction ``i1`` of the runner at ``url``."""
    prediction = f"{url}/predictions/i1"
    return [
        ("PUT", prediction, SLOW, ATTACH),
        ("PUT", prediction, SLOW, STREAM),
        ("POST", f"{prediction}/cancel", None, {}),
        ("POST", f"{url}/shutdown", None, {}),
    ]


def assert_internal_only(status: int, body: Any, response: aiohttp.ClientResponse) -> None:
    assert status == 403, body
    assert response.content_type == "application/problem+json"
    assert (body["status"], body["code"]) == (403, "internal-only")


async def test_without_a_token_loopback_is_no_credential(
    start: Start, http: aiohttp.ClientSession
) -> None:
    runner = await start()
    started = await call(http, "PUT", f"{runner.url}/predictions/i1", SLOW, ASYNC)
    assert started[0] == 202
    for method, url, body, headers in internal_calls(runner.url):
        status, answer, response = await call(http, method, url, body, headers)
        assert_internal_only(status, answer, response)
        assert "CONDUIT_RUNNER_TOKEN" in answer["detail"]
    assert not runner.service.shutdown_requested.is_set()
    assert runner.service.get("i1") is not None  # still running: nothing took it over

    # Inference stays open, as on stock Cog.
    status, answer, _ = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": "y"}}
    )
    assert (status, answer["status"]) == (200, "succeeded")


@pytest.mark.parametrize(
    "marks",
    [
        {"webhook-id": "msg_1", "webhook-timestamp": "1", "webhook-signature": "v1,x"},
        {"webhook-signature": "v1,x"},
        {"User-Agent": "conduit-webhooks/0.1"},
        {"User-Agent": "coglet/0.23.1"},
    ],
)
async def test_trusting_loopback_never_trusts_a_webhook_delivery(
    start: Start, http: aiohttp.ClientSession, marks: dict[str, str]
) -> None:
    runner = await start(trust_loopback=True)
    status, answer, response = await call(http, "POST", f"{runner.url}/shutdown", None, marks)
    assert_internal_only(status, answer, response)
    assert "webhook" in answer["detail"]
    assert not runner.service.shutdown_requested.is_set()

    assert (await call(http, "POST", f"{runner.url}/shutdown"))[0] == 200  # a plain call may
    assert runner.service.shutdown_requested.is_set()


async def test_with_a_token_the_internal_calls_take_it_from_loopback_too(
    start: Start, http: aiohttp.ClientSession
) -> None:
    runner = await start(token=TOKEN, trust_loopback=True)
    status, answer, _ = await call(http, "POST", f"{runner.url}/shutdown")
    assert (status, answer["code"]) == (401, "unauthorized")
    assert (await call(http, "POST", f"{runner.url}/shutdown", None, bearer(TOKEN)))[0] == 200


@pytest.mark.parametrize(
    "path",
    [
        "/shutdown",
        "/shutdown/",
        "//shutdown",
        "/%73hutdown",
        "/hooks/../shutdown",
        "/SHUTDOWN?then=ok",
        "/predictions/i1/cancel",
        "/predictions",
        "/v1/models/unload",
        "/models/echo/predictions/i1/cancel",
    ],
)
async def test_a_runner_sends_no_webhook_to_a_cog_route(
    start: Start, http: aiohttp.ClientSession, path: str
) -> None:
    # The target trusts loopback, as a runner without a token did before: only the sender's
    # refusal keeps it running.
    target = await start(trust_loopback=True)
    assert (await call(http, "PUT", f"{target.url}/predictions/i1", SLOW, ASYNC))[0] == 202
    sender = await start()
    request = {"input": {"prompt": "x"}, "webhook": target.url + path}
    status, answer, _ = await call(http, "PUT", f"{sender.url}/predictions/w1", request)
    assert status == 422, answer
    assert answer["detail"][0]["loc"] == ["body", "webhook"]
    assert "route of Cog's runner protocol" in answer["detail"][0]["msg"]
    assert sender.service.get("w1") is None
    assert not target.service.shutdown_requested.is_set()
    assert target.service.get("i1") is not None


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZip", "x-anything"])
async def test_an_encoded_body_is_refused_unread(
    start: Start, http: aiohttp.ClientSession, encoding: str
) -> None:
    runner = await start(token=TOKEN)
    body = gzip.compress(orjson.dumps({"input": {"prompt": "z"}}))
    headers = {**bearer(TOKEN), "Content-Encoding": encoding, "Content-Type": "application/json"}
    async with http.put(f"{runner.url}/predictions/z1", data=body, headers=headers) as response:
        problem = await response.json(content_type=None)
        assert response.status == 415, problem
        assert response.content_type == "application/problem+json"
        assert response.headers["Accept-Encoding"] == "identity"
    assert problem["code"] == "unsupported-content-encoding"
    assert problem["field"] == "Content-Encoding"
    assert runner.service.get("z1") is None

    # Unauthenticated, the token comes first; identity is no encoding at all.
    status, answer, _ = await call(http, "POST", f"{runner.url}/predictions", {"input": {}})
    assert status == 401
    identity = {**bearer(TOKEN), "Content-Encoding": "identity"}
    status, answer, _ = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": "i"}}, identity
    )
    assert (status, answer["status"]) == (200, "succeeded")
