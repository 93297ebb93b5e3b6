"""One reader of prediction event streams per process (the api's, the gateway's), fanning events
out to its waiters.

Every ``Prefer: wait`` and every SSE client of this process subscribes here instead of holding
a Redis connection in a blocking ``XREAD`` of its own. One task reads the watched streams on a
dedicated connection (never from the command pool) and hands each subscription its events in
order, each after the subscription's own position. Waiting
therefore costs a queue and a few objects per client, and the Redis connections of the
process stay at the command pool's size plus one.

The reader blocks on one stream, the doorbell every event append rings with the names of the
streams it appended to, and reads only the watched streams a ring names
(``tracker.event_readers``): an event costs the same with ten waiters or ten thousand. A new
subscription must not wait out the read in flight: the hub is woken with ``CLIENT UNBLOCK`` on
its connection's id, which ends the blocked ``XREAD`` as if it had timed out, and the new
stream is read at once. A wake that races the read being sent is caught by the read's short
block (``block_ms``). When the same stream has several subscribers, the hub reads it from the
earliest position among them and each skips what it has seen.

Redis Cluster: a blocking ``XREAD`` names keys of one slot only (keys of different slots are
refused with CROSSSLOT even when one node holds them all), so one doorbell for every stream
is a single-Redis thing. There event streams carry one of ``keys.EVENT_TAGS`` shared hash
tags (``tracker.keys.events_key``) and the hub runs one reader per tag it has waiters on, each
on a connection of its own to the node that serves the tag's slot: at most ``EVENT_TAGS``
readers however many waiters, each blocking on its tag's doorbell as on a single Redis. (With each
prediction's own tag it would be one blocking read, and one connection, per waiter, or a poll
of every watched stream each round.) A reader that finds its slot moved (failover, resharding)
asks the cluster client again where the slot lives and reconnects there.

Places are bounded twice: ``max_waiters`` in all, and each account's and each prediction's share
of them (``tracker.waiter_shares``), so that one account, or one leaked stream URL, cannot take
every place of the process.

``release()`` (shutdown) ends every subscription at once with ``released`` set; later
subscriptions are refused (``subscribe`` returns None) so that a closing process answers
waiters at once rather than holding them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from typing import Any

from redis.asyncio import Redis

from tracker import redis_connect
from tracker.event_readers import NodeReader, StreamReader
from tracker.events import Event, EventLog, EventType
from tracker.keys import events_key, slot_tag
from tracker.waiter_shares import WaiterShares


def _position(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


class Subscription:
    """One waiter's view of one prediction's events, in order, after ``after``."""

    def __init__(
        self, hub: EventHub, key: str, after: str, prediction_id: str, account: Hashable | None
    ) -> None:
        self._hub = hub
        self.key = key
        self.after = after
        self.prediction_id = prediction_id
        #: Whose share of the hub's places this subscription holds.
        self.account = account
        self._events: asyncio.Queue[Event | None] = asyncio.Queue()
        #: Set when the hub let go of its waiters (the process is shutting down).
        self.released = False

    def _deliver(self, event: Event) -> None:
        if _position(event.id) > _position(self.after):
            self.after = event.id
            self._events.put_nowait(event)

    def _release(self) -> None:
        self.released = True
        self._events.put_nowait(None)

    async def next(self) -> Event | None:
        """The next event; None once the hub released this subscription."""
        return await self._events.get()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while (event := await self.next()) is not None:
            yield event

    def close(self) -> None:
        self._hub._remove(self)


class EventHub:
    """Subscriptions to prediction event streams, served by one reading task (per hash tag in
    a Redis Cluster: :class:`ClusterEventHub`)."""

    def __init__(
        self,
        reader: Redis,
        waker: Redis,
        max_waiters: int,
        block_ms: int = 250,
        shares: WaiterShares | None = None,
    ) -> None:
        """``reader``: a single-connection client (its ``CLIENT ID`` is the one ``CLIENT
        UNBLOCK`` names); ``waker``: any pooled client, to send the wake-ups; ``shares``: each
        account's and prediction's share of ``max_waiters`` (none: no shares)."""
        self.max_waiters = max_waiters
        self.shares = shares or WaiterShares()
        self.block_ms = block_ms
        #: Hash tag -> stream key -> its subscriptions ("" holds every key on a single Redis).
        self._subs: dict[str, dict[str, set[Subscription]]] = {}
        self._readers: dict[str, StreamReader] = {"": StreamReader(self, "", reader, waker)}
        self._count = 0
        self._started = False
        self.released = False

    @classmethod
    def for_url(
        cls,
        url: str,
        waker: Redis,
        max_waiters: int,
        block_ms: int,
        client_name: str,
        shares: WaiterShares | None = None,
    ) -> EventHub:
        """The hub for the Redis of ``url`` (``waker``: the process's client of it)."""
        if redis_connect.is_cluster(waker):
            return ClusterEventHub(url, waker, max_waiters, block_ms, client_name, shares)

        reader = redis_connect.connect_dedicated(url, client_name)
        return cls(reader, waker, max_waiters, block_ms, shares)

    @property
    def waiters(self) -> int:
        return self._count

    def start(self) -> None:
        self._started = True
        for reader in self._readers.values():
            reader.start()

    def key(self, prediction_id: str) -> str:
        return events_key(prediction_id)

    def _tag(self, key: str) -> str:
        return ""

    def _reader(self, tag: str) -> StreamReader:
        return self._readers[tag]

    def subscribe(
        self, prediction_id: str, after: str = "0", account: Hashable | None = None
    ) -> Subscription | None:
        """Follow ``prediction_id`` (of ``account``)'s events after ``after``; None when the
        hub is released, full, or holds the account's or the prediction's share already (the
        caller answers without waiting)."""
        if self.released or self._count >= self.max_waiters:
            return None
        if not self.shares.admit(account, prediction_id):
            return None
        sub = Subscription(self, self.key(prediction_id), after, prediction_id, account)
        tag = self._tag(sub.key)
        self._subs.setdefault(tag, {}).setdefault(sub.key, set()).add(sub)
        self._count += 1
        reader = self._reader(tag)
        if self._started:
            reader.start()
        reader.changed(sub.key)
        return sub

    def _remove(self, sub: Subscription) -> None:
        tag = self._tag(sub.key)
        streams = self._subs.get(tag, {})
        subs = streams.get(sub.key)
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        self._count -= 1
        self.shares.release(sub.account, sub.prediction_id)
        if not subs:
            del streams[sub.key]

    def release(self) -> None:
        """Answer every waiter now and take no more: the process is shutting down."""
        if self.released:
            return
        self.released = True
        for streams in self._subs.values():
            for subs in streams.values():
                for sub in subs:
                    sub._release()
        for reader in self._readers.values():
            reader.changed()

    async def close(self) -> None:
        self.release()
        for reader in list(self._readers.values()):
            await reader.close()

    def streams(self, tag: str) -> dict[str, str]:
        """The streams of ``tag``'s reader, each from the earliest position among its
        subscribers (each skips what it has seen)."""
        return self.positions(tag, set(self._subs.get(tag, {})))

    def positions(self, tag: str, keys: set[str]) -> dict[str, str]:
        """Those of ``keys`` with subscriptions of ``tag``, each from the earliest position
        among them."""
        streams = self._subs.get(tag, {})
        return {
            key: min((sub.after for sub in subs), key=_position)
            for key in keys
            if (subs := streams.get(key))
        }

    def watching(self, tag: str) -> bool:
        return bool(self._subs.get(tag))

    def dispatch(self, tag: str, reply: Any) -> None:
        """Hand a reader's reply to the subscriptions of ``tag``."""
        streams = self._subs.get(tag, {})
        for raw_key, entries in reply or []:
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            subs = streams.get(key)
            if not subs:
                continue
            events = [EventLog.parse(entry_id, fields) for entry_id, fields in entries]
            for sub in list(subs):
                for event in events:
                    sub._deliver(event)


class ClusterEventHub(EventHub):
    """The hub in a Redis Cluster: one reader per event-stream hash tag with waiters."""

    def __init__(
        self,
        url: str,
        cluster: Redis,
        max_waiters: int,
        block_ms: int,
        client_name: str,
        shares: WaiterShares | None = None,
    ) -> None:
        super().__init__(cluster, cluster, max_waiters, block_ms, shares)
        self._readers.clear()
        self._url = url
        self.waker = cluster
        self._cluster = redis_connect.as_cluster(cluster)
        self._client_name = client_name

    def key(self, prediction_id: str) -> str:
        return events_key(prediction_id, clustered=True)

    def _tag(self, key: str) -> str:
        return slot_tag(key)

    def _reader(self, tag: str) -> StreamReader:
        reader = self._readers.get(tag)
        if reader is None:
            reader = self._readers[tag] = NodeReader(
                self, tag, self.waker, self._cluster, self._url, self._client_name
            )
        return reader


__all__ = ["ClusterEventHub", "EventHub", "EventType", "Subscription"]
