"""The runner's trust boundary (DESIGN §8), each attack tried against a real runner and refused.

- Without the runner token: every route but the health checks is 401, and nothing happens
  (no prediction runs, the runner does not stop, a director's stream is not taken over).
- Without a token configured but trusting loopback: shutdown, cancel and attach from a peer
  off loopback are 403 (and from anyone, not trusting it: tests/runners/test_internal_routes.py).
  A test cannot open a connection from a non-loopback address without leaving loopback, so a
  test-only middleware in front of the real app rewrites the peer address the runner sees
  (``request.clone(remote=...)``), exactly as a connection over a network would present it.
- The webhook sender: an internal or metadata address is refused before anything runs; a name
  resolving to a refused address is never connected to; a redirect is not followed; a flood of
  an answer is cut off after 64 KiB; and the runner token never reaches a receiver.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pydantic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.ssrf import BlockedAddress
from protocol.client import RunnerClient
from protocol.errors import RunnerUnauthorized
from protocol.headers import bearer
from runners.auth import is_loopback
from runners.config import RunnerConfig
from runners.models.echo import EchoModel
from runners.optokens import issue
from runners.server import SERVICE, create_app
from runners.service import RunnerService
from runners.webhooks import MAX_ANSWER_BYTES, open_session, post
from tests.fixtures.processes import RUNNER_AUTH, RUNNER_TOKEN, Launcher, base_env
from tests.fixtures.runner_calls import call
from tests.fixtures.waiting import until
from tests.runners.lifecycle_calls import KEY, SIGNERS, configure

DEADLINE = 10.0
TOKEN = secrets.token_urlsafe(24)
AUTH = bearer(TOKEN)
STREAM = {"Prefer": "respond-async", "Accept": "application/x-ndjson, application/json"}
ATTACH = {**STREAM, "If-Match": "*"}
PEER = "X-Test-Peer"
"""Test-only header: the peer address the runner is to see (see the module docstring)."""
ELSEWHERE = {PEER: "192.0.2.10"}  # TEST-NET-1: documentation only, never contacted
SLOW = {"input": {"prompt": "x", "n": 1, "delay": 60}}

# Every route a token-less caller must not use, with a body that would do something.
GUARDED = [
    ("GET", "/", None),
    ("GET", "/openapi.json", None),
    ("POST", "/predictions", {"input": {"prompt": "free"}}),
    ("PUT", "/predictions/p1", {"input": {"prompt": "free"}}),
    ("POST", "/predictions/p1/cancel", None),
    ("POST", "/shutdown", None),
    ("GET", "/v1/capabilities", None),
    ("POST", "/v1/models/load", {"modelId": "echo"}),
    ("GET", "/v1/models/load/task_1", None),
    ("POST", "/v1/models/unload", {"modelId": "echo"}),
    ("POST", "/v1/cache/flush", {"scope": "all"}),
    ("GET", "/metrics", None),
    ("GET", "/no-such-route", None),
]


@web.middleware
async def _peer_from_header(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    peer = request.headers.get(PEER)
    return await handler(request if peer is None else request.clone(remote=peer))


@dataclass
class Runner:
    url: str
    service: RunnerService


Start = Callable[..., Awaitable[Runner]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Real runner servers on 127.0.0.1; keyword arguments are validated RunnerConfig fields."""
    servers: list[TestServer] = []

    async def start_runner(*, peers: bool = False, **settings: Any) -> Runner:
        defaults = {"webhook_backoff_base": 0.001, "webhook_timeout": 5.0, "shutdown_grace": 1.0}
        app = create_app(EchoModel(), 2, RunnerConfig(**{**defaults, **settings}))
        if peers:
            app.middlewares.insert(0, _peer_from_header)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        runner = Runner(f"http://127.0.0.1:{server.port}", app[SERVICE])
        assert await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
        return runner

    yield start_runner
    for server in servers:
        await server.close()


