"""The preempting intermediate-webhook sender against a real local receiver."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.ids import new_webhook_secret
from core.ssrf import parse_cidrs
from tests.fixtures.fences import Unfenced
from tests.fixtures.waiting import apace
from tracker.fence import Fence
from tracker.intermediate import IntermediateSender, SendSlots
from tracker.webhooks import WebhookPolicy, open_session, post

INTERVAL = 0.2
DEADLINE = 10.0


@dataclass
class Arrival:
    at: float
    body: dict[str, Any]


@dataclass
class Receiver:
    url: str
    status: int = 200
    #: Seconds each request is held before answering: a slow receiver.
    hold: float = 0.0
    #: When set, ``/hook`` requests hang until it is: a receiver that stopped answering.
    release: asyncio.Event | None = None
    arrivals: list[Arrival] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_until(self, done: Callable[[list[Arrival]], bool]) -> list[Arrival]:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: done(self.arrivals)), DEADLINE)
        return self.arrivals

    async def nothing_more_within(self, seconds: float) -> bool:
        """True when no request beyond those seen so far arrives within ``seconds``."""
        seen = len(self.arrivals)
        try:
            await asyncio.wait_for(self.wait_until(lambda a: len(a) > seen), seconds)
        except TimeoutError:
            return True
        return False

    def events(self) -> list[str]:
        return [a.body["event"] for a in self.arrivals]


@asynccontextmanager
async def receiver(status: int = 200, hold: float = 0.0) -> AsyncIterator[Receiver]:
    app = web.Application()
    server = TestServer(app, host="127.0.0.1", port=0)
    loop = asyncio.get_running_loop()
    target = Receiver("", status, hold)

    async def handle(request: web.Request) -> web.Response:
        at = loop.time()
        target.in_flight += 1
        target.most_in_flight = max(target.most_in_flight, target.in_flight)
        body = await request.json()
        if target.hold:
            await apace(target.hold)  # a slow receiver, not synchronisation
        if target.release is not None:
            async with target.changed:
                target.changed.notify_all()  # in_flight changed
            await target.release.wait()
        target.in_flight -= 1
        async with target.changed:
            target.arrivals.append(Arrival(at, body))
            target.changed.notify_all()
        return web.Response(status=target.status)

    app.router.add_post("/hook", handle)

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=target.status)

    app.router.add_post("/fast", answer)
    await server.start_server()
    target.url = f"http://127.0.0.1:{server.port}/hook"
    try:
        yield target
    finally:
        await server.close()


@asynccontextmanager
async def sender(
    url: str,
    events: Sequence[str] | None = None,
    interval: float = INTERVAL,
    fence: Fence | None = None,
) -> AsyncIterator[IntermediateSender]:
    policy = WebhookPolicy(allow=parse_cidrs("127.0.0.0/8"), intermediate_interval=interval)
    async with open_session(policy) as session:
        slots = SendSlots(session, policy)
        webhooks = IntermediateSender(
            slots, url, new_webhook_secret(), events, fence or Unfenced(), account_id=1
        )
        try:
            yield webhooks
        finally:
            webhooks.close()


class CountingFence(Unfenced):
    """A fence that counts how often the sender asks it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def held(self) -> bool:
        self.asked += 1
        return await super().held()


def snapshot(event: str, n: int, rendered: list[int] | None = None) -> Callable[[], str]:
    def render() -> str:
        if rendered is not None:
            rendered.append(n)
        return json.dumps({"event": event, "n": n})

    return render


async def offer_outputs(webhooks: IntermediateSender, count: int, every: float) -> None:
    """A model producing output faster than the webhook interval."""
    webhooks.offer("start", snapshot("start", 0))
    for n in range(1, count + 1):
        webhooks.offer("output" if n % 3 else "logs", snapshot("output" if n % 3 else "logs", n))
        await apace(every)  # pacing the producer, not synchronisation


