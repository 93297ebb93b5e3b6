"""The one backoff formula, with each caller's numbers (pure logic)."""

from __future__ import annotations

import random

import pytest

from core.backoff import backoff_delay
from core.transient import PERSISTENT_CAP, PERSISTENT_INITIAL, PERSISTENT_JITTER, TRANSIENT


def test_doubles_from_initial_up_to_the_cap_without_jitter() -> None:
    # The director's read loop: 0.5, 1, 2, 4, then 5 s for good.
    waits = [backoff_delay(n, initial=0.5, cap=5.0) for n in range(8)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    assert backoff_delay(10_000, initial=0.5, cap=5.0) == 5.0  # no overflow


def test_jitter_stays_within_its_bounds_around_the_base() -> None:
    rng = random.Random(3)
    for attempt in range(12):
        base = min(PERSISTENT_INITIAL * 2**attempt, PERSISTENT_CAP)
        wait = backoff_delay(
            attempt,
            initial=PERSISTENT_INITIAL,
            cap=PERSISTENT_CAP,
            jitter=PERSISTENT_JITTER,
            rng=rng,
        )
        assert 0.8 * base <= wait <= 1.2 * base


@pytest.mark.parametrize("draw", [0.0, 1.0])
def test_a_schedule_gives_the_bases_and_repeats_its_last_step(draw: float) -> None:
    class Extreme(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return a + (b - a) * draw

    schedule = (5.0, 30.0, 120.0)
    waits = [
        backoff_delay(n, schedule=schedule, jitter=(1.0, 1.2), rng=Extreme()) for n in range(5)
    ]
    factor = 1.0 + 0.2 * draw
    assert waits == pytest.approx([b * factor for b in (5.0, 30.0, 120.0, 120.0, 120.0)])


def test_transient_errors_are_outages_not_data_errors() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from sqlalchemy.exc import OperationalError

    assert isinstance(RedisConnectionError(), TRANSIENT)
    assert isinstance(OperationalError("SELECT 1", {}, Exception()), TRANSIENT)
    assert isinstance(ConnectionRefusedError(), TRANSIENT)
    assert not isinstance(ValueError(), TRANSIENT)