async def snapshots_until_terminal(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    body = await asyncio.wait_for(response.read(), DEADLINE)
    return [orjson.loads(line) for line in body.splitlines()]


async def first_snapshot(response: aiohttp.ClientResponse) -> dict[str, Any]:
    snapshot: dict[str, Any] = orjson.loads(
        await asyncio.wait_for(response.content.readline(), DEADLINE)
    )
    return snapshot


def assert_unauthorized(status: int, body: Any, response: aiohttp.ClientResponse) -> None:
    assert status == 401, body
    assert response.content_type == "application/problem+json"
    assert (body["status"], body["code"], body["field"]) == (401, "unauthorized", "Authorization")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


# --- with a runner token ----------------------------------------------------------------------


async def test_without_the_token_only_the_health_checks_answer(
    start: Start, http: aiohttp.ClientSession
) -> None:
    runner = await start(token=TOKEN)
    for method, path, body in GUARDED:
        assert_unauthorized(*await call(http, method, runner.url + path, body))
    assert not runner.service.shutdown_requested.is_set()
    assert runner.service.get("p1") is None and not runner.service._drivers

    status, health, _ = await call(http, "GET", f"{runner.url}/health-check")
    assert (status, health["status"]) == (200, "READY")
    status, health, _ = await call(http, "GET", f"{runner.url}/health")
    assert (status, health["status"]) == (200, "healthy")


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-token-of-the-right-length",
        "Bearer {token}x",
        "Bearer {short}",
        "Basic {token}",
        "{token}",
        "Bearer",
        "Bearer  ",
    ],
)
async def test_a_wrong_token_is_401(
    start: Start, http: aiohttp.ClientSession, authorization: str
) -> None:
    runner = await start(token=TOKEN)
    headers = {"Authorization": authorization.format(token=TOKEN, short=TOKEN[:-1])}
    body = {"input": {"prompt": "free"}}
    assert_unauthorized(*await call(http, "POST", f"{runner.url}/predictions", body, headers))
    assert_unauthorized(*await call(http, "POST", f"{runner.url}/shutdown", None, headers))
    assert not runner.service.shutdown_requested.is_set()


async def test_the_right_token_opens_every_route(start: Start, http: aiohttp.ClientSession) -> None:
    runner = await start(token=TOKEN)
    body = {"input": {"prompt": "ok", "n": 2}}
    status, answer, _ = await call(http, "POST", f"{runner.url}/predictions", body, AUTH)
    assert (status, answer["status"], answer["output"]) == (200, "succeeded", ["ok-0", "ok-1"])
    lowercase = {"Authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive
    assert (await call(http, "GET", f"{runner.url}/openapi.json", None, lowercase))[0] == 200
    assert (await call(http, "GET", f"{runner.url}/v1/capabilities", None, AUTH))[0] == 200
    assert (await call(http, "GET", f"{runner.url}/metrics", None, AUTH))[0] == 200

    headers = {**AUTH, "Prefer": "respond-async"}
    assert (await call(http, "PUT", f"{runner.url}/predictions/c1", SLOW, headers))[0] == 202
    assert (await call(http, "POST", f"{runner.url}/predictions/c1/cancel", None, AUTH))[0] == 200
    assert (await call(http, "POST", f"{runner.url}/shutdown", None, AUTH))[0] == 200
    assert runner.service.shutdown_requested.is_set()


async def test_a_running_prediction_cannot_be_taken_over_or_canceled_without_the_token(
    start: Start, http: aiohttp.ClientSession
) -> None:
    runner = await start(token=TOKEN)
    url = f"{runner.url}/predictions/h1"
    request = {"input": {"prompt": "x", "n": 3, "delay": 0.2}}
    async with http.put(url, json=request, headers={**STREAM, **AUTH}) as director:
        assert director.status == 200
        assert (await first_snapshot(director))["status"] == "processing"
        for headers in (ATTACH, STREAM):  # attach, and a plain streaming PUT of the same id
            assert_unauthorized(*await call(http, "PUT", url, request, headers))
        assert_unauthorized(*await call(http, "POST", f"{url}/cancel"))
        rest = await snapshots_until_terminal(director)
    assert rest[-1]["status"] == "succeeded"
    assert rest[-1]["output"] == ["x-0", "x-1", "x-2"]


async def test_the_runner_token_comes_before_the_op_token_and_tokens_name_their_runner(
    start: Start, http: aiohttp.ClientSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(tmp_path, monkeypatch, "echo")
    runner = await start(token=TOKEN, runner_id="gpu-7")
    flush = f"{runner.url}/v1/cache/flush"

    op_token = issue(KEY, "cache-flush", "echo", SIGNERS[:2])
    body = {"scope": "all", "verifiedOpToken": op_token}
    assert_unauthorized(*await call(http, "POST", flush, body))
    status, answer, _ = await call(http, "POST", flush, body, AUTH)  # its nonce was not burned
    assert (status, answer["flushed"]) == (200, True)

    for other in ("gpu-8", "gpu-7 "):
        body["verifiedOpToken"] = issue(KEY, "cache-flush", "echo", SIGNERS[:2], runner_id=other)
        status, answer, _ = await call(http, "POST", flush, body, AUTH)
        assert (status, answer["code"], answer["field"]) == (
            403,
            "runner-mismatch",
            "verifiedOpToken",
        )
    body["verifiedOpToken"] = issue(KEY, "cache-flush", "echo", SIGNERS[:2], runner_id="gpu-7")
    assert (await call(http, "POST", flush, body, AUTH))[0] == 200
    capabilities = (await call(http, "GET", f"{runner.url}/v1/capabilities", None, AUTH))[1]
    assert capabilities["runnerId"] == "gpu-7"


def test_a_weak_or_shared_token_is_refused_at_start() -> None:
    with pytest.raises(pydantic.ValidationError, match="at least 16"):
        RunnerConfig(token="changeme")
    with pytest.raises(pydantic.ValidationError, match="must not be the runner"):
        RunnerConfig(token=TOKEN, webhook_auth_token=TOKEN)
    assert RunnerConfig(token="").token is None


# --- without a runner token, trusting loopback: internal calls from loopback only -----------


async def test_internal_calls_from_off_loopback_are_refused_without_a_token(
    start: Start, http: aiohttp.ClientSession
) -> None:
    runner = await start(peers=True, trust_loopback=True)
    url = f"{runner.url}/predictions/i1"
    request = {"input": {"prompt": "x", "n": 3, "delay": 0.2}}
    async with http.put(url, json=request, headers=STREAM) as director:
        assert (await first_snapshot(director))["status"] == "processing"
        for method, path, body, headers in [
            ("PUT", url, request, {**ATTACH, **ELSEWHERE}),
            ("PUT", url, request, {**STREAM, **ELSEWHERE}),
            ("POST", f"{url}/cancel", None, ELSEWHERE),
            ("POST", f"{runner.url}/shutdown", None, ELSEWHERE),
        ]:
            status, answer, response = await call(http, method, path, body, headers)
            assert (status, answer["code"]) == (403, "internal-only"), (method, path)
            assert response.content_type == "application/problem+json"
        assert (await call(http, "PUT", url, request, ATTACH))[0] == 200  # loopback may attach
        rest = await snapshots_until_terminal(director)
    assert rest == []  # the loopback attach took it over; the refused ones did not
    assert not runner.service.shutdown_requested.is_set()

    # Inference from elsewhere stays open without a token (the runner warns at start when it
    # listens beyond loopback); the internal calls stay refused.
    body = {"input": {"prompt": "y"}}
    status, answer, _ = await call(http, "POST", f"{runner.url}/predictions", body, ELSEWHERE)
    assert (status, answer["status"]) == (200, "succeeded")
    assert (await call(http, "POST", f"{runner.url}/shutdown"))[0] == 200
    assert runner.service.shutdown_requested.is_set()


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.10", False),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("0.0.0.0", False),
        ("", False),  # a Unix socket's peer
        (None, False),
        ("localhost", False),  # a peer is an address, never a name
    ],
)
def test_loopback_peers(peer: str | None, loopback: bool) -> None:
    assert is_loopback(peer) is loopback