async def test_start_first_then_throttled_newest_state() -> None:
    count = 30
    async with receiver() as target, sender(target.url) as webhooks:
        await offer_outputs(webhooks, count, every=0.02)
        arrivals = await target.wait_until(lambda a: any(x.body["n"] == count for x in a))

        assert arrivals[0].body == {"event": "start", "n": 0}
        gaps = [b.at - a.at for a, b in zip(arrivals, arrivals[1:], strict=False)]
        assert all(gap >= 0.9 * INTERVAL for gap in gaps), gaps
        numbers = [a.body["n"] for a in arrivals]
        assert numbers == sorted(set(numbers)), "an older state arrived after a newer one"
        assert numbers[-1] == count
        assert len(arrivals) < count // 2, "newer states should have replaced waiting ones"
        assert await target.nothing_more_within(2 * INTERVAL)


async def test_at_most_one_request_in_flight_to_a_slow_receiver() -> None:
    count = 20
    async with receiver(hold=0.15) as target, sender(target.url, interval=0.05) as webhooks:
        await offer_outputs(webhooks, count, every=0.02)
        arrivals = await target.wait_until(lambda a: any(x.body["n"] == count for x in a))

        assert target.most_in_flight == 1
        assert arrivals[0].body["event"] == "start"
        assert [a.body["n"] for a in arrivals][-1] == count
        gaps = [b.at - a.at for a, b in zip(arrivals, arrivals[1:], strict=False)]
        assert all(gap >= 0.9 * 0.15 for gap in gaps), gaps


async def test_start_is_never_replaced_by_a_later_state() -> None:
    async with receiver() as target, sender(target.url) as webhooks:
        webhooks.offer("start", snapshot("start", 0))
        webhooks.offer("output", snapshot("output", 1))
        webhooks.offer("logs", snapshot("logs", 2))
        arrivals = await target.wait_until(lambda a: len(a) >= 2)
        assert [a.body for a in arrivals] == [
            {"event": "start", "n": 0},
            {"event": "logs", "n": 2},
        ]


async def test_events_outside_the_filter_are_never_sent() -> None:
    rendered: list[int] = []
    async with receiver() as target, sender(target.url, events=["output"]) as webhooks:
        # Were "start" accepted it would go first: it outranks any output.
        webhooks.offer("start", snapshot("start", 0, rendered))
        webhooks.offer("output", snapshot("output", 1, rendered))
        arrivals = await target.wait_until(lambda a: len(a) >= 1)
        assert [a.body for a in arrivals] == [{"event": "output", "n": 1}]
        webhooks.offer("logs", snapshot("logs", 2, rendered))
        assert await target.nothing_more_within(2 * INTERVAL)
        assert rendered == [1]


async def test_no_filter_means_every_intermediate_event() -> None:
    async with receiver() as target, sender(target.url, events=None) as webhooks:
        webhooks.offer("start", snapshot("start", 0))
        await target.wait_until(lambda a: len(a) >= 1)
        webhooks.offer("logs", snapshot("logs", 1))
        await target.wait_until(lambda a: len(a) >= 2)
        webhooks.offer("output", snapshot("output", 2))
        await target.wait_until(lambda a: len(a) >= 3)
        assert target.events() == ["start", "logs", "output"]


async def test_failures_are_not_retried() -> None:
    async with receiver(status=500) as target, sender(target.url) as webhooks:
        webhooks.offer("start", snapshot("start", 0))
        await target.wait_until(lambda a: len(a) >= 1)
        webhooks.offer("output", snapshot("output", 1))
        await target.wait_until(lambda a: len(a) >= 2)
        assert await target.nothing_more_within(3 * INTERVAL)
        assert [a.body["n"] for a in target.arrivals] == [0, 1]


async def test_a_state_waiting_out_the_interval_is_dropped_once_the_attempt_lost() -> None:
    """A director paused past its lease wakes with a throttled send due: it asks whether the
    prediction is still its own before sending, and sends nothing once it is not."""
    rendered: list[int] = []
    lease = CountingFence()
    async with receiver() as target, sender(target.url, fence=lease) as webhooks:
        webhooks.offer("start", snapshot("start", 0, rendered))
        await target.wait_until(lambda a: len(a) >= 1)
        webhooks.offer("output", snapshot("output", 1, rendered))  # waits out the interval
        lease.revoke("meanwhile another director took the prediction over")
        assert await target.nothing_more_within(2 * INTERVAL)
        assert lease.asked == 2 and rendered == [0] and target.events() == ["start"]
        webhooks.offer("output", snapshot("output", 2, rendered))  # nothing more is taken
        assert await target.nothing_more_within(2 * INTERVAL)
        assert rendered == [0]


