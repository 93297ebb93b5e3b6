"""The quota: how many tasks the gateway takes, checked before a task is resolved.

Limits (the names of a cluster's ``quota_management_data``): requests per second of the whole
gateway, of an account, of a session, of a block; and requests of a session and of a block over
a window (default 24 h). A task over any of them is refused with ``RESOURCE_EXHAUSTED`` naming
the limit, its retry delay in the trailing metadata (``retry-after`` in whole seconds,
``retry-after-ms``), and nothing of it runs.

**Counting.** Each limit is a sliding window of the one limiter (:mod:`tracker.limits.windows`:
counts per bucket in Redis, a tenth of a second's window, a sixtieth of a longer one; no window
of the limit's length ever holds more than the limit, the bucket granularity erring towards
refusing). Every replica counts in the same keys, on Redis's own clock, so the replicas share
one count and need no clock of their own.

**Scopes.** The gateway, an account, a session, a block: each has its own hash tag
(``tracker.gateway_keys.quota_*_keys``), so a Redis Cluster spreads them, and the limits of one
scope are checked and counted together by one script call on one slot. On one Redis (or one behind
Sentinel) every scope of a task goes in one script call: all its limits are checked, and
counted only if every one admits the task (one round trip, atomic, nothing to give back); a
refusal names the limit whose room comes last. The limits of one task span up to four scopes,
which one script cannot name in a cluster, so there a check is one call per scope, narrowest
first (session, block, account, gateway), stopping at the first refusal; a scope
that refuses counts nothing, and the scopes that admitted before it are given their request
back (a *refund*: the same bucket decremented). This is still exact where it matters:

- No limit is ever exceeded: each scope admits a request only within its own limits,
  atomically in its slot, whatever the other scopes do.
- The only error is towards refusing: between a scope's count and its refund (one round trip)
  it holds one request too many, and a refund lost to a crash or an outage leaves one extra
  request counted until its bucket leaves the window.
- Narrowest first means a session flooding past its own limit is refused by its session's
  scope and never touches the counts of the block, its account or the gateway.

**Where the limits come from.** A *provider*: a callable returning the current
:class:`QuotaLimits` (or None, no quota), asked on every check, so it must answer from memory
(the settings, or a registry's latest copy of the cluster's ``quota_management_data``). No
limit that applies to a task: no Redis call.

**Shadow mode** (``CONDUIT_GATEWAY_QUOTA_SHADOW``): everything is counted as when enforcing, and
a task that would be refused is logged and counted in ``conduit_gateway_quota_refusals_total``
(``mode="shadow"``) but runs; it is not counted in the windows, so they hold what enforcing
would have admitted.

**Redis unreachable**: the quota lets the task through (fails open) and logs once per outage,
as the api's create rate limit does: running a task needs Redis anyway, which answers for
itself.

Every call is counted, a replayed ``(session_id, seq_no)`` included: the check comes before
anything is looked up. A task resolved by search (no ``block_id``) is not under the per-block
limits, and a graph's are those of its head (``block_id``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from gateway.errors import ResourceExhausted
from gateway.settings import GatewaySettings
from tracker import gateway_keys as keys
from tracker.limits.script import SECOND_US, whole_seconds
from tracker.limits.windows import Full, Window, Windows

__all__ = [
    "LIMIT_NAMES",
    "SECOND_US",
    "LimitsProvider",
    "OverQuota",
    "Quota",
    "QuotaLimits",
    "Window",
    "scopes",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """A cluster's quota: each limit None (none) or at least 1. ``window`` (seconds) is what
    ``requests_per_session_id`` and ``requests_per_block_id`` count over."""

    requests_per_second_total: int | None = None
    requests_per_second_per_account: int | None = None
    requests_per_second_per_session: int | None = None
    requests_per_second_per_block_id: int | None = None
    requests_per_session_id: int | None = None
    requests_per_block_id: int | None = None
    window: float = 86400.0

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: must be at least 1, not {value!r}")
        if not self.window > 0:
            raise ValueError(f"window: must be positive, not {self.window!r}")

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in LIMIT_NAMES)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], window: float = 86400.0) -> QuotaLimits:
        """The limits of a ``quota_management_data`` object (other keys are ignored; a limit
        that is not a positive integer is a :class:`ValueError` naming it)."""
        values: dict[str, int] = {}
        for name in LIMIT_NAMES:
            value = data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
                raise ValueError(f"{name}: must be an integer, not {value!r}")
            values[name] = int(value)
        return cls(**values, window=float(data.get("window", window)))

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> QuotaLimits:
        return cls(
            **{name: getattr(settings, f"quota_{name}") for name in LIMIT_NAMES},
            window=settings.quota_window,
        )


LIMIT_NAMES = tuple(f.name for f in fields(QuotaLimits) if f.name != "window")

#: What a quota asks for its limits on every check: from memory, never I/O.
LimitsProvider = Callable[[], QuotaLimits | None]


def scopes(
    limits: QuotaLimits, account_id: int, session_id: str, block_id: str
) -> list[list[Window]]:
    """The limits that apply to one task, grouped by scope (one hash tag each), narrowest
    first; scopes with no limit are left out."""
    window = limits.window
    found: list[list[Window]] = []

    def scope(*windows: tuple[str, str, int | None, float]) -> None:
        chosen = [Window.of(n, k, lim, s) for n, k, lim, s in windows if lim is not None]
        if chosen:
            found.append(chosen)

    if session_id:
        s = keys.quota_session_keys(account_id, session_id)
        scope(
            ("requests_per_second_per_session", s.rate, limits.requests_per_second_per_session, 1),
            ("requests_per_session_id", s.total, limits.requests_per_session_id, window),
        )
    if block_id:
        b = keys.quota_block_keys(block_id)
        per_block = limits.requests_per_second_per_block_id
        scope(
            ("requests_per_second_per_block_id", b.rate, per_block, 1),
            ("requests_per_block_id", b.total, limits.requests_per_block_id, window),
        )
    a = keys.quota_account_keys(account_id)
    scope(("requests_per_second_per_account", a.rate, limits.requests_per_second_per_account, 1))
    t = keys.quota_total_keys()
    scope(("requests_per_second_total", t.rate, limits.requests_per_second_total, 1))
    return found


@dataclass(frozen=True, slots=True)
class OverQuota:
    """A task over quota: the limit it is over (``Window``) and the seconds until it fits."""

    window: Window
    retry_after: float

    def error(self) -> ResourceExhausted:
        w = self.window
        per = f"{w.window_us / SECOND_US:g} s"
        return ResourceExhausted(
            f"over quota: {w.name} allows {w.limit} requests per {per}; retry after "
            f"{self.retry_after:.3f} s",
            trailing=(
                ("retry-after", str(whole_seconds(self.retry_after))),
                ("retry-after-ms", str(max(1, math.ceil(self.retry_after * 1000)))),
            ),
        )


class Quota:
    """The quota of a gateway, counted in ``redis`` (shared by every replica)."""

    def __init__(
        self,
        redis: Redis,
        limits: LimitsProvider,
        shadow: bool = False,
        clock: Callable[[], int] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``clock``: µs to count at instead of Redis's clock (tests of the arithmetic);
        ``registry``: where the quota's metrics are kept (default: a registry of its own)."""
        self.registry = registry or CollectorRegistry()
        self.refusals = Counter(
            "conduit_gateway_quota_refusals_total",
            "Tasks over quota, by limit; mode shadow: counted but let through.",
            ["limit", "mode"],
            registry=self.registry,
        )
        self.limits = limits
        self.shadow = shadow
        self.windows = Windows(redis, log, "quota", clock)
        #: One Redis (or one behind Sentinel): every key on one server, so one script call
        #: checks and counts all the scopes of a task; a Cluster needs a call per scope.
        self.one_call = not isinstance(redis, RedisCluster)

    @classmethod
    def configured(
        cls, redis: Redis, settings: GatewaySettings, registry: CollectorRegistry | None = None
    ) -> Quota | None:
        """The quota the settings ask for, or None when they set no limit."""
        limits = QuotaLimits.from_settings(settings)
        if limits.empty:
            return None
        return cls(redis, lambda: limits, settings.quota_shadow, registry=registry)

    async def check(self, account_id: int, session_id: str, block_id: str) -> None:
        """Count one task; :class:`ResourceExhausted` when it is over quota (in shadow mode,
        reported and let through)."""
        refusal = await self.admit(account_id, session_id, block_id)
        if refusal is None:
            return
        mode = "shadow" if self.shadow else "enforced"
        self.refusals.labels(refusal.window.name, mode).inc()
        if self.shadow:
            log.info(
                "over quota (shadow mode: let through): %s, account %d",
                refusal.window.name,
                account_id,
            )
            return
        raise refusal.error()

    async def admit(self, account_id: int, session_id: str, block_id: str) -> OverQuota | None:
        """Count one task in every scope that limits it: None when all admit it, else the
        refusal (and the scopes that admitted it given their count back)."""
        limits = self.limits()
        if limits is None or limits.empty:
            return None
        found = scopes(limits, account_id, session_id, block_id)
        if self.one_call and len(found) > 1:
            # Every scope in one script call: nothing counts unless all admit.
            found = [[window for scope in found for window in scope]]
        admitted: list[tuple[list[Window], str]] = []
        for scope in found:
            counted = await self.windows.count(scope)
            if counted is None:  # Redis away: let through
                return None
            if isinstance(counted, Full):
                await self._refund(admitted)
                return OverQuota(counted.window, counted.wait_us / SECOND_US)
            admitted.append((scope, counted))
        return None

    @property
    def _failing(self) -> bool:
        """Redis was away at the last check (its warning logged)."""
        return self.windows.script.failing

    async def _refund(self, admitted: list[tuple[list[Window], str]]) -> None:
        for scope, at in admitted:
            try:
                await self.windows.refund(scope, at)
            except (RedisError, OSError) as error:  # counted until its bucket leaves the window
                log.warning("quota refund lost (Redis unavailable): %r", error)
