"""The tenant rate limiter forgets tenants whose window has passed, on a clock the test controls."""

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


def limiter(clock: Clock, sweep_interval: float = 60.0) -> TenantRateLimiter:
    return TenantRateLimiter(
        {"acme": Limit(2, 10.0)},
        default=Limit(1, 30.0),
        clock=clock,
        wall_clock=clock,
        sweep_interval=sweep_interval,
    )


def test_many_one_off_tenants_do_not_accumulate() -> None:
    clock = Clock()
    limits = limiter(clock)
    for round_ in range(5):
        for i in range(1000):
            limits.check(f"tenant-{round_}-{i}")
        assert limits.tracked <= 1000  # only the current round's tenants are still in a window
        clock.now += 61  # past every window and the sweep interval
    limits.check("one-more")
    assert limits.tracked == 1


def test_sweep_drops_only_logs_whose_window_has_passed() -> None:
    clock = Clock()
    limits = limiter(clock)
    limits.check("acme")  # 10 s window
    limits.check("someone")  # default: 30 s window
    clock.now += 15
    assert limits.sweep() == 1 and limits.tracked == 1  # acme's request has left its window
    with pytest.raises(RateLimitedError):
        limits.check("someone")  # still counted: its log was kept
    clock.now += 15
    assert limits.sweep() == 1 and limits.tracked == 0


def test_a_swept_tenant_starts_a_fresh_window() -> None:
    clock = Clock()
    limits = limiter(clock, sweep_interval=5.0)
    assert limits.check("acme").remaining == 1  # type: ignore[union-attr]
    assert limits.check("acme").remaining == 0  # type: ignore[union-attr]
    clock.now += 10  # both requests leave the window; the next check sweeps first
    assert limits.check("acme").remaining == 1  # type: ignore[union-attr]
    assert limits.tracked == 1


def test_sweeps_wait_for_the_interval() -> None:
    clock = Clock()
    limits = limiter(clock, sweep_interval=100.0)
    limits.check("a")
    clock.now += 50  # a's window has passed, but no sweep is due yet
    limits.check("b")
    assert limits.tracked == 2
    clock.now += 50
    limits.check("c")  # the sweep is due: a and b are past their windows
    assert limits.tracked == 1
