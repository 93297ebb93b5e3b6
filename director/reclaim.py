"""Ownership of queue entries over time: heartbeats, reclaiming from the dead, dead letters.

A live director refreshes the idle time of the entries it is running (a conditional XCLAIM to
itself: only entries still pending *for it*, so a resumed zombie never steals one back). Entries
idle past the visibility timeout belong to a dead or stuck consumer and are XAUTOCLAIMed by any
director reading the stream. An entry delivered more than ``max_deliveries`` times is moved to
``dead:<stream>``. Consumers with nothing pending that have been idle long are removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from director.queue import GROUP, Entry, Queue, _text, dead_letter_stream

# For each entry id: if it is still pending for this consumer, reset its idle time (XCLAIM to
# self with JUSTID, which does not count as a delivery); if another consumer holds it now,
# report it lost. An entry pending for nobody (Redis lost it) is left alone: the run goes on,
# and its final ack is a no-op.
_HEARTBEAT = """
local lost = {}
for i, id in ipairs(ARGV) do
  if i > 2 then
    local info = redis.call('XPENDING', KEYS[1], ARGV[2], id, id, 1)
    if #info == 1 then
      if info[1][2] == ARGV[1] then
        redis.call('XCLAIM', KEYS[1], ARGV[2], ARGV[1], 0, id, 'JUSTID')
      else
        table.insert(lost, id)
      end
    end
  end
end
return lost
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


@dataclass(frozen=True, slots=True)
class StreamStats:
    stream: str
    length: int
    pending: int


class Reclaimer:
    def __init__(self, queue: Queue, consumer: str) -> None:
        self.queue = queue
        self.redis: Redis = queue.redis
        self.consumer = consumer
        self._heartbeat = self.redis.register_script(_HEARTBEAT)
        self._forget = self.redis.register_script(_FORGET_IF_IDLE)

    async def heartbeat(self, entries: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Refresh ownership of (stream, entry id) pairs; returns those another director holds."""
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        lost: set[tuple[str, str]] = set()
        for stream, ids in by_stream.items():
            reply: Any = await self._heartbeat(keys=[stream], args=[self.consumer, GROUP, *ids])
            lost.update((stream, _text(entry_id)) for entry_id in reply)
        return lost

    async def autoclaim(self, stream: str, min_idle_ms: int, count: int) -> list[Entry]:
        """Take over entries idle past ``min_idle_ms`` from other consumers."""
        reply: Any = await self.redis.xautoclaim(
            stream, GROUP, self.consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
        )
        messages = reply[1] if len(reply) > 1 else []
        deleted = reply[2] if len(reply) > 2 else []
        if deleted:  # entries deleted while pending: drop them from the PEL
            await self.redis.xack(stream, GROUP, *deleted)
        claimed = [(_text(entry_id), fields) for entry_id, fields in messages if fields]
        if not claimed:
            return []
        counts = await self.queue.delivery_counts(stream, ids=[entry_id for entry_id, _ in claimed])
        return [
            Entry(stream, entry_id, _text(fields[b"id"]), counts.get(entry_id, 1))
            for entry_id, fields in claimed
        ]

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Move an entry to ``dead:<stream>`` and out of the live stream, atomically."""
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
            name = _text(info["name"])
            if name != self.consumer and info["pending"] == 0 and info["idle"] >= idle_ms:
                if await self._forget(keys=[stream], args=[GROUP, name, idle_ms]):
                    removed.append(name)
        return removed

    async def stats(self, streams: Sequence[str]) -> list[StreamStats]:
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
