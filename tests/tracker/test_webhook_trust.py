"""No webhook reaches a runner, and the status line is the delivery.

- Cog's protocol routes are refused on any host, in every spelling a server would route.
- The fleet's runners (:mod:`tracker.webhook_targets`, from the real registry in Redis) are
  refused by host and port whatever the path, at create and again at every attempt, by the
  URL check and by the resolver, so a name for a runner's address does not get through.
- A receiver that answers 200 and then drips its body (a real socket server) has been
  delivered to, once: the sender hangs up on the body and keeps the status.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from core.ssrf import (
    BlockedAddress,
    GuardedResolver,
    RefusedEndpoints,
    check_webhook_url,
    parse_cidrs,
    protocol_route,
)
from tests.fixtures import deliveries
from tests.fixtures.dripping import dripping_receiver
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import until
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.fleet import FleetEntry, FleetRegistry, FleetView, RunnerState, runner_entry_id
from tracker.webhook_targets import FleetTargets
from tracker.webhooks import DeliveryFailed, WebhookPolicy, open_session, post

SECRET = "whsec_" + "A" * 44
LOOPBACK = parse_cidrs("127.0.0.0/8,::1/128")
DEADLINE = 20.0


# --- Cog's routes, on any host ------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5000/shutdown",
        "https://hooks.example.com/shutdown",
        "https://hooks.example.com/shutdown/",
        "https://hooks.example.com//shutdown",
        "https://hooks.example.com/%73hutdown",
        "https://hooks.example.com/a/../shutdown",
        "https://hooks.example.com/a/%2e%2e/shutdown",
        "https://hooks.example.com/Shutdown?x=1#y",
        "https://hooks.example.com/predictions",
        "https://hooks.example.com/predictions/p1",
        "https://hooks.example.com/predictions/p1/cancel",
        "https://hooks.example.com/trainings/t1/cancel",
        "https://hooks.example.com/health-check",
        "https://hooks.example.com/v1/models/load",
        "https://hooks.example.com/v1/models/unload",
        "https://hooks.example.com/v1/cache/flush",
        "https://hooks.example.com/models/echo/predictions/p1/cancel",
    ],
)
def test_a_cog_route_is_refused_on_any_host(url: str) -> None:
    assert protocol_route(url) is not None
    with pytest.raises(BlockedAddress, match="route of Cog's runner protocol"):
        check_webhook_url(url, LOOPBACK, allow_hosts=["hooks.example.com"])


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/",
        "https://hooks.example.com/hooks/shutdown",
        "https://hooks.example.com/shutdowns",
        "https://hooks.example.com/predictions-done",
        "https://hooks.example.com/predictions/p1/done",
        "https://hooks.example.com/runner/p1/1/secret",
        "https://hooks.example.com/webhook?next=/shutdown",
    ],
)
def test_other_paths_pass(url: str) -> None:
    assert protocol_route(url) is None
    check_webhook_url(url)


# --- the fleet's runners ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5000/hook",
        "http://localhost:5000/hook",
        "http://127.0.0.9:5000/",
        "http://[::1]:5000/x",
        "http://[::ffff:127.0.0.1]:5000/x",
        "http://2130706433:5000/x",
        "http://10.1.2.3:8080/x",
        "http://RUNNER-0.runners.svc:5001/x",
        "http://runner-0.runners.svc.:5001/x",
    ],
)
def test_a_fleet_runner_is_refused_whatever_the_spelling(url: str) -> None:
    refused = RefusedEndpoints(
        ["http://127.0.0.1:5000", "http://10.1.2.3:8080/", "http://runner-0.runners.svc:5001"]
    )
    allow = (*LOOPBACK, *parse_cidrs("10.0.0.0/8"))
    with pytest.raises(BlockedAddress, match="is a runner's"):
        check_webhook_url(url, allow, allow_hosts=["runner-0.runners.svc"], refused=refused)


def test_another_port_or_host_passes() -> None:
    refused = RefusedEndpoints(["http://127.0.0.1:5000"])
    check_webhook_url("http://127.0.0.1:5001/hook", LOOPBACK, refused=refused)
    check_webhook_url("http://10.0.0.1:5000/hook", parse_cidrs("10.0.0.0/8"), refused=refused)


async def test_the_resolver_refuses_a_name_for_a_runners_address() -> None:
    """``localhost`` passes the URL check when the runner is listed by address; the resolver
    refuses the address the name resolves to, so nothing is ever connected to."""
    hits: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    port = server.port
    assert port is not None
    try:
        refused = RefusedEndpoints([f"http://127.0.0.2:{port}"])  # another spelling
        resolver = GuardedResolver(LOOPBACK, refused=refused)
        with pytest.raises(BlockedAddress):
            await resolver.resolve("localhost", port)
        assert await resolver.resolve("localhost", port - 1)  # another port of the host

        policy = WebhookPolicy(allow=LOOPBACK, refused=refused)
        async with open_session(policy) as session:
            for url in (f"http://localhost:{port}/hook", f"{server.make_url('/hook')}"):
                with pytest.raises(DeliveryFailed, match="runner"):
                    await post(session, policy, url, "msg_1", SECRET, "{}")
            refused.install([])  # the fleet changed: the same URL goes through now
            assert await post(session, policy, f"{server.make_url('/hook')}", "m", SECRET, "{}")
        assert hits == ["/hook"]
    finally:
        await server.close()


# --- following the registry ---------------------------------------------------------------


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client: Redis = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _entry(url: str) -> FleetEntry:
    return FleetEntry(
        id=runner_entry_id(url),
        url=url,
        deployment=f"test/trust-{uuid.uuid4().hex[:8]}",
        version_id="v" * 64,
        concurrency=1,
        state=RunnerState.READY,
        hardware="cpu",
        heartbeat_at=time.time(),
        director="director-t",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_refused_endpoints_follow_the_registry(redis: Redis) -> None:
    registry = FleetRegistry(redis, ttl=30)
    port = 20000 + uuid.uuid4().int % 40000
    entry = _entry(f"http://127.0.0.1:{port}")
    refused = RefusedEndpoints()
    clock = Clock()
    targets = FleetTargets(redis, refused, remember=60, clock=clock)
    await targets.refresh()
    assert not refused.refuses("127.0.0.1", port)

    await registry.register(entry)
    await targets.refresh()
    assert refused.refuses("localhost", port)
    pod = _entry(f"http://10.9.8.7:{port + 2}")  # as api replicas reach it: on loopback too
    await registry.register(pod)
    await targets.refresh()
    assert refused.refuses("10.9.8.7", port + 2) and refused.refuses("::1", port + 2)
    assert not refused.refuses("10.9.8.7", port)
    await registry.deregister(pod.id)

    await registry.deregister(entry.id)
    clock.now += 30
    await targets.refresh()
    assert refused.refuses("127.0.0.1", port)  # its runner may still listen
    other = _entry(f"http://127.0.0.1:{port + 1}")
    await registry.register(other)
    clock.now += 31
    await targets.refresh()
    assert not refused.refuses("127.0.0.1", port)
    assert refused.refuses("127.0.0.1", port + 1)
    await registry.deregister(other.id)


async def test_refused_endpoints_follow_a_view_the_process_already_keeps(redis: Redis) -> None:
    """The api's lane keeps the one fleet view; the webhook guard follows it without a read of
    its own, and leaves the view running when it stops."""
    registry = FleetRegistry(redis, ttl=30)
    port = 20000 + uuid.uuid4().int % 40000
    entry = _entry(f"http://127.0.0.1:{port}")
    view = FleetView(redis)
    refused = RefusedEndpoints()
    targets = FleetTargets(view, refused)
    await view.refresh()
    await targets.start()
    assert not refused.refuses("127.0.0.1", port)
    try:
        await registry.register(entry)
        await view.refresh()  # the owner's refresh is the guard's
        assert refused.refuses("127.0.0.1", port)
        await targets.stop()
        await registry.deregister(entry.id)
        await view.refresh()
        assert entry.id not in view.entries  # still the owner's to read and to stop
    finally:
        await registry.deregister(entry.id)


# --- the dispatcher, at send time ---------------------------------------------------------


@pytest.fixture(scope="module")
def trust_database(services: ServiceUrls) -> str:
    url = create_database(services.database_url, f"conduit_trust_{uuid.uuid4().hex[:12]}")
    migrate(url)
    return url


@pytest.fixture
async def db(trust_database: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(trust_database, pool_size=4)
    yield engine
    await engine.dispose()


async def _outcome(engine: AsyncEngine, delivery: str) -> tuple[int, str | None]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT attempts, last_error FROM webhook_deliveries WHERE id = :id"),
                {"id": delivery},
            )
        ).one()
    return row.attempts, row.last_error


async def test_the_dispatcher_refuses_a_runner_the_fleet_learnt_of_after_create(
    db: AsyncEngine, redis: Redis
) -> None:
    hits: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = TestServer(app, host="127.0.0.1")
    await runner.start_server()
    entry = _entry(f"http://127.0.0.1:{runner.port}")
    registry = FleetRegistry(redis, ttl=60)
    try:
        delivery = await deliveries.insert_delivery(
            db, f"http://localhost:{runner.port}/anything", "trust"
        )
        await registry.register(entry)
        policy = WebhookPolicy(allow=LOOPBACK, schedule=(3600.0,), poll_interval=0.1)
        async with open_session(policy) as session:
            dispatcher = Dispatcher(db, policy, session, redis=redis)
            dispatcher.start()
            try:

                async def attempted() -> bool:
                    return (await _outcome(db, delivery))[0] > 0

                await until(attempted, "the delivery's attempt", DEADLINE)
            finally:
                await dispatcher.stop()
        attempts, error = await _outcome(db, delivery)
        assert error is not None and "runner" in error, error
        assert hits == []
    finally:
        await registry.deregister(entry.id)
        await runner.close()


# --- the status line is the delivery ------------------------------------------------------


async def test_a_200_whose_body_drips_is_delivered_once() -> None:
    policy = WebhookPolicy(allow=LOOPBACK, timeout=10.0)
    async with dripping_receiver() as receiver, open_session(policy) as session:
        status = await post(session, policy, f"{receiver.url}/hook", "msg_d", SECRET, "{}")
        assert status == 200

        async def hung_up() -> bool:
            return receiver.hung_up == 1

        await until(hung_up, "the sender hanging up on the body", DEADLINE)
        assert receiver.bodies == [b"{}"]


async def test_a_500_whose_body_drips_is_still_a_failure_by_its_status() -> None:
    policy = WebhookPolicy(allow=LOOPBACK, timeout=10.0)
    async with dripping_receiver(status=500) as receiver, open_session(policy) as session:
        with pytest.raises(DeliveryFailed) as failure:
            await post(session, policy, f"{receiver.url}/hook", "msg_e", SECRET, "{}")
        assert failure.value.status == 500
