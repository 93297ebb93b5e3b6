"""One deployment's runners as this replica sees them: permits, refusals, ejection, choice.

The runner is the truth and this is a cache of it. Permits come from the fleet view (this
replica's slice of each runner's advertised concurrency); a runner that refuses anyway (Cog
409, 429, 503: the view was stale, or another replica over-counted) is marked full until its
``Retry-After`` or the next refresh, so the request goes elsewhere instead of hammering it.

Health is Envoy's outlier ejection: ``eject_after`` consecutive failed calls eject a runner for
``eject_base_s``, doubled for each ejection in a row, at most ``eject_max_s``. The last usable
runner of a deployment is never ejected: a degraded runner still serves some requests, no
runner serves none.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from core.backoff import backoff_delay


@dataclass(frozen=True, slots=True)
class Health:
    eject_after: int = 5
    eject_base_s: float = 30.0
    eject_max_s: float = 300.0
    refusal_hold_s: float = 5.0
    """How long a refusal without ``Retry-After`` marks a runner full (the fleet refresh)."""
    small_permits: int = 3
    """Runners with at most this many permits are picked first-available, not by P2C."""


@dataclass(slots=True)
class LaneRunner:
    runner_id: str
    permits: int
    """Usable here: this replica's slice plus what it borrowed."""
    in_flight: int = 0
    shared: int = 0
    """The runner's permits that replicas borrow through Redis (``lane.loans``)."""
    borrowed: int = 0
    """Of those, held by this replica now (counted in ``permits`` while listed)."""
    listed: bool = True
    """In the latest fleet view; a runner that left keeps its in-flight requests only."""
    full_until: float | None = None
    failures: int = 0
    """Consecutive failed calls."""
    ejected_until: float | None = None
    ejections: int = 0
    """Ejections in a row (the next one lasts twice as long); reset by a success long after."""
    unauthorized: bool = False
    """Ejected for refusing this server's runner token (until it answers a call again)."""

    def blocked(self, now: float) -> bool:
        """Full or ejected at ``now``."""
        return (self.full_until is not None and now < self.full_until) or (
            self.ejected_until is not None and now < self.ejected_until
        )

    def free(self, now: float) -> bool:
        return self.listed and self.in_flight < self.permits and not self.blocked(now)


