"""Reading shards in turn against the real Redis (one script call per slot); enqueue to the
shorter of an account's shards."""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis

from director.queue import GROUP, Queue
from tracker import sharding
from tracker.keys import Target, account_shards, shard_moves_key


def _target(label: str, shards: int, kind: str = "dp") -> Target:
    return Target(kind, f"test/{label}-{uuid.uuid4().hex[:8]}", shards)


async def test_read_in_turn_takes_streams_in_order_up_to_count(redis_url: str) -> None:
    client: Redis = Redis.from_url(redis_url)
    streams = _target("turns", 4).all_streams()
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


async def test_read_in_turn_spans_targets_one_slot_at_a_time(redis_url: str) -> None:
    """A director reads a deployment's and a version's shards: two hash tags, read in the
    order given, and ``passed`` counts over all of them."""
    client: Redis = Redis.from_url(redis_url)
    deployment, version = _target("dp", 2), _target("vp", 2, kind="vp")
    streams = deployment.all_streams() + version.all_streams()
    queue = Queue(client)
    await queue.ensure_groups(streams)
    try:
        await client.xadd(streams[3], {"id": "v1"})
        got, passed = await queue.read_in_turn(streams, "me", 5)
        assert [(e.stream, e.prediction_id) for e in got] == [(streams[3], "v1")] and passed == 4
        await client.xadd(streams[0], {"id": "d1"})
        await client.xadd(streams[2], {"id": "v2"})
        got, passed = await queue.read_in_turn(streams, "me", 1)  # the first slot is enough
        assert [e.prediction_id for e in got] == ["d1"] and passed == 1
        got, passed = await queue.read_in_turn(streams, "me", 5)
        assert [e.prediction_id for e in got] == ["v2"] and passed == 3
    finally:
        await client.delete(*streams)
        await client.aclose()


async def test_enqueue_goes_to_the_shorter_of_the_accounts_shards(redis_url: str) -> None:
    client: Redis = Redis.from_url(redis_url)
    longer, shorter = _target("shorter", 2).all_streams()
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


async def test_concurrent_enqueues_each_land_once_on_their_own_targets(redis_url: str) -> None:
    """Creates arriving together are appended by one script call per slot; each still goes to
    the shortest of its own shards, whatever the other targets' shard counts."""
    client: Redis = Redis.from_url(redis_url)
    pair = _target("pair", 2).all_streams()
    single = _target("single", 1).all_streams()
    trio = _target("trio", 3, kind="vp").all_streams()
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


async def test_enqueue_follows_an_accounts_move_and_leaves_others_alone(redis_url: str) -> None:
    client: Redis = Redis.from_url(redis_url)
    target = _target("moved", 16)
    queue = Queue(client)
    try:
        own = target.streams_for(7)
        moved = sharding.shards_apart(account_shards(7, target.name, 16), 16, "seed")
        assert await sharding.move(client, target, 7, moved) == moved
        # Its new predictions go to its moved shards (the shorter), in one script call...
        chosen = await asyncio.gather(*(queue.enqueue(own, f"p{n}", 7) for n in range(4)))
        assert set(chosen) == {target.stream(s) for s in moved}
        # ...others', and calls that name no account, to the shards they name.
        assert await queue.enqueue(target.streams_for(8), "q", 8) in target.streams_for(8)
        assert await queue.enqueue(own, "r") in own
        assert await sharding.unmove(client, target, 7)
        assert await queue.enqueue(own, "s", 7) in own
    finally:
        await client.delete(*target.all_streams(), shard_moves_key(target.name))
        await client.aclose()
