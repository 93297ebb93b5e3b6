"""The prediction queue on Redis Streams: targets, shuffle sharding, enqueue, read and ack.

Key names come from :mod:`tracker.keys`. The api imports
this module (and only this one from ``director``) to enqueue; directors use it to read and
acknowledge. Scripts take keys of one hash tag at a time: a batch is split per tag, and so is a
blocking read in a Redis Cluster.

Shuffle sharding: a deployable has S shard streams; each account hashes to k of them (or to
those an operator moved it to: ``tracker.sharding``) and the api appends to the shorter, so
one account's flood fills at most k shards while directors read all S in rotating order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from director.queue_scripts import ACK, BACKLOG, ENQUEUE, READ_IN_TURN
from tracker import keys, redis_connect
from tracker.hash_slots import PerSlot, by_slot, runs_by_slot
from tracker.redis_connect import decoded

log = logging.getLogger(__name__)

GROUP = "directors"
NO_SUCH_KEY = ("no such key", "ERR no such key")


def lost_stream(error: ResponseError) -> bool:
    """Whether ``error`` says a stream or its consumer group is gone: Redis lost its data, the
    stream key was deleted (a read blocked on it ends with ``UNBLOCKED``: a FLUSHDB, a dev
    stack re-created on the same Redis, a deleted deployment's keys removed), or the group was
    destroyed. Re-creating the groups (:meth:`Queue.ensure_groups`) is the remedy; entries
    the stream held are gone with it, and their predictions are the reconciler's."""
    message = str(error)
    # XINFO on a deleted stream answers "ERR no such key" (redis-py drops the "ERR ").
    return message.startswith(("NOGROUP", "UNBLOCKED")) or message in NO_SUCH_KEY


def deployment_stream(deployment: str, shard: int) -> str:
    return keys.input_stream("dp", deployment, shard)


def version_stream(version_id: str, shard: int) -> str:
    return keys.input_stream("vp", version_id, shard)


@dataclass(frozen=True, slots=True)
class StreamStats:
    stream: str
    length: int
    pending: int


@dataclass(frozen=True, slots=True)
class Backlog:
    """Entries of one stream no director has read yet."""

    stream: str
    waiting: int
    #: Milliseconds the oldest of them has waited (by its id's timestamp, on Redis's clock);
    #: None when none waits.
    oldest_wait_ms: int | None


@dataclass(frozen=True, slots=True)
class Entry:
    """One queue entry: where it is, which prediction it names, how often it was delivered."""

    stream: str
    id: str
    prediction_id: str
    deliveries: int = 1

    @property
    def key(self) -> tuple[str, str]:
        """(stream, entry id): entry ids are only unique within their stream (shards that
        append in the same millisecond hand out the same id)."""
        return (self.stream, self.id)


def connect(url: str, max_connections: int | None = None, client_name: str | None = None) -> Redis:
    """One Redis client (and pool) per process: a single Redis, a Sentinel-watched master or a
    Redis Cluster, by the URL's form (:func:`tracker.redis_connect.connect`)."""
    return redis_connect.connect(url, max_connections, client_name)


class Queue:
    """Enqueue, read and acknowledge prediction entries."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._enqueue = redis.register_script(ENQUEUE)
        self._read_in_turn = redis.register_script(READ_IN_TURN)
        self._backlog = redis.register_script(BACKLOG)
        self._ack_and_delete = redis.register_script(ACK)
        self._acks: PerSlot[tuple[str, str], None] = PerSlot(
            self._write_acks, lambda entry: entry[0]
        )
        self._appends: PerSlot[tuple[tuple[str, ...], str, str], str] = PerSlot(
            self._write_appends, lambda append: append[0][0]
        )
        self._waits = _SlotWaits(self) if redis_connect.is_cluster(redis) else None

    async def enqueue(
        self, streams: Sequence[str], prediction_id: str, account_id: int | None = None
    ) -> str:
        """Append to the shortest of ``streams`` (the account's shards of one target), or of
        the shards an operator moved ``account_id`` to on that target (``tracker.sharding``);
        returns the stream key used. Concurrent calls share one script call per slot (group
        commit, as for the Postgres writes)."""
        account = "" if account_id is None else str(account_id)
        return await self._appends.submit((tuple(streams), prediction_id, account))

    async def _write_appends(self, items: list[tuple[tuple[str, ...], str, str]]) -> list[str]:
        names: list[str] = []
        args: list[str | int] = []
        for streams, prediction_id, account in items:
            # A target's shards (hash-tagged) have a moves hash; other streams have none.
            parsed = keys.parse_input_stream(streams[0])
            if parsed is None:
                names += [streams[0], *streams]
                args += [prediction_id, len(streams), ""]
            else:
                names += [keys.shard_moves_key(parsed.deployable), *streams]
                args += [prediction_id, len(streams), account]
        chosen = await self._enqueue(keys=names, args=args)
        return [decoded(stream) for stream in chosen]

    async def ensure_groups(self, streams: Sequence[str]) -> None:
        # Start from 0, not $: entries the api appended before any director existed must be read.
        for stream in streams:
            try:
                await self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    raise

    async def read(
        self, streams: Sequence[str], consumer: str, count: int, block_ms: int | None
    ) -> list[Entry]:
        """New entries (XREADGROUP ``>``) from ``streams``, waiting up to ``block_ms``.

        In a Redis Cluster one blocking read names streams of one slot: with streams of several
        tags (a deployment's and its version's) a read per tag is in flight, and this returns
        once any of them has entries (see :class:`_SlotWaits`)."""
        if self._waits is not None:
            groups = list(by_slot(streams).values())
            if len(groups) > 1:
                return await self._waits.read(groups, consumer, count, block_ms)
        return await self._read(streams, consumer, count, block_ms)

    async def _read(
        self, streams: Sequence[str], consumer: str, count: int, block_ms: int | None
    ) -> list[Entry]:
        reply: Any = await self.redis.xreadgroup(
            GROUP, consumer, dict.fromkeys(streams, ">"), count=count, block=block_ms
        )
        entries: list[Entry] = []
        for stream, messages in reply or []:
            stream_name = decoded(stream)
            for entry_id, fields in messages:
                entries.append(Entry(stream_name, decoded(entry_id), decoded(fields[b"id"])))
        return entries

    async def read_in_turn(
        self, streams: Sequence[str], consumer: str, count: int
    ) -> tuple[list[Entry], int]:
        """New entries, up to ``count``, taken from ``streams`` in the order given (without
        blocking); and how many streams were passed over up to the last that had any (0 when
        none had), so the caller's next turn starts after it. One script call per run of
        streams that share a slot: usually one."""
        entries: list[Entry] = []
        passed = offset = 0
        for run in runs_by_slot(streams):
            if len(entries) >= count:
                break
            reply: Any = await self._read_in_turn(
                keys=run, args=[GROUP, consumer, count - len(entries)]
            )
            for stream, messages in zip(reply[1::2], reply[2::2], strict=True):
                stream_name = decoded(stream)
                for entry_id, fields in messages:
                    pairs = dict(zip(fields[::2], fields[1::2], strict=True))
                    entries.append(Entry(stream_name, decoded(entry_id), decoded(pairs[b"id"])))
            if int(reply[0]):
                passed = offset + int(reply[0])
            offset += len(run)
        return entries, passed

    async def stats(self, streams: Sequence[str]) -> list[StreamStats]:
        """Length and pending count of each of ``streams`` (0 for a missing one), in one
        pipelined round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xlen(stream)
                pipe.xpending(stream, GROUP)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        stats = []
        for i, stream in enumerate(streams):
            length, pending = replies[2 * i], replies[2 * i + 1]
            count = pending["pending"] if isinstance(pending, dict) else 0
            stats.append(StreamStats(stream, length if isinstance(length, int) else 0, count))
        return stats

    async def backlog(self, streams: Sequence[str]) -> list[Backlog]:
        """What waits unread in each of ``streams`` (a missing one: nothing), in the order
        given: one script call per slot, the calls concurrent."""
        groups = list(by_slot(streams).values())
        replies: list[Any] = await asyncio.gather(
            *(self._backlog(keys=group, args=[GROUP]) for group in groups)
        )
        found: dict[str, Backlog] = {}
        for group, reply in zip(groups, replies, strict=True):
            now = int(reply[0])
            for stream, waiting, oldest in zip(group, reply[1::2], reply[2::2], strict=True):
                oldest_id = decoded(oldest)
                age = max(0, now - _entry_key(oldest_id)[0]) if oldest_id else None
                found[stream] = Backlog(stream, max(0, int(waiting)), age)
        return [found[stream] for stream in streams]

    async def delivery_counts(
        self, stream: str, consumer: str | None = None, ids: Sequence[str] = ()
    ) -> dict[str, int]:
        """Times each pending entry was delivered (all of ``consumer``'s, or those in ``ids``)."""
        low, high = (min(ids, key=_entry_key), max(ids, key=_entry_key)) if ids else ("-", "+")
        reply: Any = await self.redis.xpending_range(
            stream, GROUP, min=low, max=high, count=10_000, consumername=consumer
        )
        return {decoded(item["message_id"]): int(item["times_delivered"]) for item in reply}

    async def ack(self, stream: str, entry_id: str) -> None:
        """Remove an entry once its prediction's terminal state is committed. Acks that
        arrive together go out in one script call per slot (atomic, as a MULTI/EXEC would be)."""
        await self._acks.submit((stream, entry_id))

    async def _write_acks(self, entries: list[tuple[str, str]]) -> list[None]:
        await self._ack_and_delete(
            keys=[stream for stream, _ in entries], args=[GROUP, *(id for _, id in entries)]
        )
        return [None] * len(entries)

    async def running_on(self, consumer: str) -> set[str] | None:
        """Predictions the director named ``consumer`` ran at its last heartbeat; None when it
        has not heartbeated recently."""
        value = await self.redis.get(keys.alive_key(consumer))
        if value is None:
            return None
        try:
            return set(orjson.loads(value))
        except orjson.JSONDecodeError:  # a director from before the key named its runs
            return set()

    async def publish_cancel(self, prediction_id: str) -> None:
        await self.redis.publish(keys.CANCEL_CHANNEL, prediction_id)

    async def close(self) -> None:
        """Let acks, appends and blocking reads under way finish."""
        if self._waits is not None:
            await self._waits.close()
        await self._acks.close()
        await self._appends.close()


class _SlotWaits:
    """A director's blocking reads in a Redis Cluster: one ``XREADGROUP`` per slot group in
    flight at a time.

    A call waits until any of them ends and returns what the ended ones read. Reads still
    blocked stay in flight and hand their entries to a later call: cancelling one could lose
    entries Redis already delivered (they would stay pending for this consumer until
    reclaimed). Each group's read holds a connection to its node while it blocks.
    """

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._reads: dict[tuple[str, ...], asyncio.Task[list[Entry]]] = {}

    async def read(
        self, groups: list[list[str]], consumer: str, count: int, block_ms: int | None
    ) -> list[Entry]:
        for group in groups:
            key = tuple(group)
            if key not in self._reads:
                self._reads[key] = asyncio.create_task(
                    self._queue._read(group, consumer, count, block_ms)
                )
        await asyncio.wait(self._reads.values(), return_when=asyncio.FIRST_COMPLETED)
        entries: list[Entry] = []
        failure: BaseException | None = None
        for key, task in list(self._reads.items()):
            if not task.done():
                continue
            del self._reads[key]
            error = task.exception()
            if error is None:
                entries += task.result()
            else:
                failure = error
        if failure is not None and not entries:
            raise failure
        if failure is not None:  # that group is read again next time
            log.debug("a blocking read failed beside one that read entries: %r", failure)
        return entries

    async def close(self) -> None:
        """Let the reads in flight end (each within its block): a read cancelled midway leaves
        its connection half-used. Entries they bring stay pending for this consumer."""
        reads = list(self._reads.values())
        self._reads.clear()
        await asyncio.gather(*reads, return_exceptions=True)


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
