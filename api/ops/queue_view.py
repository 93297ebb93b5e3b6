"""What the operator page reads from the queue in Redis: each shard's state, where one
prediction's entry is and what is ahead of it, the consumers, the dead letters.

Each read is one script call per hash tag (a deployable's shards share one): a page costs a
round trip per deployable, not per shard. Counting scans are capped (``SCAN_CAP``) so that a
deep queue costs a bounded read; a count at the cap is shown as a lower bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from director.queue import GROUP
from tracker import keys
from tracker.hash_slots import by_slot
from tracker.redis_connect import decoded

#: Most entries one search walks.
SCAN_CAP = 50_000
#: Most entries one count of a shard's unread entries walks (when Redis cannot tell its lag).
COUNT_CAP = 10_000

# Redis's clock in ms first; then per stream: whether it exists, its length, its unread
# entries, whether that count stopped at the cap, its pending count, the group's last delivered
# id, the oldest unread entry's id ('' when none), and the number of consumers. The unread
# count is the group's lag when Redis can tell it; Redis cannot once an entry after the oldest
# one still there was deleted (every acknowledged entry is, here, so that is the usual case
# while entries are in flight), and then the entries after the last delivered id are counted,
# up to ARGV[2].
_SHARDS = """
local now = redis.call('TIME')
local out = {tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
local cap = tonumber(ARGV[2])
local function unread_after(key, last)
  local seen, start = 0, '(' .. last
  if last == '' then start = '-' end
  while seen < cap do
    local batch = redis.call('XRANGE', key, start, '+', 'COUNT', 1000)
    if #batch == 0 then return seen, 0 end
    seen = seen + #batch
    start = '(' .. batch[#batch][1]
  end
  return seen, 1
end
for _, key in ipairs(KEYS) do
  local exists, length, unread, capped, pending, last, oldest, consumers = 0, 0, 0, 0, 0, '', '', 0
  if redis.call('EXISTS', key) == 1 then
    exists = 1
    length = redis.call('XLEN', key)
    local lag = nil
    for _, group in ipairs(redis.call('XINFO', 'GROUPS', key)) do
      local info = {}
      for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
      if info['name'] == ARGV[1] then
        pending = info['pending']
        last = info['last-delivered-id']
        consumers = info['consumers']
        lag = info['lag']
      end
    end
    if last == '' then
      unread = length
    elseif lag then
      unread = lag
    else
      unread, capped = unread_after(key, last)
    end
    local first
    if last == '' then
      first = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)
    else
      first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
    end
    if #first > 0 then oldest = first[1][1] end
  end
  for _, v in ipairs({exists, length, unread, capped, pending, last, oldest, consumers}) do
    table.insert(out, v)
  end
end
return out
"""

# Find the entry naming prediction ARGV[2] in KEYS (streams of one slot), from id ARGV[3]
# on, walking at most ARGV[4] entries per stream; for the one found: its stream, id, holder
# ('' when not delivered), idle ms and deliveries (XPENDING), and the unread entries ahead of
# it (a stream no director has read yet has no group: everything in it is unread). Redis's
# clock (ms) first.
_LOCATE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local cap = tonumber(ARGV[4])
local function walk(key, from, to, want)
  local seen, start = 0, from
  while seen < cap do
    local batch = redis.call('XRANGE', key, start, to, 'COUNT', 500)
    if #batch == 0 then return seen, nil end
    for _, e in ipairs(batch) do
      if want then
        local f = e[2]
        for i = 1, #f, 2 do
          if f[i] == 'id' and f[i + 1] == want then return seen, e[1] end
        end
      end
      seen = seen + 1
    end
    start = '(' .. batch[#batch][1]
  end
  return seen, nil
end
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    local _, found = walk(key, ARGV[3], '+', ARGV[2])
    if found then
      local last, grouped = '0-0', false
      for _, group in ipairs(redis.call('XINFO', 'GROUPS', key)) do
        local info = {}
        for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
        if info['name'] == ARGV[1] then last, grouped = info['last-delivered-id'], true end
      end
      local holder, idle, deliveries, ahead = '', -1, 0, 0
      local pending = {}
      if grouped then pending = redis.call('XPENDING', key, ARGV[1], found, found, 1) end
      if #pending > 0 then
        holder, idle, deliveries = pending[1][2], pending[1][3], pending[1][4]
      else
        ahead = walk(key, '(' .. last, '(' .. found, nil)
      end
      return {now_ms, key, found, holder, idle, deliveries, ahead}
    end
  end
end
return {now_ms}
"""


def entry_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0] or 0)


@dataclass(frozen=True, slots=True)
class ShardState:
    stream: str
    exists: bool
    length: int
    #: Entries no director has read yet (at least, when ``capped``).
    waiting: int
    #: The count stopped at ``COUNT_CAP``: there are more.
    capped: bool
    pending: int
    last_delivered: str
    #: Milliseconds the oldest unread entry has waited; None when none waits (or unknown).
    oldest_wait_ms: int | None
    consumers: int


