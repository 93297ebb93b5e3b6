"""A lease: the one fence an attempt publishes behind, renewed by the director's heartbeat."""

from __future__ import annotations

import uuid

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from core.ports import free_port
from director.attempts import Attempts
from director.leases import Heartbeats, Lease
from director.metrics import DirectorMetrics
from director.queue import GROUP, Entry, Queue, deployment_stream
from director.reclaim import Reclaimer
from tracker.batch_writes import StateWrites
from tracker.keys import alive_key
from tracker.ledger import Ledger


def _heartbeats(redis: Redis, engine: AsyncEngine, consumer: str) -> Heartbeats:
    reclaimer = Reclaimer(Queue(redis), consumer)
    ledger = Ledger(StateWrites(engine))
    return Heartbeats(
        redis,
        reclaimer,
        ledger,
        Attempts(2),
        DirectorMetrics(),
        interval=0.25,
        visibility_timeout=1.0,
    )


async def test_a_stale_lease_is_renewed_before_it_answers(
    redis_url: str, engine: AsyncEngine
) -> None:
    redis: Redis = Redis.from_url(redis_url)
    consumer = f"lease-{uuid.uuid4().hex[:8]}"
    heartbeats = _heartbeats(redis, engine, consumer)
    try:
        lease = heartbeats.lease("p1")
        assert not await redis.exists(alive_key(consumer))
        assert await lease.held()  # never renewed: stale, so it heartbeats first
        assert await redis.exists(alive_key(consumer))
        lease.revoke("another attempt took it over")
        assert lease.lost and not await lease.held()
        lease.revoke("again")  # stays lost, no second story
        assert lease.lost
    finally:
        await redis.delete(alive_key(consumer))
        await redis.aclose()


async def test_an_outage_never_fails_the_attempt_that_asks(engine: AsyncEngine) -> None:
    """Redis away: the lease cannot be renewed, and says what it knows instead of raising (a
    raise here would abandon a run the runner is still doing)."""
    unreachable: Redis = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    lease = _heartbeats(unreachable, engine, "lease-outage").lease("p1")
    try:
        assert await lease.held()
        lease.revoke("lost")
        assert not await lease.held()
    finally:
        await unreachable.aclose()


async def test_a_heartbeat_revokes_the_lease_of_an_entry_another_director_holds(
    redis_url: str, engine: AsyncEngine
) -> None:
    redis: Redis = Redis.from_url(redis_url)
    stream = deployment_stream(f"test/lease-{uuid.uuid4().hex[:8]}", 0)
    queue = Queue(redis)
    await queue.ensure_groups([stream])
    heartbeats = _heartbeats(redis, engine, "me")
    try:
        await redis.xadd(stream, {"id": "kept"})
        await redis.xadd(stream, {"id": "taken"})
        kept, taken = await queue.read([stream], "me", count=2, block_ms=None)
        for entry in (kept, taken):
            heartbeats.attempts.add(entry, heartbeats.lease(entry.prediction_id))
            running = heartbeats.attempts.next_to_run()
            assert running is not None and running.entry == entry
        await redis.xclaim(stream, GROUP, "other", 0, [taken.id])  # presumed dead meanwhile

        await heartbeats.heartbeat()

        leases = {a.prediction_id: a.lease for a in heartbeats.attempts}
        assert not leases["kept"].lost and leases["taken"].lost
        assert await redis.exists(alive_key("me"))
    finally:
        await redis.delete(stream, alive_key("me"))
        await redis.aclose()


def test_a_lease_without_heartbeats_is_lost_only_by_revoke() -> None:
    lease = Lease("p1")
    assert not lease.lost and lease.attempt is None
    lease.revoke("fenced write lost")
    assert lease.lost


def test_entries_are_keyed_by_stream_and_id() -> None:
    attempts = Attempts(1)
    first = Entry("s0", "1-0", "p1")
    twin = Entry("s1", "1-0", "p1")  # same entry id on another shard, same prediction
    attempts.add(first, Lease("p1"))
    assert attempts.holds(twin)  # its prediction is handled here: it waits its turn
    assert attempts.get(twin.key) is None
    attempt = attempts.next_to_run()
    assert attempt is not None and attempts.next_to_run() is None  # one worker, taken
    attempts.remove(attempt)
    assert not attempts.holds(twin) and len(attempts) == 0
