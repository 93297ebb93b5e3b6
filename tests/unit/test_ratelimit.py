"""The tenant rate limiter's window arithmetic, on a clock the test controls."""

from __future__ import annotations

import pytest

from core.rates import Limit
from runners.errors import RateLimitedError
from runners.ratelimit import TenantRateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        ("100req/min", Limit(100, 60.0)),
        ("5/s", Limit(5, 1.0)),
        ("7 req / hour", Limit(7, 3600.0)),
        ("1000req/2hours", Limit(1000, 7200.0)),
        ("3requests/30sec", Limit(3, 30.0)),
    ],
)
def test_parse(spec: str, limit: Limit) -> None:
    assert Limit.parse(spec) == limit


@pytest.mark.parametrize("spec", ["", "req/min", "0req/min", "5req/fortnight", "five/min"])
def test_parse_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        Limit.parse(spec)


def test_sliding_window_counts_and_resets() -> None:
    clock = Clock()
    limiter = TenantRateLimiter({"acme": Limit(2, 60.0)}, clock=clock, wall_clock=clock)
    first = limiter.check("acme")
    assert first is not None and (first.limit, first.remaining) == (2, 1)
    clock.now += 10
    assert limiter.check("acme").remaining == 0  # type: ignore[union-attr]
    clock.now += 10
    with pytest.raises(RateLimitedError) as refused:
        limiter.check("acme")
    state = refused.value.state
    assert (state.remaining, state.retry_after, state.reset_at) == (0, 40, 1060.0)
    clock.now = 1060.0  # the first request leaves the window
    assert limiter.check("acme").remaining == 0  # type: ignore[union-attr]
    with pytest.raises(RateLimitedError):
        limiter.check("acme")  # the refused one was not counted, the second still is
    clock.now = 1070.0
    assert limiter.check("acme") is not None


def test_default_and_unlimited_tenants() -> None:
    limiter = TenantRateLimiter.from_env(
        {"TENANT_RATE_LIMIT_default": "1/min", "TENANT_RATE_LIMIT_ACME_CORP": "5/min"}
    )
    assert limiter.limit_for("acme-corp") == Limit(5, 60.0)  # normalised name
    assert limiter.limit_for("anyone") == Limit(1, 60.0)
    assert TenantRateLimiter.from_env({}).check("anyone") is None
    with pytest.raises(ValueError, match="TENANT_RATE_LIMIT_x"):
        TenantRateLimiter.from_env({"TENANT_RATE_LIMIT_x": "lots"})
