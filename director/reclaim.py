"""Ownership of queue entries over time: heartbeats, reclaiming from the dead, dead letters.

A live director refreshes the idle time of the entries it is running (a conditional XCLAIM to
itself: only entries still pending *for it*, so a resumed zombie never steals one back), and
offers itself again only the entries that failed here (``Retries``), never one it runs. Entries
idle past the visibility timeout belong to a dead or stuck consumer and are XAUTOCLAIMed by any
director reading the stream. An entry delivered more than ``max_deliveries`` times is moved to
its dead-letter stream (``dead:{<deployable>}:<shard>``). Consumers with nothing pending that
have been idle long are removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from director.queue import GROUP, Entry, Queue
from tracker.keys import dead_letter_stream
from tracker.redis_connect import decoded

# For each entry id: if it is still pending for this consumer, reset its idle time (XCLAIM to
# self with JUSTID, which does not count as a delivery); if another consumer holds it now,
# report it lost; if it is pending for nobody (the winner of a race already acknowledged it,
# or Redis lost it), report it unowned: only Postgres can tell whether the run is still ours.
_HEARTBEAT = """
local lost = {}
local unowned = {}
for i, id in ipairs(ARGV) do
  if i > 2 then
    local info = redis.call('XPENDING', KEYS[1], ARGV[2], id, id, 1)
    if #info == 0 then
      table.insert(unowned, id)
    elseif info[1][2] == ARGV[1] then
      redis.call('XCLAIM', KEYS[1], ARGV[2], ARGV[1], 0, id, 'JUSTID')
    else
      table.insert(lost, id)
    end
  end
end
return {lost, unowned}
"""

# Offer entries pending for this consumer to it again: XCLAIM to self, which counts a delivery
# (so an entry that keeps failing reaches the dead-letter stream). Entries another consumer took
# meanwhile are left to it; entries deleted while pending are dropped from the PEL.
_REOFFER = """
local offered = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local info = redis.call('XPENDING', KEYS[1], ARGV[2], id, id, 1)
  if #info == 1 and info[1][2] == ARGV[1] then
    local claimed = redis.call('XCLAIM', KEYS[1], ARGV[2], ARGV[1], 0, id)
    if type(claimed[1]) == 'table' then
      table.insert(offered, {id, info[1][4] + 1, claimed[1][2]})
    else
      redis.call('XACK', KEYS[1], ARGV[2], id)
    end
  end
end
return offered
"""


_FORGET_IF_IDLE = """
for _, info in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local fields = {}
  for i = 1, #info, 2 do fields[info[i]] = info[i + 1] end
  if fields['name'] == ARGV[2] then
    if fields['pending'] == 0 and fields['idle'] >= tonumber(ARGV[3]) then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return 0
"""


@dataclass(slots=True)
class Heartbeat:
    """(stream, entry id) pairs a heartbeat found not pending for this director."""

    #: Pending for another director: this one was presumed dead and its entry reclaimed.
    lost: set[tuple[str, str]] = field(default_factory=set)
    #: Pending for nobody: acknowledged by whoever finished it, or lost with Redis's data.
    unowned: set[tuple[str, str]] = field(default_factory=set)


class Retries:
    """Entries pending for this director that it offers itself again, each not before a time.

    Only these are re-delivered: an entry running here is never re-read (a re-read counts a
    delivery, and a long healthy run would drift toward the dead-letter stream).
    """

    def __init__(self) -> None:
        self._due: dict[tuple[str, str], tuple[float, str | None]] = {}

    def __len__(self) -> int:
        return len(self._due)

    def add(self, stream: str, entry_id: str, at: float, prediction_id: str | None = None) -> None:
        known = self._due.get((stream, entry_id))
        if prediction_id is None and known is not None:
            prediction_id = known[1]
        self._due[(stream, entry_id)] = (at, prediction_id)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._due

    def discard(self, stream: str, entry_id: str) -> None:
        self._due.pop((stream, entry_id), None)

    def due(self, now: float) -> list[tuple[str, str, str | None]]:
        """(stream, entry id, prediction id if known) of entries due by ``now``, oldest first."""
        ready = sorted((at, key, pid) for key, (at, pid) in self._due.items() if at <= now)
        return [(stream, entry_id, pid) for _, (stream, entry_id), pid in ready]


class Reclaimer:
    def __init__(self, queue: Queue, consumer: str) -> None:
        self.queue = queue
        self.redis: Redis = queue.redis
        self.consumer = consumer
        self._heartbeat = self.redis.register_script(_HEARTBEAT)
        self._forget = self.redis.register_script(_FORGET_IF_IDLE)
        self._reoffer = self.redis.register_script(_REOFFER)

    async def heartbeat(self, entries: Sequence[tuple[str, str]]) -> Heartbeat:
        """Refresh ownership of (stream, entry id) pairs; reports those that are not ours."""
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        beat = Heartbeat()
        for stream, ids in by_stream.items():
            reply: Any = await self._heartbeat(keys=[stream], args=[self.consumer, GROUP, *ids])
            lost, unowned = reply
            beat.lost.update((stream, decoded(entry_id)) for entry_id in lost)
            beat.unowned.update((stream, decoded(entry_id)) for entry_id in unowned)
        return beat

    async def reoffer(self, stream: str, ids: Sequence[str]) -> list[Entry]:
        """Deliver entries pending for this consumer to it again (counted as a delivery)."""
        reply: Any = await self._reoffer(keys=[stream], args=[self.consumer, GROUP, *ids])
        entries = []
        for entry_id, deliveries, flat in reply:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            if b"id" in fields:
                entries.append(Entry(stream, decoded(entry_id), decoded(fields[b"id"]), deliveries))
        return entries

    async def autoclaim(self, stream: str, min_idle_ms: int, count: int) -> list[Entry]:
        """Take over entries idle past ``min_idle_ms`` from other consumers."""
        reply: Any = await self.redis.xautoclaim(
            stream, GROUP, self.consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
        )
        messages = reply[1] if len(reply) > 1 else []
        deleted = reply[2] if len(reply) > 2 else []
        if deleted:  # entries deleted while pending: drop them from the PEL
            await self.redis.xack(stream, GROUP, *deleted)
        claimed = [(decoded(entry_id), fields) for entry_id, fields in messages if fields]
        if not claimed:
            return []
        counts = await self.queue.delivery_counts(stream, ids=[entry_id for entry_id, _ in claimed])
        return [
            Entry(stream, entry_id, decoded(fields[b"id"]), counts.get(entry_id, 1))
            for entry_id, fields in claimed
        ]

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Move an entry to its dead-letter stream and out of the live one, atomically."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(
                dead_letter_stream(entry.stream),
                {
                    "id": entry.prediction_id,
                    "entry": entry.id,
                    "deliveries": str(entry.deliveries),
                    "reason": reason,
                    "consumer": self.consumer,
                },
            )
            pipe.xack(entry.stream, GROUP, entry.id)
            pipe.xdel(entry.stream, entry.id)
            await pipe.execute()

    async def forget_dead_consumers(self, stream: str, idle_ms: int) -> list[str]:
        """Remove consumers with nothing pending that have been idle for ``idle_ms``.

        Check and delete are one script: a consumer that reads an entry between a separate
        check and DELCONSUMER would take that entry's pending record with it.
        """
        removed = []
        for info in await self.redis.xinfo_consumers(stream, GROUP):
            name = decoded(info["name"])
            if name != self.consumer and info["pending"] == 0 and info["idle"] >= idle_ms:
                if await self._forget(keys=[stream], args=[GROUP, name, idle_ms]):
                    removed.append(name)
        return removed