# --- as the end-to-end suite runs it: a real process, and a director's client ---------------


async def test_end_to_end_runners_require_the_token_and_directors_send_it(
    http: aiohttp.ClientSession,
) -> None:
    """The runner the end-to-end fixtures start (``conduit runner``, a real process) has the
    session's token; the director's client gets in only with it, and only the runner's own
    address was bound (loopback, the default)."""
    with tempfile.TemporaryDirectory() as logdir:
        launcher = Launcher(base_env("postgresql://unused", "redis://unused"), Path(logdir))
        try:
            proc, url = await asyncio.to_thread(launcher.runner, "echo", 1)
            assert "listening on 127.0.0.1:" in proc.log()
            assert_unauthorized(*await call(http, "GET", f"{url}/openapi.json"))
            assert (await call(http, "GET", f"{url}/openapi.json", None, RUNNER_AUTH))[0] == 200

            stranger = RunnerClient(url, http)
            with pytest.raises(RunnerUnauthorized):
                await stranger.start("e1", {"prompt": "x"}, "http://127.0.0.1:9/hook")
            assert await stranger.capabilities() is None
            assert await stranger.health_check() is not None  # the probe needs no token

            director = RunnerClient(url, http, RUNNER_TOKEN)
            capabilities = await director.capabilities()
            assert capabilities is not None and capabilities.kind != "cog"
            feed = (await director.start("e2", {"prompt": "x"}, "http://127.0.0.1:9/hook")).feed
            assert feed is not None
            try:
                snapshots = [snapshot async for snapshot in feed.snapshots()]
            finally:
                feed.close()
            assert snapshots[-1].status == "succeeded"
            assert await director.cancel("e2") is False  # known to nobody any more: 404
        finally:
            await asyncio.to_thread(launcher.stop_all)


# --- the webhook sender ------------------------------------------------------------------------


@dataclass
class Recorder:
    """A real receiver on 127.0.0.1 that records every request it gets."""

    url: str = ""
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    def statuses(self) -> list[str]:
        return [orjson.loads(body).get("status", "") for _, _, body in self.requests]


@asynccontextmanager
async def recorder(
    respond: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
) -> AsyncIterator[Recorder]:
    target = Recorder()

    async def handle(request: web.Request) -> web.StreamResponse:
        target.requests.append((request.path, dict(request.headers), await request.read()))
        if respond is not None:
            return await respond(request)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    target.url = f"http://127.0.0.1:{server.port}"
    try:
        yield target
    finally:
        await server.close()


