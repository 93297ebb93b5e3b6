"""Re-delivery of a director's own pending entries: only what failed here is offered again, so
a long healthy run keeps a delivery count of 1 (and is handled as interrupted, not dead-lettered,
should its director restart), while an entry that keeps failing climbs toward the dead letters."""

from __future__ import annotations

import uuid

import httpx
import psycopg
import redis
from redis.asyncio import Redis

from director.queue import GROUP, Queue, deployment_stream
from director.reclaim import Reclaimer
from tests.fixtures.admin import Admin
from tests.fixtures.api import create
from tests.fixtures.processes import Launcher
from tests.fixtures.scripted_runner import scripted_runner
from tests.fixtures.waiting import wait_for

#: Postgres refuses to claim this prediction again (``attempt + 1`` overflows an integer): a
#: failure that hits one entry and not its neighbour, as a dying runner or database may.
UNCLAIMABLE_ATTEMPT = 2**31 - 1


async def test_reoffer_counts_a_delivery_and_leaves_other_consumers_entries(
    redis_url: str,
) -> None:
    client: Redis = Redis.from_url(redis_url)
    stream = f"input:prediction:dp-test/reoffer-{uuid.uuid4().hex[:8]}:0"
    queue = Queue(client)
    await queue.ensure_groups([stream])
    try:
        for prediction in ("mine", "theirs", "deleted"):
            await client.xadd(stream, {"id": prediction})
        me, other = Reclaimer(queue, "me"), Reclaimer(queue, "other")
        mine, theirs, deleted = await queue.read([stream], "me", count=3, block_ms=None)
        await other.reoffer(stream, [])  # nothing asked, nothing done
        await client.xclaim(stream, GROUP, "other", 0, [theirs.id])
        await client.xdel(stream, deleted.id)

        offered = await me.reoffer(stream, [mine.id, theirs.id, deleted.id])

        assert [(e.id, e.prediction_id, e.deliveries) for e in offered] == [(mine.id, "mine", 2)]
        pending = await queue.delivery_counts(stream)
        assert pending == {mine.id: 2, theirs.id: 2}  # xclaim above counted one for "other"
        owners = await client.xpending_range(stream, GROUP, min="-", max="+", count=10)
        assert {o["message_id"].decode(): o["consumer"].decode() for o in owners} == {
            mine.id: "me",
            theirs.id: "other",
        }
    finally:
        await client.delete(stream)
        await client.aclose()


def _deliveries(redis_url: str, stream: str) -> dict[str, int]:
    with redis.Redis.from_url(redis_url) as r:
        pending = r.xpending_range(stream, GROUP, min="-", max="+", count=100)
    return {p["message_id"].decode(): int(p["times_delivered"]) for p in pending}


def _entry_of(redis_url: str, stream: str, prediction_id: str) -> str:
    with redis.Redis.from_url(redis_url) as r:
        for entry_id, fields in r.xrange(stream):
            if fields[b"id"].decode() == prediction_id:
                return str(entry_id.decode())
    raise AssertionError(f"{prediction_id} not in {stream}")


def test_a_running_entry_is_never_redelivered_a_failed_one_is(
    client: httpx.Client, launcher: Launcher, admin: Admin, database_url: str, redis_url: str
) -> None:
    retry_interval = 0.3
    with scripted_runner(f"retries-{uuid.uuid4().hex[:8]}", hold=True) as runner:
        name = f"test/{runner.name}"
        admin.create_model(name, runner.url)
        admin.create_deployment(name, name, shards=1, visibility="public")
        stream = deployment_stream(name, 0)
        path = f"/v1/deployments/{name}/predictions"
        healthy = create(client, path, input={"prompt": "long"})["id"]
        failing = create(client, path, input={"prompt": "unclaimable"})["id"]
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE predictions SET attempt = %s WHERE id = %s",
                (UNCLAIMABLE_ATTEMPT, failing),
            )
        healthy_entry = _entry_of(redis_url, stream, healthy)
        failing_entry = _entry_of(redis_url, stream, failing)

        director = launcher.director(
            name,
            runner.url,
            concurrency=2,
            retry_interval=str(retry_interval),
            max_deliveries="100",
            shutdown_grace="1",
        )
        try:
            wait_for(lambda: runner.held.get(healthy), "the healthy prediction running")
            # Several retry intervals pass while the failing entry is offered again and again.
            counts = wait_for(
                lambda: (c := _deliveries(redis_url, stream)).get(failing_entry, 0) >= 5 and c,
                "the failing entry re-delivered",
                timeout=30,
            )
            director.check_alive()
            assert counts[healthy_entry] == 1, counts
            assert len(runner.puts_for(healthy)) == 1  # one run, never disturbed
            assert runner.puts_for(failing) == []
        finally:
            director.stop()
