"""Counts over sliding windows in Redis: several limits checked, and counted together only if
every one has room.

Each limit is a window kept as counts per bucket (a tenth of a second's window, a sixtieth of
a longer one) in a hash of its own: a request is admitted when the buckets that overlap the
last window, plus the request, stay within the limit. That count covers the whole window and
a little more, so no window of the limit's length ever holds more than the limit (the bucket
granularity errs towards refusing). One script call checks the limits it is given: all keys of
one Redis Cluster slot, or any keys on one Redis. A refusal counts nothing and names the limit
whose room comes last, with when it has room; an admission says when it was counted, so that
it can be given back (:meth:`Windows.refund`: the same bucket decremented).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis.asyncio import Redis

from tracker.limits.script import SECOND_US, Arg, LimitScript

#: Buckets of a one-second window, and of a longer one: the granularity of a retry delay.
RATE_BUCKETS = 10
TOTAL_BUCKETS = 60

# KEYS: one bucketed window per limit (hash: bucket index -> requests).
# ARGV[2]: 'check' or 'refund'; then, per key: the limit, the window (µs), the bucket (µs).
# check: when every limit has room, counts one request in each and returns {1, now}; else
# counts nothing and returns {0, i, µs until the i-th key's limit has room} for the limit
# whose room comes last. refund: takes back one request counted at ARGV[1] ({1, now}).
_WINDOWS = """
local stamp = string.format('%.0f', now)
local function spec(i)
  return tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
end
if ARGV[2] == 'refund' then
  for i = 1, #KEYS do
    local _, _, bucket = spec(i)
    local field = string.format('%.0f', math.floor(now / bucket))
    if tonumber(redis.call('HGET', KEYS[i], field) or '0') > 0 then
      redis.call('HINCRBY', KEYS[i], field, -1)
    end
  end
  return {1, stamp}
end
local worst, worst_wait = 0, -1
for i = 1, #KEYS do
  local limit, window, bucket = spec(i)
  local oldest = math.floor((now - window) / bucket)
  local flat = redis.call('HGETALL', KEYS[i])
  local counts, order, held = {}, {}, 0
  for j = 1, #flat, 2 do
    local b = tonumber(flat[j])
    if b < oldest then
      redis.call('HDEL', KEYS[i], flat[j])
    else
      local c = tonumber(flat[j + 1])
      counts[b] = c
      order[#order + 1] = b
      held = held + c
    end
  end
  if held + 1 > limit then
    table.sort(order)
    local freed, wait = 0, window
    for _, b in ipairs(order) do
      freed = freed + counts[b]
      if held - freed + 1 <= limit then
        wait = (b + 1) * bucket + window - now
        break
      end
    end
    if wait > worst_wait then worst, worst_wait = i, wait end
  end
end
if worst > 0 then return {0, worst, string.format('%.0f', math.ceil(worst_wait))} end
for i = 1, #KEYS do
  local _, window, bucket = spec(i)
  local current = math.floor(now / bucket)
  redis.call('HINCRBY', KEYS[i], string.format('%.0f', current), 1)
  redis.call('PEXPIRE', KEYS[i], math.ceil(((current + 1) * bucket + window - now) / 1000) + 1)
end
return {1, stamp}
"""


class Window(NamedTuple):
    """One limit: at most ``limit`` requests per ``window_us``, counted under ``key``;
    ``name`` is what a refusal calls it."""

    name: str
    key: str
    limit: int
    window_us: int
    bucket_us: int

    @classmethod
    def of(cls, name: str, key: str, limit: int, seconds: float) -> Window:
        window_us = max(1, round(seconds * SECOND_US))
        buckets = RATE_BUCKETS if seconds <= 1 else TOTAL_BUCKETS
        return cls(name, key, limit, window_us, max(1, window_us // buckets))


@dataclass(frozen=True, slots=True)
class Full:
    """Refused: ``window`` is the limit whose room comes last, in ``wait_us``."""

    window: Window
    wait_us: int


class Windows:
    """Windows kept in ``redis`` (shared by every process that counts in them); ``log`` and
    ``what`` name them when Redis is away, ``clock`` as :class:`~tracker.limits.script.LimitScript`
    takes it."""

    def __init__(
        self,
        redis: Redis,
        log: logging.Logger,
        what: str,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.script = LimitScript(redis, _WINDOWS, log, what, clock)

    async def count(self, windows: Sequence[Window]) -> str | Full | None:
        """Count one request in each of ``windows`` if all have room: the instant it was
        counted at (what :meth:`refund` takes), else :class:`Full`; None while Redis is away
        (the request goes through, counted nowhere)."""
        reply = await self.script.guarded([w.key for w in windows], _args("check", windows))
        if reply is None:
            return None
        if int(reply[0]):
            return _text(reply[1])
        return Full(windows[int(reply[1]) - 1], int(reply[2]))

    async def refund(self, windows: Sequence[Window], at: str) -> None:
        """Give back the request :meth:`count` counted ``at``; Redis's errors are raised."""
        await self.script.call([w.key for w in windows], _args("refund", windows), at)


def _args(mode: str, windows: Sequence[Window]) -> list[Arg]:
    args: list[Arg] = [mode]
    for w in windows:
        args += [w.limit, w.window_us, w.bucket_us]
    return args


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