class RunnerPool:
    def __init__(self, health: Health) -> None:
        self.health = health
        self._runners: dict[str, LaneRunner] = {}
        """In the fleet view's order, then runners that left (for "first available")."""

    def __iter__(self) -> Iterator[LaneRunner]:
        return iter(self._runners.values())

    def get(self, runner_id: str) -> LaneRunner | None:
        return self._runners.get(runner_id)

    @property
    def listed(self) -> bool:
        """Whether the fleet view lists any runner (with or without permits here)."""
        return any(runner.listed for runner in self._runners.values())

    @property
    def permits(self) -> int:
        return sum(runner.permits for runner in self._runners.values() if runner.listed)

    @property
    def in_flight(self) -> int:
        return sum(runner.in_flight for runner in self._runners.values())

    @property
    def shared(self) -> int:
        """Permits of listed runners that may be borrowed (``lane.loans``)."""
        return sum(runner.shared for runner in self._runners.values() if runner.listed)

    def update(self, slots: Iterable[tuple[str, int, int]]) -> None:
        """Replace the fleet view (``(runner id, own permits, shared permits)``); clears every
        full mark, keeps health, in-flight counts and borrowed permits (given back by
        :meth:`repay_idle`)."""
        fresh: dict[str, LaneRunner] = {}
        for runner_id, permits, shared in slots:
            state = self._runners.get(runner_id) or LaneRunner(runner_id, permits)
            state.permits = max(0, permits) + state.borrowed
            state.shared, state.listed, state.full_until = max(0, shared), True, None
            fresh[runner_id] = state
        for runner_id, state in self._runners.items():
            if runner_id not in fresh and (state.in_flight or state.borrowed):
                state.permits, state.shared, state.listed = 0, 0, False
                fresh[runner_id] = state
        self._runners = fresh

    def borrowable(self, now: float) -> list[tuple[str, int]]:
        """``(runner id, shared permits)`` of the runners one more permit may be borrowed on:
        listed, not full or ejected, holding fewer than their shared permits."""
        return [
            (runner.runner_id, runner.shared)
            for runner in self._runners.values()
            if runner.listed and runner.borrowed < runner.shared and not runner.blocked(now)
        ]

    def lend(self, runner_id: str) -> bool:
        """One borrowed permit more on ``runner_id``; False when it is no longer listed (the
        permit must go straight back)."""
        runner = self._runners.get(runner_id)
        if runner is None or not runner.listed:
            return False
        runner.borrowed += 1
        runner.permits += 1
        return True

    def repay_idle(self) -> list[str]:
        """Give back borrowed permits no request holds (one runner id per permit): on a listed
        runner those beyond its requests in flight, on one that left all of them once its last
        request ended."""
        repaid: list[str] = []
        for runner in list(self._runners.values()):
            if not runner.borrowed:
                continue
            if runner.listed:
                count = min(runner.borrowed, max(0, runner.permits - runner.in_flight))
                runner.permits -= count
            else:
                count = 0 if runner.in_flight else runner.borrowed
            runner.borrowed -= count
            repaid += [runner.runner_id] * count
            if not runner.listed and not runner.in_flight and not runner.borrowed:
                del self._runners[runner.runner_id]
        return repaid

    def choose(self, rng: random.Random, exclude: Sequence[str], now: float) -> str | None:
        """A runner with a free permit, not in ``exclude``; None when there is none.

        Power of two choices on in-flight ÷ permits spreads load without the herd that "least
        loaded" causes when several replicas read the same stale view. When every candidate
        has at most ``small_permits`` permits the ratio is too coarse to mean much, and the
        first available in fleet order is taken (which also keeps the others' caches warm
        for bursts).
        """
        candidates = [
            runner
            for runner in self._runners.values()
            if runner.free(now) and runner.runner_id not in exclude
        ]
        if not candidates:
            return None
        if len(candidates) == 1 or all(
            runner.permits <= self.health.small_permits for runner in candidates
        ):
            return candidates[0].runner_id
        first, second = rng.sample(candidates, 2)
        # first.in_flight / first.permits <= second.in_flight / second.permits, without floats.
        if first.in_flight * second.permits <= second.in_flight * first.permits:
            return first.runner_id
        return second.runner_id

    def acquire(self, runner_id: str) -> None:
        runner = self._runners[runner_id]
        if runner.in_flight >= runner.permits:
            raise RuntimeError(f"runner {runner_id!r} has no free permit")
        runner.in_flight += 1

    def release(self, runner_id: str) -> None:
        runner = self._runners[runner_id]
        if runner.in_flight <= 0:
            raise RuntimeError(f"runner {runner_id!r} has no permit in use")
        runner.in_flight -= 1
        if not runner.listed and not runner.in_flight and not runner.borrowed:
            del self._runners[runner_id]

    def refused(self, runner_id: str, retry_after: float | None, now: float) -> None:
        runner = self._runners.get(runner_id)
        if runner is not None:
            hold = retry_after if retry_after is not None else self.health.refusal_hold_s
            runner.full_until = now + max(0.0, hold)

    def succeeded(self, runner_id: str, now: float) -> None:
        runner = self._runners.get(runner_id)
        if runner is None:
            return
        runner.failures = 0
        runner.unauthorized = False
        ended = runner.ejected_until
        if ended is not None and now >= ended + self.health.eject_max_s:
            runner.ejections, runner.ejected_until = 0, None

    def failed(self, runner_id: str, now: float) -> bool:
        """Count a failed call; True when it ejected the runner."""
        runner = self._runners.get(runner_id)
        if runner is None:
            return False
        runner.failures += 1
        if runner.failures < self.health.eject_after or self._last_usable(runner, now):
            return False
        runner.ejected_until = now + backoff_delay(
            runner.ejections, initial=self.health.eject_base_s, cap=self.health.eject_max_s
        )
        runner.ejections += 1
        runner.failures = 0
        return True

    def refused_token(self, runner_id: str, now: float) -> None:
        """The runner refused this server's runner token: out of service at once, even the
        last one (it serves nothing), for an ejection's time (doubling while it keeps
        refusing); then a call tries it again."""
        runner = self._runners.get(runner_id)
        if runner is None:
            return
        runner.ejected_until = now + backoff_delay(
            runner.ejections, initial=self.health.eject_base_s, cap=self.health.eject_max_s
        )
        runner.ejections += 1
        runner.failures = 0
        runner.unauthorized = True

    def out_of_service(self, now: float) -> list[str]:
        """The runners ejected now for refusing this server's runner token."""
        return [
            runner.runner_id
            for runner in self._runners.values()
            if runner.unauthorized
            and runner.ejected_until is not None
            and now < runner.ejected_until
        ]

    def unavailable_for(self, now: float) -> float | None:
        """Seconds until a runner may serve again, when every listed runner is out of service
        for refusing the token; None when some listed runner is not."""
        listed = [runner for runner in self._runners.values() if runner.listed]
        if not listed or not all(
            runner.unauthorized and runner.ejected_until is not None and now < runner.ejected_until
            for runner in listed
        ):
            return None
        return min(runner.ejected_until or now for runner in listed) - now

    def _last_usable(self, runner: LaneRunner, now: float) -> bool:
        return not any(
            other is not runner
            and other.listed
            and other.permits
            and not (other.ejected_until is not None and now < other.ejected_until)
            for other in self._runners.values()
        )

    def wake_at(self, now: float) -> float | None:
        """When a full mark or an ejection next ends on a runner with an idle permit (the
        queue can drain then), or None."""
        times = [
            at
            for runner in self._runners.values()
            if runner.listed and runner.in_flight < runner.permits
            for at in (runner.full_until, runner.ejected_until)
            if at is not None and at > now
        ]
        return min(times, default=None)

    def permit_states(self, now: float) -> tuple[int, int, int]:
        """(free, used, full) permits; idle permits of a full or ejected runner are "full"."""
        free = used = full = 0
        for runner in self._runners.values():
            used += runner.in_flight
            idle = max(0, runner.permits - runner.in_flight)
            if runner.blocked(now):
                full += idle
            else:
                free += idle
        return free, used, full
