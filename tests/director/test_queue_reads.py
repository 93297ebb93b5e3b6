"""Reading shards in turn, in one round trip, against the real Redis; and enqueue to the shorter
of an account's shards."""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis

from director.queue import GROUP, Queue


async def test_read_in_turn_takes_streams_in_order_up_to_count(redis_url: str) -> None:
    client: Redis = Redis.from_url(redis_url)
    base = f"input:prediction:dp-test/turns-{uuid.uuid4().hex[:8]}"
    streams = [f"{base}:{shard}" for shard in range(4)]
    queue = Queue(client)
    await queue.ensure_groups(streams)
    try:
        for name in ("a1", "a2", "a3"):
            await client.xadd(streams[1], {"id": name})
        await client.xadd(streams[3], {"id": "b1"})

        got, passed = await queue.read_in_turn(streams, "me", 4)
        assert [(e.stream, e.prediction_id) for e in got] == [
            (streams[1], "a1"),
            (streams[1], "a2"),
            (streams[1], "a3"),
            (streams[3], "b1"),
        ]
        assert passed == 4 and all(e.deliveries == 1 for e in got)

        for name in ("c1", "c2"):
            await client.xadd(streams[0], {"id": name})
        await client.xadd(streams[2], {"id": "d1"})
        got, passed = await queue.read_in_turn(streams, "me", 1)  # stops once it has enough
        assert [e.prediction_id for e in got] == ["c1"] and passed == 1
        got, passed = await queue.read_in_turn(streams[1:] + streams[:1], "me", 5)
        assert [e.prediction_id for e in got] == ["d1", "c2"] and passed == 4

        assert await queue.read_in_turn(streams, "me", 5) == ([], 0)
        pending = await client.xpending(streams[0], GROUP)
        assert pending["pending"] == 2  # what it read is this consumer's until acknowledged
    finally:
        await client.delete(*streams)
        await client.aclose()


async def test_enqueue_goes_to_the_shorter_of_the_accounts_shards(redis_url: str) -> None:
    client: Redis = Redis.from_url(redis_url)
    base = f"input:prediction:dp-test/shorter-{uuid.uuid4().hex[:8]}"
    longer, shorter = f"{base}:0", f"{base}:1"
    queue = Queue(client)
    try:
        for n in range(3):
            await client.xadd(longer, {"id": f"old-{n}"})
        await client.xadd(shorter, {"id": "old"})
        assert await queue.enqueue([longer, shorter], "new-1") == shorter
        assert await queue.enqueue([longer, shorter], "new-2") == shorter
        assert await queue.enqueue([longer, shorter], "new-3") in (longer, shorter)  # equal now
        assert await client.xlen(longer) + await client.xlen(shorter) == 7
    finally:
        await client.delete(longer, shorter)
        await client.aclose()


async def test_concurrent_enqueues_share_a_call_and_each_lands_once(redis_url: str) -> None:
    """Creates arriving together are appended by one script call; each still goes to the
    shortest of its own shards, whatever the others' shard counts."""
    client: Redis = Redis.from_url(redis_url)
    base = f"input:prediction:dp-test/grouped-{uuid.uuid4().hex[:8]}"
    pair = [f"{base}:a0", f"{base}:a1"]
    single = [f"{base}:b0"]
    trio = [f"{base}:c0", f"{base}:c1", f"{base}:c2"]
    queue = Queue(client)
    try:
        await client.xadd(trio[0], {"id": "old"})
        await client.xadd(trio[2], {"id": "old"})
        calls = [(pair, f"p-{n}") for n in range(20)] + [(single, f"s-{n}") for n in range(5)]
        calls.append((trio, "t-0"))
        chosen = await asyncio.gather(*(queue.enqueue(streams, pid) for streams, pid in calls))
        assert chosen[-1] == trio[1]  # the only empty one of its shards
        assert all(stream in pair for stream in chosen[:20])
        assert all(stream == single[0] for stream in chosen[20:25])
        assert sorted([await client.xlen(s) for s in pair]) == [10, 10]  # kept level
        ids = []
        for stream in pair + single + trio:
            ids += [fields[b"id"].decode() for _, fields in await client.xrange(stream)]
        assert sorted(ids) == sorted([pid for _, pid in calls] + ["old", "old"])
    finally:
        await client.delete(*pair, *single, *trio)
        await client.aclose()
