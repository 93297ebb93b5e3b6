"""The moves the lane core's rules share (:mod:`lane.core`): dispatching a request, draining a
queue and fitting it to the permits, ending queued requests, refusing with a ``Retry-After``,
and arming the timer. Sans IO, as the core: the state is kept here, the rules there."""

from __future__ import annotations

import heapq
import math
import random

from core.shell import ArmTimer
from lane.core_records import LaneConfig, LaneDeployment, LaneRequest
from lane.estimate import retry_after
from lane.events import Dispatch, Effect, Reject, RejectReason
from tracker.waiter_shares import account_cap


class CoreMoves:
    """The core's state (its deployments, the requests it tracks, their expiries, the timer
    armed) and the moves its rules make with it; :class:`~lane.core.LaneCore` adds the rules."""

    def __init__(self, config: LaneConfig | None = None, rng: random.Random | None = None) -> None:
        self.config = config or LaneConfig()
        self._rng = rng or random.Random()
        self._deployments: dict[str, LaneDeployment] = {}
        self._requests: dict[str, LaneRequest] = {}
        self._expiries: list[tuple[float, str]] = []
        """Heap of (expires_at, request id); entries of requests no longer queued are stale."""
        self._armed: float | None = None
        self._now = 0.0

    def _dispatch(
        self,
        deployment: LaneDeployment,
        request: LaneRequest,
        runner: str,
        now: float,
        out: list[Effect],
    ) -> None:
        deployment.pool.acquire(runner)
        request.runner, request.started_at = runner, now
        request.attempt += 1
        request.tried.append(runner)
        out.append(Dispatch(request.request_id, runner, request.attempt, now - request.arrived_at))

    def _drain(self, deployment: LaneDeployment, now: float, out: list[Effect]) -> None:
        """Grant queued requests while a permit is free."""
        while deployment.queue:
            runner = deployment.pool.choose(self._rng, (), now)
            if runner is None:
                return
            request_id = deployment.queue.pop()
            assert request_id is not None
            self._dispatch(deployment, self._requests[request_id], runner, now, out)

    def _fit_queue(self, deployment: LaneDeployment, out: list[Effect]) -> None:
        """After the permits changed: shed what no longer fits (all of it without runners)."""
        queue = deployment.queue
        if not deployment.pool.listed:
            while (request_id := queue.pop()) is not None:
                self._end_queued(deployment, request_id, RejectReason.NO_RUNNER, out)
            return
        max_queue = self._max_queue(deployment)
        cap = account_cap(max_queue)
        for account, held in queue.accounts().items():
            for _ in range(held - cap):
                victim = queue.newest_of(account)
                assert victim is not None
                self._end_queued(deployment, victim, RejectReason.OUT_OF_CAPACITY, out)
        while len(queue) > max_queue:
            victim = queue.victim()
            assert victim is not None
            self._end_queued(deployment, victim, RejectReason.OUT_OF_CAPACITY, out)

    def _shed_unavailable(self, deployment: LaneDeployment, now: float, out: list[Effect]) -> None:
        """Every runner out of service: what waits for one is refused now, not at expiry."""
        if deployment.pool.unavailable_for(now) is None:
            return
        while (request_id := deployment.queue.pop()) is not None:
            self._end_queued(deployment, request_id, RejectReason.RUNNER_UNAVAILABLE, out)

    def _end_queued(
        self, deployment: LaneDeployment, request_id: str, reason: RejectReason, out: list[Effect]
    ) -> None:
        deployment.queue.remove(request_id)
        del self._requests[request_id]
        self._count_reject(deployment, reason)
        out.append(self._reject(deployment, request_id, reason))

    def _reject_new(
        self,
        deployment: LaneDeployment | None,
        request_id: str,
        reason: RejectReason,
        out: list[Effect],
    ) -> None:
        if deployment is None:
            out.append(Reject(request_id, reason, self.config.no_runner_retry_after_s))
            return
        self._count_reject(deployment, reason)
        out.append(self._reject(deployment, request_id, reason))

    def _count_reject(self, deployment: LaneDeployment, reason: RejectReason) -> None:
        deployment.rejections[reason] += 1

    def _reject(self, deployment: LaneDeployment, request_id: str, reason: RejectReason) -> Reject:
        if reason is RejectReason.NO_RUNNER:
            return Reject(request_id, reason, self.config.no_runner_retry_after_s)
        if reason is RejectReason.RUNNER_UNAVAILABLE:
            until = deployment.pool.unavailable_for(self._now)
            wait = math.ceil(until) if until is not None else self.config.retry_after_min_s
            low, high = self.config.retry_after_min_s, self.config.retry_after_max_s
            return Reject(request_id, reason, min(high, max(low, wait)))
        seconds = retry_after(
            len(deployment.queue) + 1,
            deployment.service.p50(),
            deployment.pool.permits,
            self.config.retry_after_min_s,
            self.config.retry_after_max_s,
        )
        return Reject(request_id, reason, seconds)

    def _max_queue(self, deployment: LaneDeployment) -> int:
        return self.config.queue_factor * deployment.pool.permits

    def _arm(self, now: float, out: list[Effect]) -> None:
        """Ask for a ``Tick`` at the next expiry, or when a blocked runner frees up while
        requests wait; only when that differs from the timer already armed."""
        while self._expiries:
            at, request_id = self._expiries[0]
            request = self._requests.get(request_id)
            if request is not None and request.runner is None and request.expires_at == at:
                break
            heapq.heappop(self._expiries)
        times = [self._expiries[0][0]] if self._expiries else []
        for deployment in self._deployments.values():
            if deployment.queue:
                wake = deployment.pool.wake_at(now)
                if wake is not None:
                    times.append(wake)
        want = min(times, default=None)
        if want is not None and want != self._armed:
            self._armed = want
            out.append(ArmTimer(want))