@pytest.mark.parametrize("status", [200, 500])
async def test_close_drops_the_pending_state(status: int) -> None:
    rendered: list[int] = []
    async with receiver(status=status) as target, sender(target.url) as webhooks:
        webhooks.offer("start", snapshot("start", 0, rendered))
        await target.wait_until(lambda a: len(a) >= 1)
        # The interval has not passed, so this one waits; close() must drop it.
        webhooks.offer("output", snapshot("output", 1, rendered))
        webhooks.close()
        assert await target.nothing_more_within(2 * INTERVAL)
        assert rendered == [0]
        assert target.events() == ["start"]


async def test_close_returns_at_once_and_the_request_on_the_wire_lands() -> None:
    rendered: list[int] = []
    async with receiver() as target, sender(target.url) as webhooks:
        target.release = asyncio.Event()
        webhooks.offer("start", snapshot("start", 0, rendered))
        await target.wait_until(lambda _: target.in_flight == 1)
        webhooks.offer("output", snapshot("output", 1, rendered))
        webhooks.close()  # not a coroutine: nothing to wait for
        webhooks.offer("logs", snapshot("logs", 2, rendered))  # after close: ignored
        target.release.set()
        await target.wait_until(lambda a: len(a) >= 1)
        assert await target.nothing_more_within(2 * INTERVAL)
        assert target.events() == ["start"]
        assert rendered == [0]


async def test_a_closed_senders_hung_request_ends_with_the_webhook_timeout() -> None:
    policy = WebhookPolicy(allow=parse_cidrs("127.0.0.0/8"), timeout=0.5)
    async with receiver() as target, open_session(policy) as session:
        target.release = asyncio.Event()
        slots = SendSlots(session, policy)
        webhooks = IntermediateSender(
            slots, target.url, new_webhook_secret(), None, Unfenced(), account_id=1
        )
        webhooks.offer("start", snapshot("start", 0))
        await target.wait_until(lambda _: target.in_flight == 1)
        webhooks.close()
        pump = webhooks._task
        assert pump is not None and not pump.done() and pump in slots.lingering
        await asyncio.wait_for(asyncio.shield(pump), DEADLINE)
        assert target.arrivals == []  # the receiver never answered: nothing was delivered
        assert pump not in slots.lingering
        target.release.set()


async def test_hung_intermediate_receivers_leave_connections_for_completed() -> None:
    """More slow intermediate receivers than the pool has connections: the durable sender's
    requests on the same session still get through at once."""
    policy = WebhookPolicy(allow=parse_cidrs("127.0.0.0/8"), concurrency=2, timeout=DEADLINE)
    async with receiver() as target, open_session(policy) as session:
        target.release = asyncio.Event()
        slots = SendSlots(session, policy)
        senders = [
            IntermediateSender(
                slots, target.url, new_webhook_secret(), None, Unfenced(), account_id=n
            )
            for n in range(3 * policy.concurrency)
        ]
        for webhooks in senders:
            webhooks.offer("start", snapshot("start", 0))
        await target.wait_until(lambda _: target.in_flight == policy.concurrency)
        fast = target.url.replace("/hook", "/fast")
        deliveries = [
            post(session, policy, fast, f"msg_{i}", new_webhook_secret(), "{}")
            for i in range(policy.concurrency)
        ]
        statuses = await asyncio.wait_for(asyncio.gather(*deliveries), 2.0)
        assert statuses == [200] * policy.concurrency
        assert target.most_in_flight == policy.concurrency
        for webhooks in senders:
            webhooks.close()  # those still waiting for a slot never send
        target.release.set()
        await target.wait_until(lambda a: len(a) >= policy.concurrency)
        assert await target.nothing_more_within(2 * INTERVAL)
        assert len(target.arrivals) == policy.concurrency
