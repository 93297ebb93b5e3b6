"""Graphs of blocks (``output_ptr``): plan one, then run it, whatever a step is.

Owns the graph's semantics only: :func:`~gateway.graphs.plan.plan_graph` refuses a bad graph
before anything runs and resolves each block once; :func:`run_graph` runs the steps as the
sans-IO core of :mod:`gateway.graphs.core` decides, on the shared :class:`core.shell.Shell`.
How a step runs (a prediction on the durable path, a call to another cluster) is the caller's
:class:`StepRunner`; this module neither knows nor cares.

A run leaves nothing behind: when it returns, raises, or its caller cancels it, every step it
started has ended (those still running are canceled, and awaited).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Generic, Protocol, TypeVar

import grpc

from core.shell import ArmTimer, Shell, Tick
from gateway.errors import Cancelled, DeadlineExceeded, GatewayError
from gateway.graphs.core import (
    Answer,
    Begin,
    Effect,
    Event,
    GraphRun,
    RunStep,
    StepFailure,
    StepRaised,
    StepSucceeded,
    TimedOut,
)
from gateway.graphs.plan import GraphPlan

__all__ = ["StepFailed", "StepRunner", "run_graph"]

log = logging.getLogger(__name__)

B = TypeVar("B")
B_contra = TypeVar("B_contra", contravariant=True)


class StepFailed(GatewayError):
    """A step of the graph raised: the graph fails with the step's status (``ABORTED`` for an
    error that carries none), its message naming the step."""

    code = grpc.StatusCode.ABORTED

    def __init__(self, step: str, error: BaseException) -> None:
        self.step = step
        self.error = error
        if isinstance(error, GatewayError):
            self.code = error.code
            detail = error.message
        else:
            detail = str(error) or type(error).__name__
        super().__init__(f"step {step} failed: {detail}")
        self.__cause__ = error


class StepRunner(Protocol[B_contra]):
    """Runs one step: ``block`` (what the plan resolved ``step`` to) on ``data``, by
    ``deadline`` (a ``time.monotonic()`` instant, the graph's own); returns its output."""

    async def __call__(self, step: str, block: B_contra, data: Any, deadline: float, /) -> Any: ...


async def run_graph(
    plan: GraphPlan[B],
    head_data: dict[str, Any],
    run_step: StepRunner[B],
    deadline: float,
    max_inflight: int = 8,
) -> Any:
    """The graph's answer: the one leaf's output, or ``{leaf: output, …}`` for several.

    Raises :class:`StepFailed` for the first step that raised, or :class:`DeadlineExceeded`
    naming the steps still running when ``deadline`` passed; either way only once every step
    still running has been canceled and has ended."""
    return await _GraphShell(plan, head_data, run_step, deadline, max_inflight).run()


class _GraphShell(Generic[B]):
    """Carries out a :class:`GraphRun`'s effects: one task per step, its ending fed back."""

    def __init__(
        self,
        plan: GraphPlan[B],
        head_data: dict[str, Any],
        run_step: StepRunner[B],
        deadline: float,
        max_inflight: int,
    ) -> None:
        self.plan = plan
        self.run_step = run_step
        self.deadline = deadline
        self.core = GraphRun(plan, head_data, deadline, max_inflight)
        # The shell's clock is the loop's: ``time.monotonic()`` on asyncio's loop, and on
        # uvloop's to the millisecond (it reads the same clock once per loop iteration).
        self.shell: Shell[Event, Effect] = Shell(
            self.core.handle, self.carry_out, timer=ArmTimer, tick=Tick
        )
        self.outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        #: Set once the run is ending: no step starts, and no ending is fed to the core.
        self.closing = False

    async def run(self) -> Any:
        try:
            self.shell.feed(Begin(self.shell.now()))
            return await self.outcome
        finally:
            self.closing = True
            self.shell.close()
            await _cancel_and_wait(list(self.tasks.values()))

    def carry_out(self, effect: Effect) -> None:
        match effect:
            case RunStep(step=step, data=data):
                if not self.closing:
                    self._start(step, data)
            case Answer(value=value):
                self._settle(value, None)
            case StepFailure(step=step, error=error):
                if not isinstance(error, GatewayError):
                    log.error("graph step %s raised", step, exc_info=error)
                self._settle(None, StepFailed(step, error))
            case TimedOut(running=running, waiting=waiting):
                self._settle(None, DeadlineExceeded(_timed_out_message(running, waiting)))

    def _start(self, step: str, data: Any) -> None:
        task = asyncio.create_task(self._step(step, data), name=f"graph step {step}")
        self.tasks[step] = task
        task.add_done_callback(lambda done: self._ended(step, done))

    async def _step(self, step: str, data: Any) -> Any:
        return await self.run_step(step, self.plan.resolved[step], data, self.deadline)

    def _ended(self, step: str, task: asyncio.Task[Any]) -> None:
        if self.closing:
            return
        event: Event
        if task.cancelled():  # not by this run: it cancels only while closing
            event = StepRaised(step, Cancelled("the step was canceled"))
        elif (error := task.exception()) is not None:
            event = StepRaised(step, error)
        else:
            event = StepSucceeded(step, task.result(), self.shell.now())
        try:
            self.shell.feed(event)
        except Exception as fault:  # a fault of the core's: end the run rather than hang it
            self._settle(None, fault)

    def _settle(self, value: Any, error: BaseException | None) -> None:
        if self.outcome.done():  # the caller canceled the run
            return
        if error is None:
            self.outcome.set_result(value)
        else:
            self.outcome.set_exception(error)


def _timed_out_message(running: tuple[str, ...], waiting: tuple[str, ...]) -> str:
    parts = ["the graph's deadline passed"]
    if running:
        parts.append(f"still running: {', '.join(running)}")
    if waiting:
        parts.append(f"not started: {', '.join(waiting)}")
    return "; ".join(parts)


async def _cancel_and_wait(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended, even if this wait is canceled
    (then re-raise the cancellation once they have)."""
    for task in tasks:
        task.cancel()
    canceled = False
    pending = [task for task in tasks if not task.done()]
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            canceled = True
        pending = [task for task in pending if not task.done()]
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: an ending after the run's own is not news
    if canceled:
        raise asyncio.CancelledError