@dataclass(frozen=True, slots=True)
class Location:
    """Where a prediction's entry is, and what stands before it."""

    stream: str
    entry_id: str
    #: The consumer it is pending with ('' when no director has read it yet).
    holder: str
    #: Milliseconds since its holder last read or heartbeated it.
    idle_ms: int
    deliveries: int
    #: Unread entries before it in its shard (capped at ``SCAN_CAP``).
    ahead: int
    #: How long it has waited, on Redis's clock.
    wait_ms: int


async def shard_states(redis: Redis, streams: Sequence[str]) -> dict[str, ShardState]:
    """The state of each of ``streams``: one script call per slot, the calls concurrent."""
    script = redis.register_script(_SHARDS)
    groups = list(by_slot(streams).values())
    replies: list[Any] = await asyncio.gather(
        *(script(keys=g, args=[GROUP, COUNT_CAP]) for g in groups)
    )
    states: dict[str, ShardState] = {}
    for group, reply in zip(groups, replies, strict=True):
        now = int(reply[0])
        for i, stream in enumerate(group):
            exists, length, unread, capped, pending, last, oldest, consumers = reply[
                1 + 8 * i : 9 + 8 * i
            ]
            oldest_id = decoded(oldest)
            states[stream] = ShardState(
                stream,
                bool(int(exists)),
                int(length),
                int(unread),
                bool(int(capped)),
                int(pending),
                decoded(last),
                max(0, now - entry_ms(oldest_id)) if oldest_id else None,
                int(consumers),
            )
    return states


async def locate(
    redis: Redis, streams: Sequence[str], prediction_id: str, since_ms: int
) -> Location | None:
    """The entry of ``prediction_id`` among ``streams`` (appended at ``since_ms`` or later)."""
    script = redis.register_script(_LOCATE)
    for group in by_slot(streams).values():
        reply: Any = await script(keys=group, args=[GROUP, prediction_id, since_ms, SCAN_CAP])
        if len(reply) > 1:
            now, stream, entry_id, holder, idle, deliveries, ahead = reply
            entry_id = decoded(entry_id)
            return Location(
                decoded(stream),
                entry_id,
                decoded(holder),
                int(idle),
                int(deliveries),
                int(ahead),
                max(0, int(now) - entry_ms(entry_id)),
            )
    return None


@dataclass(frozen=True, slots=True)
class Consumer:
    name: str
    stream: str
    pending: int
    idle_ms: int


async def consumers(redis: Redis, streams: Sequence[str]) -> list[Consumer]:
    """Every consumer of the directors' group on ``streams``, in one pipeline."""
    async with redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xinfo_consumers(stream, GROUP)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    found = []
    for stream, reply in zip(streams, replies, strict=True):
        if isinstance(reply, Exception):
            continue  # no such stream or group yet
        for info in reply:
            found.append(
                Consumer(decoded(info["name"]), stream, int(info["pending"]), int(info["idle"]))
            )
    return found


async def alive(redis: Redis, names: Sequence[str]) -> dict[str, int | None]:
    """Milliseconds left of each director's heartbeat key; None when it has none (dead)."""
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.pttl(keys.alive_key(name))
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    return {
        name: (int(r) if isinstance(r, int) and r >= 0 else None)
        for name, r in zip(names, replies, strict=True)
    }


async def waiting_ids_of(
    redis: Redis, states: Sequence[ShardState], count: int
) -> dict[str, list[str]]:
    """The prediction ids of up to ``count`` unread entries of each shard, oldest first, in
    one pipeline."""
    async with redis.pipeline(transaction=False) as pipe:
        for state in states:
            start = f"({state.last_delivered}" if state.last_delivered else "-"
            pipe.xrange(state.stream, start, "+", count=count)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    found: dict[str, list[str]] = {}
    for state, entries in zip(states, replies, strict=True):
        if isinstance(entries, list):
            found[state.stream] = [decoded(f[b"id"]) for _, f in entries if b"id" in f]
    return found


@dataclass(frozen=True, slots=True)
class DeadLetter:
    stream: str
    entry_id: str
    prediction_id: str
    reason: str
    deliveries: str
    consumer: str


async def dead_letters(
    redis: Redis, streams: Sequence[str], count: int = 50
) -> tuple[dict[str, int], list[DeadLetter]]:
    """Lengths of the dead-letter streams of ``streams``, and their newest entries."""
    dead = [keys.dead_letter_stream(s) for s in streams]
    async with redis.pipeline(transaction=False) as pipe:
        for stream in dead:
            pipe.xlen(stream)
            pipe.xrevrange(stream, "+", "-", count=count)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    lengths: dict[str, int] = {}
    letters: list[DeadLetter] = []
    for i, stream in enumerate(dead):
        length, entries = replies[2 * i], replies[2 * i + 1]
        if not isinstance(length, int) or length == 0:
            continue
        lengths[stream] = length
        for entry_id, raw in entries if isinstance(entries, list) else []:
            f = {decoded(k): decoded(v) for k, v in raw.items()}
            letters.append(
                DeadLetter(
                    stream,
                    decoded(entry_id),
                    f.get("id", ""),
                    f.get("reason", ""),
                    f.get("deliveries", ""),
                    f.get("consumer", ""),
                )
            )
    return lengths, letters