@pytest.mark.parametrize(
    "webhook",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://2852039166/latest/meta-data/",  # 169.254.169.254 spelt as one number
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/",
        "http://10.0.0.1/hook",
        "http://192.168.1.1:8080/",
        "http://0.0.0.0:5000/",
    ],
)
async def test_an_internal_webhook_is_refused_before_anything_runs(
    start: Start, http: aiohttp.ClientSession, webhook: str
) -> None:
    runner = await start()
    request = {"input": {"prompt": "x"}, "webhook": webhook}
    status, answer, _ = await call(http, "PUT", f"{runner.url}/predictions/w1", request)
    assert status == 422, answer
    assert answer["detail"][0]["loc"] == ["body", "webhook"]
    assert "CONDUIT_RUNNER_WEBHOOK_ALLOW" in answer["detail"][0]["msg"]
    assert runner.service.get("w1") is None and not runner.service._drivers
    assert runner.service.scheduler.in_use == 0


async def test_a_name_resolving_to_a_refused_address_is_never_connected_to() -> None:
    # Any allow list lets a name past the URL check; the resolver still refuses 127.0.0.1.
    config = RunnerConfig(webhook_allow="192.0.2.0/24", webhook_connect_timeout=1.5)
    async with recorder() as target, open_session(config) as session:
        assert session.timeout.sock_connect == 1.5
        url = target.url.replace("127.0.0.1", "localhost") + "/hook"
        with pytest.raises(BlockedAddress, match="resolves only to"):
            await post(session, url, b"{}", {})
        assert target.requests == []


async def test_an_allowed_host_name_is_reached() -> None:
    config = RunnerConfig(webhook_allow="localhost")
    async with recorder() as target, open_session(config) as session:
        url = target.url.replace("127.0.0.1", "localhost") + "/hook"
        assert await post(session, url, b"{}", {}) == 200
        assert [path for path, _, _ in target.requests] == ["/hook"]


async def test_a_redirect_is_not_followed(start: Start, http: aiohttp.ClientSession) -> None:
    runner = await start()
    async with recorder() as inside:

        async def redirect(request: web.Request) -> web.StreamResponse:
            return web.Response(status=307, headers={"Location": f"{inside.url}/inside"})

        async with recorder(redirect) as outside:
            request = {
                "input": {"prompt": "x"},
                "webhook": f"{outside.url}/hook",
                "webhook_events_filter": ["completed"],
            }
            status, _, _ = await call(http, "PUT", f"{runner.url}/predictions/r1", request)
            assert status == 200
            # Closing the dispatcher waits for its deliveries: the terminal one is done.
            await runner.service.webhooks.close(DEADLINE)
            assert outside.statuses() == ["succeeded"]  # one attempt: a 3xx is a refusal
        assert inside.requests == []


async def test_a_flood_of_an_answer_is_cut_off() -> None:
    """The receiver answers with an endless body: the sender reads 64 KiB, hangs up and
    returns the status; the receiver could send only what socket buffers held."""
    flood_bytes = 256 * 1024 * 1024
    sent = 0
    finished = asyncio.Event()

    async def flood(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while sent < flood_bytes:
                await response.write(chunk)
                sent += len(chunk)
        except ConnectionError:
            pass
        finally:
            finished.set()
        return response

    async with recorder(flood) as target, open_session(RunnerConfig()) as session:
        assert await post(session, f"{target.url}/hook", b"{}", {}) == 200
        await asyncio.wait_for(finished.wait(), DEADLINE)
    assert MAX_ANSWER_BYTES <= sent < flood_bytes


async def test_the_runner_token_never_reaches_a_webhook(
    start: Start, http: aiohttp.ClientSession
) -> None:
    hook_secret = secrets.token_urlsafe(24)
    async with recorder() as target:
        for settings, authorization in [
            ({}, None),
            ({"webhook_auth_token": hook_secret}, f"Bearer {hook_secret}"),
        ]:
            runner = await start(token=TOKEN, **settings)
            target.requests.clear()
            request = {"input": {"prompt": "x", "n": 2}, "webhook": f"{target.url}/hook"}
            headers = {**AUTH, "Prefer": "respond-async", "traceparent": "00-" + "1" * 32 + "-x"}
            status, _, _ = await call(http, "POST", f"{runner.url}/predictions", request, headers)
            assert status == 202

            async def terminal() -> bool:
                return "succeeded" in target.statuses()

            await until(terminal, "the terminal webhook", DEADLINE)
            for _, received, body in target.requests:
                assert received.get("Authorization") == authorization
                assert TOKEN not in str(received) and TOKEN.encode() not in body
                assert received["traceparent"].startswith("00-")
