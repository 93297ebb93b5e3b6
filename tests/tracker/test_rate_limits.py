"""The per-account rate of creates (``tracker.rate_limits``) against a real Redis: one schedule
for every limiter (every api replica and gateway) on that Redis, a refusal that costs nothing
and says when to retry, several counted at once, and a Redis that is away letting creates
through."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from core.rates import Limit
from tests.fixtures.waiting import until
from tracker import keys
from tracker.rate_limits import CreateRateLimit, OverRate, Rate, parse_limit


def _account() -> int:
    return random.randrange(1, 2**62)


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[tuple[Redis, Redis]]:
    """Two clients of one Redis, as two api replicas have."""
    first, second = Redis.from_url(redis_url), Redis.from_url(redis_url)
    yield first, second
    await first.aclose()
    await second.aclose()


def test_settings_spell_the_limit_as_runners_do() -> None:
    assert parse_limit("600req/min") == Limit(600, 60.0)
    assert parse_limit("off") is None and parse_limit(" OFF ") is None and parse_limit("0") is None
    with pytest.raises(ValueError):
        parse_limit("lots")
    rate = Rate(Limit(10, 1.0), burst=3)
    assert (rate.interval_us, rate.tolerance_us) == (100_000, 200_000)


def test_each_account_has_a_slot_of_its_own() -> None:
    assert keys.slot_tag(keys.create_rate_key(7)) == "acct-7"
    assert keys.create_rate_key(7) != keys.create_rate_key(8)


async def test_the_burst_is_shared_by_every_limiter_and_refusals_cost_nothing(
    clients: tuple[Redis, Redis],
) -> None:
    rate = Rate(Limit(3, 60.0), burst=3)  # one create every 20 s, three at once
    one, two = (CreateRateLimit(client, rate) for client in clients)
    account = _account()
    await one.check(account)
    await two.check(account)
    await one.check(account)
    for limiter in (two, one, two):  # refused on either replica, as often as asked
        with pytest.raises(OverRate) as refused:
            await limiter.check(account)
        assert refused.value.retry_after is not None and 1 <= refused.value.retry_after <= 20
    await two.check(_account())  # another account is not touched


async def test_a_refused_account_is_admitted_again_on_schedule(
    clients: tuple[Redis, Redis],
) -> None:
    limiter = CreateRateLimit(clients[0], Rate(Limit(20, 1.0), burst=1))
    account = _account()
    await limiter.check(account)
    with pytest.raises(OverRate):
        await limiter.check(account)

    async def admitted() -> bool:
        try:
            await limiter.check(account)
        except OverRate:
            return False
        return True

    await until(admitted, "the next create on schedule", timeout=10, interval=0.01)
    # An idle account's key goes away once it is back on schedule.
    redis = clients[0]

    async def forgotten() -> bool:
        return not await redis.exists(keys.create_rate_key(account))

    await until(forgotten, "the key expired", timeout=10)


async def test_redis_away_lets_creates_through_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tracker.rate_limits")
    # Nothing listens there; one try per command.
    away = Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    limiter = CreateRateLimit(away, Rate(Limit(1, 60.0), burst=1))
    account = _account()
    for _ in range(3):
        await limiter.check(account)  # failing open: no refusal, no error
    warnings = [r for r in caplog.records if r.name == "tracker.rate_limits"]
    assert len(warnings) == 1 and "not applied" in warnings[0].getMessage()
    await away.aclose()


async def test_several_at_once_count_all_or_none(clients: tuple[Redis, Redis]) -> None:
    """A graph's predictions are counted together: they fit the burst whole, or none is
    counted; more than the burst never fits."""
    limiter = CreateRateLimit(clients[0], Rate(Limit(5, 60.0), burst=5))
    account = _account()
    await limiter.check(account, 3)
    with pytest.raises(OverRate) as refused:
        await limiter.check(account, 3)  # 6 of 5: none of the three counted
    assert refused.value.retry_after is not None
    await limiter.check(account, 2)  # the two that still fit
    with pytest.raises(OverRate) as never:
        await limiter.check(_account(), 6)
    assert never.value.retry_after is None and "more than the 5" in never.value.detail
