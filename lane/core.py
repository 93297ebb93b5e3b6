"""The lane's state machine: one object owns every deployment's permits, queue and health.

The IO shell (one asyncio task) feeds it :data:`~lane.events.Event`s through
:meth:`LaneCore.handle` and carries out the :data:`~lane.events.Effect`s it returns, in
order. Every request that arrives ends exactly once: dispatched and ``Done`` ok, ``Reject``ed
(queue full, expired, no runner), ``Fail``ed (the runner call failed and no retry is left), or
cancelled by the client (``Cancel`` or ``Done`` disconnected; no effect: nobody is listening).
The state it keeps, and the moves its rules share (dispatch, drain, shed, reject, the timer), are
:class:`~lane.core_moves.CoreMoves`; here are the interface and the rules.

Rules, from the design page:

* a request is dispatched at once when its deployment's queue is empty and a runner has a free
  permit; otherwise it queues, within ``max_queue = queue_factor × permits`` and at most half
  of that per account; a full queue sheds its least urgent band's newest request for a more
  urgent arrival, else refuses the arrival;
* a queued request expires at min(deadline, arrival + ``queue_ttl_s``) by timer, and is
  dispatched the moment a permit frees (``Done``, ``RunnersChanged``, a full mark or ejection
  ending: the core arms the timer for those too);
* a failed or refused attempt is retried only before the first byte, only on another runner
  free right now, at most ``max_attempts`` in all, within the retry budget; otherwise it ends
  (a refusal as ``out_of_capacity``: it is capacity, not an error);
* a runner that refuses this server's runner token is out of service at once (an ejection);
  while every runner of a deployment is, its requests are refused ``runner_unavailable`` (a
  503, not the run's failure) instead of queueing.
"""

from __future__ import annotations

import heapq

from core.shell import Tick
from lane.budget import RetryBudget
from lane.core_moves import CoreMoves
from lane.core_records import LaneCounters, LaneDeployment, LaneRequest
from lane.estimate import ServiceTime
from lane.events import (
    Arrive,
    Cancel,
    Done,
    Effect,
    Event,
    Fail,
    Outcome,
    Reject,
    RejectReason,
    Repay,
    RunnersChanged,
)
from lane.queue import FairQueue
from lane.runners import RunnerPool
from tracker.waiter_shares import account_cap


