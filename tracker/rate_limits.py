"""Each account's rate of creates (every create route, ``/run`` and every prediction the gateway
makes, a graph's each) and of uploads (``POST /v1/files``), shared by every api replica and
gateway: a generic cell rate algorithm (GCRA) kept in Redis. One rule for both doors: the api
answers a refusal 429 ``rate_limited`` with ``Retry-After``, the gateway ``RESOURCE_EXHAUSTED``
with ``retry-after`` in its trailing metadata.

One Lua script per check reads and moves the account's *theoretical arrival time* (when its
next request would be on schedule at the configured rate) in one key of its own
(``tracker.keys.create_rate_key``, ``upload_rate_key``; hashed on the account alone, so a Redis
Cluster spreads the accounts and the script names one slot). A request may run up to
``burst - 1`` intervals ahead of that schedule; past it, it is refused (:class:`OverRate`, with
the seconds until it would fit), and a refused request costs the account nothing. A check may
count several at once (a graph's predictions): all fit or none is counted, and more than the
burst never fits. The script reads Redis's own clock (``TIME``), the one clock every replica
shares, so the replicas' clocks never need to agree. The key expires once the account is back
on schedule: idle accounts hold nothing.

Redis unreachable: the limiter lets the create through (fails open) and logs a warning once per
outage. A limiter must not turn a short Redis outage into an outage of its own, and a create
needs Redis anyway to be queued, which answers for itself (503).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from core.rates import Limit
from tracker import keys

log = logging.getLogger(__name__)

#: Values of ``create_rate_limit`` that turn the limit off.
OFF = frozenset({"off", "none", "0"})

# KEYS[1]: the account's theoretical arrival time (µs of Redis's clock).
# ARGV[1]: µs between requests at the rate; ARGV[2]: µs a request may run ahead of schedule;
# ARGV[3]: requests counted at once.
# Returns {1, 0} when admitted, {0, µs until they would be admitted} when not.
_GCRA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local count = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local early = tat + (count - 1) * interval - tonumber(ARGV[2]) - now
if early > 0 then return {0, math.ceil(early)} end
tat = tat + count * interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return {1, 0}
"""


class OverRate(Exception):
    """Refused: the account is past its rate. ``retry_after``: seconds until the request would
    fit; None when it never can (more at once than the burst)."""

    def __init__(self, detail: str, retry_after: int | None) -> None:
        self.detail = detail
        self.retry_after = retry_after
        super().__init__(detail)


def parse_limit(spec: str | None) -> Limit | None:
    """``600req/min`` (:class:`core.rates.Limit`'s form), or None for ``off``."""
    if spec is None or spec.strip().lower() in OFF:
        return None
    return Limit.parse(spec)


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` on average, with up to ``burst`` requests at once."""

    limit: Limit
    burst: int

    @property
    def interval_us(self) -> int:
        """Microseconds between requests at the rate."""
        return max(1, round(self.limit.window * 1_000_000 / self.limit.requests))

    @property
    def tolerance_us(self) -> int:
        """How far ahead of schedule a request may be: room for ``burst`` at once."""
        return (self.burst - 1) * self.interval_us


class CreateRateLimit:
    """A per-account limit, in the process's Redis (shared by the replicas): on creates by
    default; ``key`` and ``what`` make it another action's (uploads)."""

    def __init__(
        self,
        redis: Redis,
        rate: Rate,
        key: Callable[[int], str] = keys.create_rate_key,
        what: str = "predictions created",
    ) -> None:
        self.rate = rate
        self.key = key
        self.what = what
        self._script = redis.register_script(_GCRA)
        self._failing = False

    @classmethod
    def configured(
        cls,
        redis: Redis,
        spec: str | None,
        burst: int | None,
        key: Callable[[int], str] = keys.create_rate_key,
        what: str = "predictions created",
    ) -> CreateRateLimit | None:
        """The limit the settings ask for (``burst`` unset: the limit's count), or None."""
        limit = parse_limit(spec)
        if limit is None:
            return None
        return cls(redis, Rate(limit, burst or limit.requests), key, what)

    async def check(self, account_id: int, count: int = 1) -> None:
        """Count ``count`` actions of ``account_id`` (all or none); :class:`OverRate` when they
        would put it over its rate."""
        rate = self.rate
        allowed = f"at most {rate.limit.requests} per {rate.limit.window:g} s for this account"
        if count > rate.burst:
            raise OverRate(
                f"Too many {self.what} at once: {count}, more than the {rate.burst} this "
                f"account may make together ({allowed}).",
                None,
            )
        try:
            admitted, early_us = await self._script(
                keys=[self.key(account_id)], args=[rate.interval_us, rate.tolerance_us, count]
            )
        except (RedisError, OSError) as error:
            if not self._failing:
                log.warning("rate limit not applied (Redis unavailable): %r", error)
            self._failing = True
            return
        if self._failing:
            log.info("rate limit applied again")
            self._failing = False
        if not admitted:
            wait = max(1, math.ceil(int(early_us) / 1_000_000))
            raise OverRate(f"Too many {self.what}: {allowed}; retry in {wait} s.", wait)
