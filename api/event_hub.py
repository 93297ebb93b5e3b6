"""One reader of prediction event streams per api process, fanning events out to its waiters.

Every ``Prefer: wait`` and every SSE client of this process subscribes here instead of holding
a Redis connection in a blocking ``XREAD`` of its own. One task reads all the watched streams
in one blocking ``XREAD`` on a dedicated connection (never from the command pool) and hands
each subscription its events in order, each after the subscription's own position. Waiting
therefore costs a queue and a few objects per client, and the Redis connections of the
process stay at the command pool's size plus one.

A new subscription must not wait out the read in flight: the hub is woken with ``CLIENT
UNBLOCK`` on its connection's id, which ends the blocked ``XREAD`` as if it had timed out, and
the next read names the new stream. A wake that races the read being sent is caught by the
read's short block (``block_ms``). When the same stream has several subscribers, the hub reads
it from the earliest position among them and each skips what it has seen.

Redis Cluster: every event stream carries its prediction's own hash tag, so one ``XREAD`` of
many streams is valid on a single Redis only; a cluster deployment would need one read per
slot group (``tracker.keys.slot_tag``).

``release()`` (shutdown) ends every subscription at once with ``released`` set; later
subscriptions are refused (``subscribe`` returns None) so that a closing process answers
waiters at once rather than holding them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tracker.events import Event, EventLog, EventType, events_key

log = logging.getLogger(__name__)

#: Most events read per stream in one ``XREAD``; a longer backlog comes in the next reads.
READ_COUNT = 500


def _position(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


class Subscription:
    """One waiter's view of one prediction's events, in order, after ``after``."""

    def __init__(self, hub: EventHub, key: str, after: str) -> None:
        self._hub = hub
        self.key = key
        self.after = after
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
    """Subscriptions to prediction event streams, served by one reading task."""

    def __init__(self, reader: Redis, waker: Redis, max_waiters: int, block_ms: int = 250) -> None:
        #: A single-connection client: its ``CLIENT ID`` is the one ``CLIENT UNBLOCK`` names.
        self._reader = reader
        #: Any pooled client, to send the wake-ups.
        self._waker = waker
        self.max_waiters = max_waiters
        self.block_ms = block_ms
        self._subs: dict[str, set[Subscription]] = {}
        self._count = 0
        self._changed = asyncio.Event()
        self._reader_id: int | None = None
        self._reading = False
        self._waking: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.released = False

    @property
    def waiters(self) -> int:
        return self._count

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-hub")

    def subscribe(self, prediction_id: str, after: str = "0") -> Subscription | None:
        """Follow ``prediction_id``'s events after ``after``; None when the hub is full or
        released (the caller answers without waiting)."""
        if self.released or self._count >= self.max_waiters:
            return None
        sub = Subscription(self, events_key(prediction_id), after)
        self._subs.setdefault(sub.key, set()).add(sub)
        self._count += 1
        self._changed.set()
        self._wake()
        return sub

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        self._count -= 1
        if not subs:
            del self._subs[sub.key]

    def release(self) -> None:
        """Answer every waiter now and take no more: the process is shutting down."""
        if self.released:
            return
        self.released = True
        for subs in self._subs.values():
            for sub in subs:
                sub._release()

    async def close(self) -> None:
        self.release()
        for task in (self._task, self._waking):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._reader.aclose()

    def _wake(self) -> None:
        # One wake-up in flight at a time: a burst of new waiters costs one CLIENT UNBLOCK.
        if self._reading and self._reader_id is not None and self._waking is None:
            self._waking = asyncio.create_task(self._unblock(self._reader_id))

    async def _unblock(self, reader_id: int) -> None:
        try:
            # The read may be sent but not yet blocked in Redis (UNBLOCK answers 0): try a few
            # more times while that same read is in flight; past that its block ends it.
            for _ in range(5):
                if await self._waker.client_unblock(reader_id) or not self._stale():
                    return
                await asyncio.sleep(0.002)
            # Never blocked under that id: the connection may have been remade by a retry.
            # Look the id up again before the next read.
            self._reader_id = None
        except RedisError as error:
            log.debug("waking the event hub failed: %r", error)
        finally:
            self._waking = None

    def _stale(self) -> bool:
        """Whether the read in flight misses a subscription made since it was sent."""
        return self._reading and self._changed.is_set()

    def _streams(self) -> dict[str, str]:
        streams: dict[str, str] = {}
        for key, subs in self._subs.items():
            streams[key] = min((sub.after for sub in subs), key=_position)
        return streams

    async def _run(self) -> None:
        backoff = 0.05
        while not self.released:
            if not self._subs:
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                if self._reader_id is None:
                    self._reader_id = int(await self._reader.client_id())
                reply = await self._read(self._streams())
            except Exception as error:  # the one reader must outlive any fault
                # Waiters keep waiting (their own deadlines answer them) and resume from
                # their positions once Redis is back.
                log.warning("event hub read failed: %r", error)
                self._reader_id = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            try:
                self._dispatch(reply)
            except Exception:
                log.exception("event hub: an event could not be delivered")

    async def _read(self, streams: dict[Any, Any]) -> Any:
        self._changed.clear()
        self._reading = True
        try:
            return await self._reader.xread(streams, count=READ_COUNT, block=self.block_ms)
        finally:
            self._reading = False

    def _dispatch(self, reply: Any) -> None:
        for raw_key, entries in reply or []:
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            subs = self._subs.get(key)
            if not subs:
                continue
            events = [EventLog.parse(entry_id, fields) for entry_id, fields in entries]
            for sub in list(subs):
                for event in events:
                    sub._deliver(event)


__all__ = ["EventHub", "EventType", "Subscription"]
