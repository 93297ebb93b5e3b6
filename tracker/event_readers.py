"""The event hub's readers: one per hash tag of watched streams, on a connection of its own.

A reader blocks on one stream, its tag's doorbell (``keys.doorbell_key``), which every event
append rings with the names of the streams it appended to; it then reads just those of them
it watches, each from its position. The cost of an event is thereby the same with ten
waiters or ten thousand; blocking on every watched stream instead cost a read naming all of
them after each event (~0.9 ms of CPU per event at 1,000 waiters, ``bench.hub``).

New subscriptions are read at once (the reader is woken by ``CLIENT UNBLOCK``): their streams
may hold events already. Every ``SWEEP_INTERVAL`` while it has waiters, at start and after a
fault, a reader reads every stream it watches once (the sweep): that covers rings it could not
see (a doorbell trimmed past its position, a writer of an earlier release that rings none) and
bounds what they cost a waiter to that interval.

The hub (``tracker.event_hub``) keeps the subscriptions and says which streams to read from where
(:class:`Feed`); a reader only reads, survives faults and hands each reply back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError

from core.backoff import backoff_delay
from tracker import keys, redis_connect

log = logging.getLogger(__name__)

#: Most events read per stream in one ``XREAD``; a longer backlog comes in the next reads.
READ_COUNT = 500
#: Most doorbell rings taken in one read.
RINGS_COUNT = 1000
#: Seconds between reads of every watched stream (see the module's docstring).
SWEEP_INTERVAL = 1.0


class Feed(Protocol):
    """What a reader reads for, and where its replies go: the hub."""

    @property
    def released(self) -> bool: ...

    @property
    def block_ms(self) -> int: ...

    def streams(self, tag: str) -> dict[str, str]:
        """The streams to read for ``tag``, each from its position (none: wait for a change)."""
        ...

    def positions(self, tag: str, keys: set[str]) -> dict[str, str]:
        """Those of ``keys`` that ``tag``'s subscriptions watch, each from its position."""
        ...

    def watching(self, tag: str) -> bool:
        """Whether ``tag`` has subscriptions."""
        ...

    def dispatch(self, tag: str, reply: Any) -> None:
        """Hand a read's reply to the subscriptions of ``tag``."""
        ...