class LaneCore(CoreMoves):
    # --- the interface -----------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply ``event``; the effects to carry out, in order."""
        out: list[Effect] = []
        self._now = event.now
        self._expire(event.now, out)
        match event:
            case Arrive():
                if event.loan is not None:
                    self._lend(event.deployment, event.loan, event.now, out)
                self._arrive(event, out)
                if event.deployment in self._deployments:
                    self._repay(event.deployment, out)
            case Cancel():
                self._cancel(event)
            case Done():
                self._done(event, out)
            case Tick():
                if self._armed is not None and event.now >= self._armed:
                    self._armed = None
                for deployment in self._deployments.values():
                    self._drain(deployment, event.now, out)
            case RunnersChanged():
                self._runners_changed(event, out)
        self._arm(event.now, out)
        return out

    def refuse_early(self, deployment: str, account: str, band: int, now: float) -> Reject | None:
        """The ``Reject`` an ``Arrive`` now would surely get, decided from the queue alone, so
        the shell can answer before reading a request's body; None when it might be admitted
        (the ``Arrive`` decides). Counted as a rejection; ``request_id`` of the answer is "".

        Only the sure cases: no runner listed; or a request that would queue (the queue is
        not empty, or no permit here at all) into a queue with no room for it (its account's
        share full, or the whole queue full of requests as urgent as it)."""
        self._now = now
        out: list[Effect] = []
        state = self._deployments.get(deployment)
        if state is None or not state.pool.listed:
            self._reject_new(state, "", RejectReason.NO_RUNNER, out)
            return _only_reject(out)
        if state.pool.unavailable_for(now) is not None:
            self._reject_new(state, "", RejectReason.RUNNER_UNAVAILABLE, out)
            return _only_reject(out)
        if not state.queue and (state.pool.permits > 0 or state.pool.shared > 0):
            return None
        max_queue = self._max_queue(state)
        full = len(state.queue) >= max_queue and state.queue.victim(below=band) is None
        if state.queue.count(account) >= account_cap(max_queue) or full:
            self._reject_new(state, "", RejectReason.OUT_OF_CAPACITY, out)
            return _only_reject(out)
        return None

    def borrowable(self, deployment: str, now: float) -> list[tuple[str, int]]:
        """``(runner id, shared permits)`` to borrow a permit on (``lane.loans``) before an
        ``Arrive``: only when no permit is free here; empty when there is nothing to borrow."""
        state = self._deployments.get(deployment)
        if state is None or state.pool.choose(self._rng, (), now) is not None:
            return []
        return state.pool.borrowable(now)

    def snapshot(self) -> dict[str, LaneCounters]:
        """Counters per deployment known from ``RunnersChanged``, as of the last event (a
        full mark or ejection that ended since still counts as "full" until the next event).
        Rejections of unknown deployments are not counted: their names are unbounded."""
        return {name: d.counters(self._now) for name, d in self._deployments.items()}

    @property
    def tracked(self) -> int:
        """Requests not yet ended (queued or dispatched)."""
        return len(self._requests)

    @property
    def armed(self) -> float | None:
        """The time of the timer the core believes armed."""
        return self._armed

    # --- events ------------------------------------------------------------------------------

    def _arrive(self, event: Arrive, out: list[Effect]) -> None:
        if event.request_id in self._requests:
            raise ValueError(f"request {event.request_id!r} is already in the lane")
        deployment = self._deployments.get(event.deployment)
        now = event.now
        if deployment is None or not deployment.pool.listed:
            self._reject_new(deployment, event.request_id, RejectReason.NO_RUNNER, out)
            return
        if deployment.pool.unavailable_for(now) is not None:
            self._reject_new(deployment, event.request_id, RejectReason.RUNNER_UNAVAILABLE, out)
            return
        if event.deadline is not None and event.deadline <= now:
            self._reject_new(deployment, event.request_id, RejectReason.EXPIRED, out)
            return
        expires_at = now + self.config.queue_ttl_s
        if event.deadline is not None:
            expires_at = min(expires_at, event.deadline)
        request = LaneRequest(
            event.request_id, event.deployment, event.account, event.priority_band, now, expires_at
        )
        if not deployment.queue:
            runner = deployment.pool.choose(self._rng, (), now)
            if runner is not None:
                self._requests[request.request_id] = request
                self._dispatch(deployment, request, runner, now, out)
                return
        if self._make_room(deployment, request, out):
            self._requests[request.request_id] = request
            deployment.queue.push(request.request_id, request.account, request.band)
            heapq.heappush(self._expiries, (expires_at, request.request_id))
        else:
            self._reject_new(deployment, request.request_id, RejectReason.OUT_OF_CAPACITY, out)

    def _make_room(
        self, deployment: LaneDeployment, request: LaneRequest, out: list[Effect]
    ) -> bool:
        """Whether ``request`` may queue, shedding a less urgent request for it if need be."""
        max_queue = self._max_queue(deployment)
        if deployment.queue.count(request.account) >= account_cap(max_queue):
            return False
        if len(deployment.queue) < max_queue:
            return True
        victim = deployment.queue.victim(below=request.band)
        if victim is None:
            return False
        self._end_queued(deployment, victim, RejectReason.OUT_OF_CAPACITY, out)
        return True

    def _cancel(self, event: Cancel) -> None:
        request = self._requests.get(event.request_id)
        if request is None or request.cancelled:
            return
        if request.runner is None:
            self._deployments[request.deployment].queue.remove(request.request_id)
            del self._requests[request.request_id]
        else:
            request.cancelled = True

    def _done(self, event: Done, out: list[Effect]) -> None:
        request = self._requests.get(event.request_id)
        if request is None or request.runner != event.runner_id:
            return
        deployment = self._deployments[request.deployment]
        deployment.pool.release(event.runner_id)
        if request.retrying:
            deployment.budget.finish()
        request.runner, request.retrying = None, False
        self._record_health(deployment, request, event)
        if request.cancelled or event.outcome in (Outcome.OK, Outcome.DISCONNECTED):
            del self._requests[request.request_id]
        else:
            self._after_failure(deployment, request, event, out)
        self._drain(deployment, event.now, out)
        self._repay(request.deployment, out)

    def _record_health(self, deployment: LaneDeployment, request: LaneRequest, event: Done) -> None:
        pool, now = deployment.pool, event.now
        if event.outcome is Outcome.OK:
            pool.succeeded(event.runner_id, now)
            if not request.cancelled:
                deployment.service.add(now - request.started_at)
        elif event.outcome is Outcome.FAILED:
            pool.failed(event.runner_id, now)
        elif event.outcome is Outcome.UNAUTHORIZED:
            pool.refused_token(event.runner_id, now)
        elif event.outcome is Outcome.REFUSED:
            pool.refused(event.runner_id, event.retry_after, now)

    def _after_failure(
        self, deployment: LaneDeployment, request: LaneRequest, event: Done, out: list[Effect]
    ) -> None:
        """A failed or refused attempt: retry it elsewhere, or end the request."""
        runner = None
        if not event.first_byte_sent and request.attempt < self.config.max_attempts:
            if deployment.budget.allows(deployment.pool.in_flight + 1):
                runner = deployment.pool.choose(self._rng, request.tried, event.now)
            else:
                deployment.budget_exhausted += 1
        if runner is not None:
            deployment.retries += 1
            deployment.budget.start()
            request.retrying = True
            self._dispatch(deployment, request, runner, event.now, out)
            return
        del self._requests[request.request_id]
        if event.outcome is Outcome.UNAUTHORIZED:
            self._count_reject(deployment, RejectReason.RUNNER_UNAVAILABLE)
            out.append(
                self._reject(deployment, request.request_id, RejectReason.RUNNER_UNAVAILABLE)
            )
            self._shed_unavailable(deployment, event.now, out)
        elif event.outcome is Outcome.REFUSED and not event.first_byte_sent:
            self._count_reject(deployment, RejectReason.OUT_OF_CAPACITY)
            out.append(self._reject(deployment, request.request_id, RejectReason.OUT_OF_CAPACITY))
        else:
            error = (
                "the runner failed after the response started"
                if event.first_byte_sent
                else "the runner call failed"
            )
            out.append(Fail(request.request_id, error, request.attempt))

    def _runners_changed(self, event: RunnersChanged, out: list[Effect]) -> None:
        deployment = self._deployments.get(event.deployment)
        if deployment is None:
            deployment = self._deployments[event.deployment] = LaneDeployment(
                RunnerPool(self.config.health),
                FairQueue(),
                RetryBudget(self.config.retry_budget_ratio, self.config.retry_budget_min),
                ServiceTime(self.config.service_p50_default_s),
            )
        deployment.pool.update(
            (slot.runner_id, slot.permits, slot.shared) for slot in event.runners
        )
        self._drain(deployment, event.now, out)
        self._fit_queue(deployment, out)
        self._repay(event.deployment, out)

    def _lend(self, name: str, runner: str, now: float, out: list[Effect]) -> None:
        """One borrowed permit more on ``runner``; straight back when it is gone."""
        deployment = self._deployments.get(name)
        if deployment is None or not deployment.pool.lend(runner):
            out.append(Repay(name, runner))
            return
        self._drain(deployment, now, out)

    def _repay(self, name: str, out: list[Effect]) -> None:
        """Give back the deployment's borrowed permits that no request holds."""
        out.extend(Repay(name, runner) for runner in self._deployments[name].pool.repay_idle())

    def _expire(self, now: float, out: list[Effect]) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            at, request_id = heapq.heappop(self._expiries)
            request = self._requests.get(request_id)
            if request is not None and request.runner is None and request.expires_at == at:
                deployment = self._deployments[request.deployment]
                self._end_queued(deployment, request_id, RejectReason.EXPIRED, out)


def _only_reject(effects: list[Effect]) -> Reject:
    (reject,) = effects
    assert isinstance(reject, Reject)
    return reject
