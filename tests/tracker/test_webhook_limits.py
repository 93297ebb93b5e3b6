"""Webhook senders against receivers that stream, stall or hold: what one receiver (or one
account's receivers) can cost the sender and other accounts.

The durable dispatcher runs against a database of this module's own: it leases every due row
it finds, so rows of other tests (or their stacks' dispatchers) must not meet it.
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from core.ids import new_webhook_secret
from core.ssrf import parse_cidrs
from tests.fixtures.fences import Unfenced
from tests.fixtures.predictions import new_predictions
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import until
from tracker import store
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.intermediate import IntermediateSender, SendSlots
from tracker.webhook_settings import WebhookSettings
from tracker.webhooks import RESPONSE_LIMIT, DeliveryFailed, WebhookPolicy, open_session, post

LOOPBACK = parse_cidrs("127.0.0.0/8")
#: Long enough that an attempt ended by ``timeout`` fails the test that expects another end.
SLOW = 20.0
#: One try, then a retry far beyond any test: an attempt's outcome stays as recorded.
ONE_TRY = (3600.0,)


@pytest.fixture(scope="module")
def limits_database(services: ServiceUrls) -> str:
    url = create_database(services.database_url, f"conduit_limits_{uuid.uuid4().hex[:12]}")
    migrate(url)
    return url


@pytest.fixture
async def db(limits_database: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(limits_database, pool_size=4)
    yield engine
    await engine.dispose()


# --- durable deliveries -------------------------------------------------------------------


@dataclass
class Delivery:
    id: str
    account_id: int


async def deliveries(engine: AsyncEngine, url: str, count: int, age: float = 0.0) -> list[Delivery]:
    """``count`` due ``completed`` deliveries to ``url`` of one new account, oldest first;
    the newest became due ``age`` seconds ago."""
    news = await new_predictions(engine, [{} for _ in range(count)], "limits")
    await store.insert_predictions(engine, news)
    made = [Delivery("msg_" + uuid.uuid4().hex[:24], news[0].account_id) for _ in news]
    async with engine.begin() as conn:
        for n, (delivery, new) in enumerate(zip(made, news, strict=True)):
            await conn.execute(
                text(
                    "INSERT INTO webhook_deliveries "
                    "(id, prediction_id, account_id, url, event, body, next_attempt_at) "
                    "VALUES (:id, :pid, :account, :url, 'completed', '{}', "
                    "now() - make_interval(secs => :ago))"
                ),
                {
                    "id": delivery.id,
                    "pid": new.id,
                    "account": delivery.account_id,
                    "url": url,
                    "ago": age + (count - n) * 0.001,
                },
            )
    return made


@dataclass(frozen=True)
class Outcome:
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None


async def outcomes(engine: AsyncEngine, made: list[Delivery]) -> list[Outcome]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT id, status, attempts, last_status, last_error "
                    "FROM webhook_deliveries WHERE id = ANY(:ids)"
                ),
                {"ids": [d.id for d in made]},
            )
        ).all()
    found = {row.id: Outcome(*row[1:]) for row in rows}
    return [found[d.id] for d in made]


def attempted(engine: AsyncEngine, made: list[Delivery]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return all(o.attempts > 0 for o in await outcomes(engine, made))

    return probe


@asynccontextmanager
async def dispatching(engine: AsyncEngine, policy: WebhookPolicy) -> AsyncIterator[Dispatcher]:
    async with open_session(policy) as session:
        dispatcher = Dispatcher(engine, policy, session)
        dispatcher.start()
        try:
            yield dispatcher
        finally:
            await dispatcher.stop()


# --- receivers ----------------------------------------------------------------------------


@dataclass
class Held:
    """A receiver path whose requests hang until ``release`` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    most_in_flight: int = 0
    #: ``webhook-id`` of each request in the order they arrived.
    arrived: list[str] = field(default_factory=list)
    answered: int = 0


@dataclass
class Receivers:
    base: str
    held: Held = field(default_factory=Held)
    #: ``webhook-id`` of each request answered at once, in order.
    fast: list[str] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait(self, done: Callable[[], bool], what: str) -> None:
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(done), 30)
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}") from None


