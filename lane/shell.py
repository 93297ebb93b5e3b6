"""The lane's IO shell: the sans-IO core on :class:`core.shell.Shell`, and each request's
future.

:meth:`LaneShell.handle` feeds the core from whichever request handler or callback has news;
the shell's inbox keeps it from being entered twice at once, and its one timer (on the loop's
clock, which is the events' clock) is the one ``ArmTimer`` asks for. The answer of a request
(``Dispatch``, ``Reject``, ``Fail``) resolves the future its handler awaits.

The shell keeps the core's contract: exactly one ``Done`` per ``Dispatch``. A ``Dispatch``
whose handler is gone (it was cancelled as the permit was granted) is given back at once as
``Done(disconnected)``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from core.shell import ArmTimer, Shell, Tick
from lane.core import LaneCore
from lane.core_records import LaneConfig, LaneCounters
from lane.events import (
    Arrive,
    Cancel,
    Dispatch,
    Done,
    Effect,
    Event,
    Fail,
    Outcome,
    Reject,
    Repay,
    RunnersChanged,
    RunnerSlot,
)

log = logging.getLogger(__name__)

Answer = Dispatch | Reject | Fail
"""What a request waits for: a permit on a runner, or its end."""


@dataclass(frozen=True, slots=True)
class Admission:
    """A request's place in the lane: ``answer`` resolves to its ``Dispatch``, ``Reject`` or
    ``Fail``."""

    request_id: str
    deployment: str
    answer: asyncio.Future[Answer]


class LaneShell:
    def __init__(
        self,
        config: LaneConfig | None = None,
        on_wait: Callable[[str, float], None] | None = None,
        on_repay: Callable[[Repay], None] | None = None,
    ) -> None:
        """``on_wait(deployment, seconds)``: a request's wait in the queue, at its first
        dispatch (for the ``lane_queue_wait_seconds`` histogram); ``on_repay``: gives a
        borrowed permit back to the pool in Redis (``lane.loans``)."""
        self.core = LaneCore(config)
        self.on_wait = on_wait
        self.on_repay = on_repay
        self._answers: dict[str, asyncio.Future[Answer]] = {}
        self._deployment_of: dict[str, str] = {}
        self._shell: Shell[Event, Effect] = Shell(
            self.core.handle, self._answer, timer=ArmTimer, tick=Tick
        )

    @property
    def config(self) -> LaneConfig:
        return self.core.config

    def now(self) -> float:
        return self._shell.now()

    # --- requests ----------------------------------------------------------------------------

    def refuse_early(self, deployment: str, account: str, band: int) -> Reject | None:
        """What the lane would surely answer now, before the request's body is read."""
        return self.core.refuse_early(deployment, account, band, self.now())

    def borrowable(self, deployment: str) -> list[tuple[str, int]]:
        """Runners (with their shared permits) to borrow a permit on before arriving: none
        unless every permit here is taken."""
        return self.core.borrowable(deployment, self.now())

    def arrive(
        self,
        request_id: str,
        deployment: str,
        account: str,
        band: int,
        deadline: float | None,
        loan: str | None = None,
    ) -> Admission:
        """``loan``: a runner a shared permit was just borrowed on for this request."""
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        self._deployment_of[request_id] = deployment
        self.handle(Arrive(request_id, deployment, account, band, deadline, self.now(), loan))
        return Admission(request_id, deployment, answer)

    def leave(self, admission: Admission) -> None:
        """The request's handler gives up waiting (its client left): out of the queue, or, if
        the permit was granted meanwhile, the permit back."""
        answer = self._answers.pop(admission.request_id, None)
        if answer is not None and answer.done() and not answer.cancelled():
            granted = answer.result()
            if isinstance(granted, Dispatch):
                self.done(granted, Outcome.DISCONNECTED, first_byte_sent=False)
                return
        self._deployment_of.pop(admission.request_id, None)
        self.handle(Cancel(admission.request_id, self.now()))

    def done(
        self,
        dispatch: Dispatch,
        outcome: Outcome,
        *,
        first_byte_sent: bool,
        retry_after: float | None = None,
    ) -> Answer | None:
        """The attempt ``dispatch`` ended. The request's next answer when the lane has one for
        it (a retry's ``Dispatch``, or its ``Reject`` or ``Fail``); None when it is over."""
        request_id = dispatch.request_id
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        self.handle(
            Done(request_id, dispatch.runner_id, outcome, first_byte_sent, self.now(), retry_after)
        )
        if answer.done():
            return answer.result()
        self._answers.pop(request_id, None)
        self._deployment_of.pop(request_id, None)
        return None

    # --- the fleet ---------------------------------------------------------------------------

    def runners_changed(self, deployment: str, runners: tuple[RunnerSlot, ...]) -> None:
        self.handle(RunnersChanged(deployment, runners, self.now()))

    def snapshot(self) -> dict[str, LaneCounters]:
        return self.core.snapshot()

    # --- the core ----------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        """Feed ``event`` to the core and carry out what it answers. Events raised while
        effects are carried out (a grant nobody waits for any more) queue behind it."""
        self._shell.feed(event)

    def _answer(self, effect: Effect) -> None:
        if isinstance(effect, ArmTimer):  # the shell arms its timer itself: never seen here
            return
        if isinstance(effect, Repay):
            if self.on_repay is not None:
                self.on_repay(effect)
            return
        request_id = effect.request_id
        answer = self._answers.get(request_id)
        if isinstance(effect, Dispatch) and effect.attempt == 1 and self.on_wait is not None:
            deployment = self._deployment_of.get(request_id)
            if deployment is not None:
                self.on_wait(deployment, effect.waited_s)
        if answer is not None and not answer.done():
            answer.set_result(effect)
            if not isinstance(effect, Dispatch):
                self._answers.pop(request_id, None)
                self._deployment_of.pop(request_id, None)
            return
        if isinstance(effect, Dispatch):
            # Granted to a request whose handler is gone: the permit goes straight back.
            log.debug("lane: permit for %s given back, nobody waits for it", request_id)
            self._shell.feed(
                Done(request_id, effect.runner_id, Outcome.DISCONNECTED, False, self.now())
            )

    def close(self) -> None:
        self._shell.close()
