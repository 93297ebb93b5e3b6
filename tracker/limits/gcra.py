"""A rate with a burst: the generic cell rate algorithm (GCRA), in Redis or in memory.

Each key holds one number, its *theoretical arrival time* (TAT): when its next request would
be on schedule at the rate, one ``interval`` apart. A request may run up to ``burst - 1``
intervals ahead of that schedule (the *tolerance*); past it, it waits until it is back within
it, the wait counted from the TAT. Equivalently a token bucket of ``burst`` tokens refilled one
per interval, with no bucket to refill: a key back on schedule holds nothing.

- :class:`Gcra`: in Redis (every replica and gateway shares the schedules), one script call
  per check, which counts several requests at once all or none and counts nothing for a
  refusal. The key expires once it is back on schedule.
- :class:`LocalGcra`: in this process's memory, for a limit that must answer with no round
  trip (the failed-authentication budget answers before any query, and a request between its
  check and its spend must not await). Its keys are bounded (the least recently spent are
  forgotten: a fresh burst), and its spending is unconditional: a refusal spends too, but never
  past the burst, so a limited key waits at most one interval however many refusals it collects.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from core.rates import Limit
from tracker.limits.script import SECOND_US, LimitScript, whole_seconds

# KEYS[1]: the key's TAT (µs of the script's clock, ``now``).
# ARGV[2]: µs between requests at the rate; ARGV[3]: µs a request may run ahead of schedule;
# ARGV[4]: requests counted at once.
# Returns {1, 0} when admitted, {0, µs until they would be admitted} when not.
_GCRA = """
local interval = tonumber(ARGV[2])
local count = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local early = tat + (count - 1) * interval - tonumber(ARGV[3]) - now
if early > 0 then return {0, math.ceil(early)} end
tat = tat + count * interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return {1, 0}
"""


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` on average, with up to ``burst`` requests at once."""

    limit: Limit
    burst: int

    @property
    def interval_us(self) -> int:
        """Microseconds between requests at the rate."""
        return max(1, round(self.limit.window * SECOND_US / self.limit.requests))

    @property
    def tolerance_us(self) -> int:
        """How far ahead of schedule a request may be: room for ``burst`` at once."""
        return (self.burst - 1) * self.interval_us


class Gcra:
    """``rate`` per key, kept in ``redis`` (shared by every process that uses it); ``log`` and
    ``what`` name it when Redis is away (:class:`tracker.limits.script.LimitScript`)."""

    def __init__(
        self,
        redis: Redis,
        rate: Rate,
        log: logging.Logger,
        what: str,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.rate = rate
        self.script = LimitScript(redis, _GCRA, log, what, clock)

    async def take(self, key: str, count: int = 1) -> int | None:
        """Count ``count`` requests of ``key`` (all or none): None when admitted (or Redis is
        away), else the whole seconds until they would be (more than the burst never is)."""
        rate = self.rate
        reply = await self.script.guarded([key], [rate.interval_us, rate.tolerance_us, count])
        if reply is None or int(reply[0]):
            return None
        return whole_seconds(int(reply[1]) / SECOND_US)


class LocalGcra:
    """One request per ``interval`` seconds per key, ``burst`` at once, in memory (at most
    ``max_keys`` keys: the least recently spent are forgotten)."""

    def __init__(
        self,
        interval: float,
        burst: int,
        max_keys: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        #: key -> TAT (seconds of ``clock``); least recently spent first.
        self._tats: OrderedDict[str, float] = OrderedDict()

    def _tat(self, key: str, now: float) -> float:
        return max(self._tats.get(key, now), now)

    def retry_after(self, key: str) -> int | None:
        """Whole seconds until ``key`` may spend again; None while it still may."""
        if key not in self._tats:
            return None
        now = self._clock()
        early = self._tat(key, now) - now - (self.burst - 1) * self.interval
        return None if early <= 0 else whole_seconds(early)

    def spend(self, key: str) -> None:
        """Count one request of ``key``, admitted or not (never past the burst)."""
        now = self._clock()
        self._tats[key] = min(self._tat(key, now) + self.interval, now + self.burst * self.interval)
        self._tats.move_to_end(key)
        while len(self._tats) > self.max_keys:
            self._tats.popitem(last=False)

    def refund(self, key: str) -> None:
        """Give back one request spent ahead of what then did not need it."""
        if key in self._tats:
            now = self._clock()
            self._tats[key] = max(now, self._tat(key, now) - self.interval)
