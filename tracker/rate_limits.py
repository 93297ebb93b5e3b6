"""Each account's rate of creates (every create route, ``/run`` and every prediction the gateway
makes, a graph's each) and of uploads (``POST /v1/files``), shared by every api replica and
gateway: a generic cell rate algorithm (GCRA) kept in Redis. One rule for both doors: the api
answers a refusal 429 ``rate_limited`` with ``Retry-After``, the gateway ``RESOURCE_EXHAUSTED``
with ``retry-after`` in its trailing metadata.

The limit is :class:`tracker.limits.gcra.Gcra`, one key per account
(``tracker.keys.create_rate_key``, ``upload_rate_key``; hashed on the account alone, so a Redis
Cluster spreads the accounts and the script names one slot). A request may run up to
``burst - 1`` intervals ahead of the account's schedule; past it, it is refused
(:class:`OverRate`, with the seconds until it would fit), and a refused request costs the
account nothing. A check may count several at once (a graph's predictions): all fit or none is
counted, and more than the burst never fits. The schedule is on Redis's own clock, and an idle
account holds nothing.

Redis unreachable: the limiter lets the create through (fails open) and logs a warning once per
outage (:mod:`tracker.limits.script`): a create needs Redis anyway to be queued, which answers
for itself (503).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from redis.asyncio import Redis

from core.rates import Limit
from tracker import keys
from tracker.limits.gcra import Gcra, Rate

log = logging.getLogger(__name__)

#: Values of ``create_rate_limit`` that turn the limit off.
OFF = frozenset({"off", "none", "0"})


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
        self._gcra = Gcra(redis, rate, log, "rate limit")

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
        wait = await self._gcra.take(self.key(account_id), count)
        if wait is not None:
            raise OverRate(f"Too many {self.what}: {allowed}; retry in {wait} s.", wait)
