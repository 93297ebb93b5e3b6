"""Per-tenant request limits, a sliding window per tenant.

Configured from the environment: ``TENANT_RATE_LIMIT_<tenant>=100req/min`` for one tenant (the
``X-Tenant-ID`` value; matched exactly, then upper-cased with other characters as ``_``), and
``TENANT_RATE_LIMIT_default`` for everyone else, each spelt as :class:`core.rates.Limit` reads
it (``100/min`` works). Without a default, tenants without their own line are not limited.

A sliding *log* rather than fixed windows: a tenant never gets twice its limit across a window
boundary, and ``resetAt`` is exact (when the oldest counted request leaves the window). The log
holds at most ``limit`` timestamps per tenant, and a tenant's log is dropped once its window has
passed with no request in it: ``X-Tenant-ID`` is whatever the caller sends, so logs kept forever
would grow with every name ever seen. Expired logs are swept at most once per ``sweep_interval``
seconds, so memory follows the tenants active in the last window plus that interval.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping

from core.rates import Limit
from runners.errors import RateLimit, RateLimitedError

PREFIX = "TENANT_RATE_LIMIT_"


def _normalise(tenant: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", tenant.upper())


class TenantRateLimiter:
    def __init__(
        self,
        limits: Mapping[str, Limit],
        default: Limit | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sweep_interval: float = 60.0,
    ) -> None:
        self.limits = dict(limits)
        self._normalised = {_normalise(name): limit for name, limit in limits.items()}
        self.default = default
        self._clock = clock
        self._wall_clock = wall_clock
        self._logs: dict[str, tuple[Limit, deque[float]]] = {}
        self._sweep_interval = sweep_interval
        self._swept = clock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TenantRateLimiter:
        env = os.environ if environ is None else environ
        limits: dict[str, Limit] = {}
        default = None
        for name, value in env.items():
            if not name.startswith(PREFIX) or not value.strip():
                continue
            tenant = name[len(PREFIX) :]
            try:
                limit = Limit.parse(value)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
            if tenant.lower() == "default":
                default = limit
            else:
                limits[tenant] = limit
        return cls(limits, default)

    @property
    def enabled(self) -> bool:
        return bool(self.limits) or self.default is not None

    def limit_for(self, tenant: str) -> Limit | None:
        limit = self.limits.get(tenant) or self._normalised.get(_normalise(tenant))
        return limit or self.default

    @property
    def tracked(self) -> int:
        """How many tenants' logs are held."""
        return len(self._logs)

    def check(self, tenant: str) -> RateLimit | None:
        """Count one request; the tenant's standing afterwards (None when unlimited).

        Raises :class:`RateLimitedError` (and counts nothing) when the window is full.
        """
        limit = self.limit_for(tenant)
        if limit is None:
            return None
        now = self._clock()
        if now - self._swept >= self._sweep_interval:
            self.sweep(now)
        log = self._logs.setdefault(tenant, (limit, deque()))[1]
        while log and log[0] <= now - limit.window:
            log.popleft()
        if len(log) >= limit.requests:
            oldest = log[0]
            wait = oldest + limit.window - now
            state = self._state(limit, 0, wait, max(1, math.ceil(wait)))
            raise RateLimitedError(tenant, state)
        log.append(now)
        wait = log[0] + limit.window - now
        return self._state(limit, limit.requests - len(log), wait, 0)

    def sweep(self, now: float | None = None) -> int:
        """Drop the logs whose every request has left the window; returns how many."""
        now = self._clock() if now is None else now
        self._swept = now
        idle = [
            tenant
            for tenant, (limit, log) in self._logs.items()
            if not log or log[-1] <= now - limit.window
        ]
        for tenant in idle:
            del self._logs[tenant]
        return len(idle)

    def _state(self, limit: Limit, remaining: int, wait: float, retry_after: int) -> RateLimit:
        reset_at = self._wall_clock() + wait
        return RateLimit(limit.requests, remaining, limit.window, reset_at, retry_after)