class StreamReader:
    """One blocking ``XREAD`` at a time of the hub's streams of one tag, on a connection of
    its own, woken by ``CLIENT UNBLOCK`` when a subscription is added."""

    def __init__(self, hub: Feed, tag: str, client: Redis | None, waker: Redis) -> None:
        self.hub = hub
        self.tag = tag
        self._client = client
        self._waker = waker
        self._client_id: int | None = None
        self._reading = False
        self._changed = asyncio.Event()
        self._waking: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.doorbell = keys.doorbell_key(tag)
        #: Streams to read before the next wait: new subscriptions', and those a read left
        #: events in (``READ_COUNT``).
        self._fresh: set[str] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"event-hub{self.tag}")

    def changed(self, key: str | None = None) -> None:
        """A subscription to ``key`` was added (None: the hub was released)."""
        if key is not None:
            self._fresh.add(key)
        self._changed.set()
        # One wake-up in flight at a time: a burst of new waiters costs one CLIENT UNBLOCK.
        if self._reading and self._client_id is not None and self._waking is None:
            self._waking = asyncio.create_task(self._unblock(self._client_id))

    async def _unblock(self, client_id: int) -> None:
        try:
            # The read may be sent but not yet blocked in Redis (UNBLOCK answers 0): try a few
            # more times while that same read is in flight; past that its block ends it.
            for _ in range(5):
                if await self._send_unblock(client_id) or not self._stale():
                    return
                await asyncio.sleep(0.002)
            # Never blocked under that id: the connection may have been remade by a retry.
            # Look the id up again before the next read.
            self._client_id = None
        except RedisError as error:
            log.debug("waking the event hub failed: %r", error)
        finally:
            self._waking = None

    async def _send_unblock(self, client_id: int) -> bool:
        return bool(await self._waker.client_unblock(client_id))

    def _stale(self) -> bool:
        """Whether the read in flight misses a subscription made since it was sent."""
        return self._reading and self._changed.is_set()

    async def _connect(self) -> Redis:
        assert self._client is not None
        return self._client

    async def _lost(self) -> None:
        """After a failed read, hand the connection back to its pool: the next read takes it
        through the pool's connect, which asks the sentinels where the master is now. (A
        single-connection client left to reconnect by itself goes back to the address it had,
        the dead master.)"""
        client = self._client
        if client is not None and client.connection is not None:
            connection, client.connection = client.connection, None
            await connection.disconnect()
            await client.connection_pool.release(connection)

    async def _run(self) -> None:
        failures = 0  # in a row: the wait after each is 0.05 s doubling to 1 s
        loop = asyncio.get_running_loop()
        #: The doorbell's position; None: unknown, sweep first.
        rung: str | None = None
        swept_at = 0.0
        while not self.hub.released:
            if not self.hub.watching(self.tag):
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                client = await self._connect()
                if self._client_id is None:
                    self._client_id = int(await client.client_id())
                if rung is None or loop.time() - swept_at >= SWEEP_INTERVAL:
                    rung = await self._sweep(client)
                    swept_at = loop.time()
                elif self._fresh:
                    fresh, self._fresh = self._fresh, set()
                    await self._read_now(client, self.hub.positions(self.tag, fresh))
                else:
                    rung = await self._wait_for_rings(client, rung)
            except Exception as error:  # the one reader must outlive any fault
                # Waiters keep waiting (their own deadlines answer them) and resume from
                # their positions once Redis is back.
                log.warning("event hub read failed: %r", error)
                self._client_id = None
                rung = None
                with contextlib.suppress(Exception):
                    await self._lost()
                await asyncio.sleep(backoff_delay(failures, initial=0.05, cap=1.0))
                failures += 1
                continue
            failures = 0

    async def _sweep(self, client: Redis) -> str:
        """Read every watched stream once; the doorbell's position before it (rings after
        that name what the sweep may have missed)."""
        last: Any = await client.xrevrange(self.doorbell, count=1)
        self._fresh.clear()
        await self._read_now(client, self.hub.streams(self.tag))
        return redis_connect.decoded(last[0][0]) if last else "0-0"

    async def _wait_for_rings(self, client: Redis, rung: str) -> str:
        """Block on the doorbell; read the watched streams its rings name. The position after
        the rings taken."""
        reply = await self._read(client, {self.doorbell: rung}, RINGS_COUNT)
        if not reply:
            return rung  # the block ran out, or a new subscription woke it
        rings = reply[0][1]
        named = {
            key for _, fields in rings for key in redis_connect.decoded(fields[b"k"]).split(" ")
        }
        await self._read_now(client, self.hub.positions(self.tag, named))
        return redis_connect.decoded(rings[-1][0])

    async def _read_now(self, client: Redis, streams: dict[Any, Any]) -> None:
        """Read ``streams`` without blocking and hand the events over; a stream that gave a
        full ``READ_COUNT`` is read again next."""
        if not streams:
            return
        reply: Any = await client.xread(streams, count=READ_COUNT)
        for key, entries in reply or []:
            if len(entries) >= READ_COUNT:
                self._fresh.add(redis_connect.decoded(key))
        try:
            self.hub.dispatch(self.tag, reply)
        except Exception:
            log.exception("event hub: an event could not be delivered")

    async def _read(self, client: Redis, streams: dict[Any, Any], count: int) -> Any:
        self._changed.clear()
        if self._fresh or self.hub.released:
            return None  # a subscription came in since the loop looked: serve it first
        self._reading = True
        try:
            return await client.xread(streams, count=count, block=self.hub.block_ms)
        finally:
            self._reading = False

    async def close(self) -> None:
        for task in (self._task, self._waking):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._client is not None:
            await self._client.aclose()


class NodeReader(StreamReader):
    """A reader on the node serving its tag's slot; after a failure it asks the cluster client
    (which follows MOVED replies and failovers) where that slot lives now."""

    def __init__(
        self, hub: Feed, tag: str, waker: Redis, cluster: RedisCluster, url: str, client_name: str
    ) -> None:
        """``waker``: the process's client of the cluster; ``cluster``: the same, as the
        cluster client it is; ``url`` and ``client_name``: how to connect to a node."""
        super().__init__(hub, tag, None, waker)
        self._cluster = cluster
        self._url = url
        self._client_name = client_name
        self._node: ClusterNode | None = None

    async def _connect(self) -> Redis:
        if self._client is None:
            cluster = self._cluster
            probe = f"{{{self.tag}}}"
            # Any command on the slot settles the cluster client's view of who serves it.
            await cluster.exists(probe)
            node = cluster.get_node_from_key(probe)
            if node is None:
                raise RedisError(f"no cluster node serves the slot of {probe}")
            self._node = node
            self._client = redis_connect.node_client(
                self._url, node.host, int(node.port), self._client_name
            )
        return self._client

    async def _send_unblock(self, client_id: int) -> bool:
        cluster = self._cluster
        if self._node is None:
            return False
        return bool(await cluster.client_unblock(client_id, target_nodes=self._node))

    async def _lost(self) -> None:
        client, self._client, self._node = self._client, None, None
        if client is not None:
            await client.aclose()