@asynccontextmanager
async def receivers() -> AsyncIterator[Receivers]:
    """``/held`` holds every request until released; ``/fast`` answers at once."""
    app = web.Application()
    target = Receivers("")

    async def held(request: web.Request) -> web.Response:
        await request.read()
        path = target.held
        async with target.changed:
            path.in_flight += 1
            path.most_in_flight = max(path.most_in_flight, path.in_flight)
            path.arrived.append(request.headers["webhook-id"])
            target.changed.notify_all()
        await path.release.wait()
        async with target.changed:
            path.in_flight -= 1
            path.answered += 1
            target.changed.notify_all()
        return web.Response(status=200)

    async def fast(request: web.Request) -> web.Response:
        await request.read()
        async with target.changed:
            target.fast.append(request.headers["webhook-id"])
            target.changed.notify_all()
        return web.Response(status=200)

    app.router.add_post("/held", held)
    app.router.add_post("/fast", fast)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    target.base = f"http://127.0.0.1:{server.port}"
    try:
        yield target
    finally:
        target.held.release.set()
        await server.close()


@dataclass
class Raw:
    """A hand-written HTTP/1.1 receiver: what it sends, and whether the sender hung up."""

    url: str
    connections: int = 0
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def raw_receiver(
    answer: Callable[[asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[Raw]:
    """Reads each request on a connection, then lets ``answer`` write (or not); ends when the
    sender hangs up."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                await reader.readexactly(int(length[1]) if length else 0)
                await answer(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the sender hung up
        finally:
            raw.hung_up.set()
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    raw = Raw(f"http://127.0.0.1:{port}/hook")
    try:
        yield raw
    finally:
        server.close()


async def endless(writer: asyncio.StreamWriter, status: int) -> None:
    writer.write(f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    chunk = b"x" * 16384
    while True:  # ends when the sender hangs up: writing then fails
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()


async def promised_gigabyte(writer: asyncio.StreamWriter) -> None:
    """Announces a gigabyte, sends a little more than the sender reads, then stalls."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % 2**30)
    writer.write(b"x" * (RESPONSE_LIMIT + 1))
    await writer.drain()


async def silent(writer: asyncio.StreamWriter) -> None:
    """Accepts the connection and reads the request; never answers."""


# --- a huge answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (lambda w: endless(w, 200), 200),
        (lambda w: endless(w, 500), 500),
        (promised_gigabyte, 200),
    ],
    ids=["endless-200", "endless-500", "stalls-after-promising-a-gigabyte"],
)
async def test_a_huge_answer_is_cut_off_and_the_delivery_recorded_by_its_status(
    db: AsyncEngine, answer: Callable[[asyncio.StreamWriter], Awaitable[None]], status: int
) -> None:
    """The answer is never read to its end (it has none, or never comes): the attempt ends
    with the status well within ``timeout``, or it would be recorded as a timeout."""
    policy = WebhookPolicy(allow=LOOPBACK, timeout=SLOW, schedule=ONE_TRY)
    async with raw_receiver(answer) as receiver, dispatching(db, policy):
        made = await deliveries(db, receiver.url, 1)
        await until(attempted(db, made), "the attempt recorded")
        [outcome] = await outcomes(db, made)
        if status == 200:
            assert outcome == Outcome("delivered", 1, 200, None)
        else:
            assert outcome == Outcome("pending", 1, 500, "receiver answered 500")
        # The sender dropped the connection rather than keep it for another request.
        await asyncio.wait_for(receiver.hung_up.wait(), SLOW)


async def test_post_reads_a_short_answer_to_its_end_and_keeps_the_connection() -> None:
    """Cutting off long answers must not cost short ones their keep-alive connection."""

    async def short(writer: asyncio.StreamWriter) -> None:
        body = b"y" * 1000
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    policy = WebhookPolicy(allow=LOOPBACK, timeout=SLOW)
    async with raw_receiver(short) as receiver, open_session(policy) as session:
        for n in range(2):
            assert (
                await post(session, policy, receiver.url, f"msg_{n}", new_webhook_secret(), "{}")
                == 200
            )
        assert receiver.connections == 1


# --- a receiver that says nothing ---------------------------------------------------------


async def test_a_receiver_that_never_answers_is_bounded_by_the_timeout(db: AsyncEngine) -> None:
    policy = WebhookPolicy(allow=LOOPBACK, timeout=0.5, schedule=ONE_TRY)
    async with raw_receiver(silent) as receiver, dispatching(db, policy):
        made = await deliveries(db, receiver.url, 1)
        await until(attempted(db, made), "the attempt recorded")
        [outcome] = await outcomes(db, made)
        assert (outcome.status, outcome.attempts, outcome.last_status) == ("pending", 1, None)
        assert outcome.last_error is not None and "Timeout" in outcome.last_error


@contextmanager
def full_backlog() -> Iterator[str]:
    """A URL whose TCP handshake never completes: a listener that accepts nothing, with its
    accept queue already full, so the kernel drops further SYNs."""
    listener = socket.socket()
    filler = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.connect(("127.0.0.1", port))
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        filler.close()
        listener.close()


async def test_connecting_is_bounded_by_the_connect_timeout() -> None:
    policy = WebhookPolicy(allow=LOOPBACK, timeout=SLOW, connect_timeout=0.2)
    with full_backlog() as url:
        async with open_session(policy) as session:
            with pytest.raises(DeliveryFailed) as failure:
                await post(session, policy, url, "msg_1", new_webhook_secret(), "{}")
    # The connect timeout ended it, not the attempt's whole ``timeout``.
    assert str(failure.value).startswith("ConnectionTimeoutError"), failure.value
    assert failure.value.status is None


# --- one account's slow receivers -----------------------------------------------------------


async def test_an_accounts_slow_receivers_hold_at_most_its_cap_and_delay_no_other_account(
    db: AsyncEngine,
) -> None:
    """Account A's backlog is older than B's delivery and larger than a dispatch pass looks
    at: A still gets no more than its cap of the pool, and B's delivery arrives while A's are
    held. Released, every one of A's arrives, each on its first attempt."""
    policy = WebhookPolicy(allow=LOOPBACK, timeout=SLOW, concurrency=4, per_account=2)
    async with receivers() as target:
        slow = await deliveries(db, target.base + "/held", 20, age=60.0)
        async with dispatching(db, policy):
            await target.wait(lambda: target.held.in_flight >= 2, "A at its cap")
            [other] = await deliveries(db, target.base + "/fast", 1)
            await target.wait(lambda: target.fast == [other.id], "B's delivery")
            assert target.held.in_flight == 2 and target.held.answered == 0
            # The two oldest went first.
            assert set(target.held.arrived) == {d.id for d in slow[:2]}

            target.held.release.set()
            await until(attempted(db, slow), "A's deliveries")
            assert [o.status for o in await outcomes(db, slow)] == ["delivered"] * len(slow)
            assert {o.attempts for o in await outcomes(db, slow)} == {1}
            assert sorted(target.held.arrived) == sorted(d.id for d in slow)
            assert target.held.most_in_flight == 2


async def test_intermediate_senders_of_one_account_hold_at_most_its_cap() -> None:
    """Six of account A's predictions send to a receiver that holds them: two are on the wire,
    the rest wait without a shared slot, and account B's ``start`` goes through at once."""
    policy = WebhookPolicy(allow=LOOPBACK, timeout=SLOW, concurrency=4, per_account=2)
    async with receivers() as target, open_session(policy) as session:
        slots = SendSlots(session, policy)

        def sender(path: str, account_id: int) -> IntermediateSender:
            return IntermediateSender(
                slots,
                target.base + path,
                new_webhook_secret(),
                None,
                Unfenced(),
                account_id=account_id,
            )

        slow = [sender("/held", 1) for _ in range(6)]
        for webhooks in slow:
            webhooks.offer("start", lambda: "{}")
        await target.wait(lambda: target.held.in_flight >= 2, "A at its cap")
        other = sender("/fast", 2)
        other.offer("start", lambda: "{}")
        await target.wait(lambda: len(target.fast) == 1, "B's start")
        assert target.held.in_flight == 2 and target.held.answered == 0

        target.held.release.set()
        await target.wait(lambda: target.held.answered == 6, "A's starts")
        assert target.held.most_in_flight == 2
        for webhooks in [*slow, other]:
            webhooks.close()


def test_settings_cap_an_account_within_the_pool_and_connecting_within_the_attempt() -> None:
    policy = WebhookSettings(
        concurrency=4, per_account=50, timeout=1.0, connect_timeout=5.0
    ).policy("http://127.0.0.1:8000")
    assert (policy.per_account, policy.connect_timeout) == (4, 1.0)
