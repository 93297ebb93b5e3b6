"""Each account's and each prediction's share of a process's waiters: the counting alone, then
the event hub holding to it against a real Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tracker.event_hub import EventHub, Subscription
from tracker.waiter_shares import WaiterShares


def test_default_shares_follow_the_lanes_rule() -> None:
    shares = WaiterShares.of(10)
    assert (shares.per_account, shares.per_prediction) == (5, 3)
    assert (WaiterShares.of(1).per_account, WaiterShares.of(1).per_prediction) == (1, 1)
    assert WaiterShares.of(0).per_account == 0
    configured = WaiterShares.of(10, per_account=8, per_prediction=2)
    assert (configured.per_account, configured.per_prediction) == (8, 2)


def test_an_account_at_its_share_leaves_room_for_others() -> None:
    shares = WaiterShares(per_account=2, per_prediction=None)
    assert shares.admit(1, "a") and shares.admit(1, "b")
    assert not shares.admit(1, "c")
    assert shares.admit(2, "d")
    shares.release(1, "a")
    assert shares.admit(1, "c")
    assert shares.held(1) == 2


def test_a_prediction_at_its_share_leaves_room_for_its_accounts_others() -> None:
    shares = WaiterShares(per_account=3, per_prediction=1)
    assert shares.admit(1, "a")
    assert not shares.admit(1, "a")
    assert not shares.admit(None, "a")  # no account known: the prediction's share still holds
    assert shares.admit(1, "b")
    assert shares.held(1) == 2  # refusals count for nobody
    shares.release(1, "a")
    shares.release(1, "b")
    assert shares.held(1) == 0
    assert shares.admit(1, "a")


@pytest.fixture
async def hub(redis_url: str) -> AsyncIterator[EventHub]:
    waker = Redis.from_url(redis_url)
    reader = Redis.from_url(redis_url, single_connection_client=True)
    hub = EventHub(reader, waker, max_waiters=8, shares=WaiterShares.of(8))
    hub.start()
    yield hub
    await hub.close()
    await waker.aclose()


async def test_the_hub_keeps_places_for_other_accounts(hub: EventHub) -> None:
    """One account (4 of 8 places) and one of its predictions (2 of those 4) cannot take
    what the others need; closing gives the places back."""
    leaked = uuid.uuid4().hex
    mine: list[Subscription | None] = [hub.subscribe(leaked, account=1) for _ in range(3)]
    assert mine[2] is None  # the prediction's share
    mine += [hub.subscribe(uuid.uuid4().hex, account=1) for _ in range(3)]
    assert mine[5] is None  # the account's share
    held = [sub for sub in mine if sub is not None]
    assert len(held) == hub.waiters == 4
    other = [hub.subscribe(uuid.uuid4().hex, account=2) for _ in range(4)]
    assert all(sub is not None for sub in other)
    for sub in held:
        sub.close()
    assert hub.subscribe(leaked, account=1) is not None
