"""The one background loop (``core.periodic.Periodic``): rounds, failures, ``at_once`` and
``wake``, on a real event loop with an hour-long interval (no round ever comes from a timer)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from core.periodic import Periodic
from tests.fixtures.waiting import until

log = logging.getLogger("tests.periodic")
HOUR = 3600.0


class Steps:
    """A step that counts its rounds and raises what it is told to, round by round."""

    def __init__(self, *raises: BaseException | None) -> None:
        self.rounds = 0
        self.raises = list(raises)
        self.changed = asyncio.Event()

    async def __call__(self) -> None:
        self.rounds += 1
        self.changed.set()
        if self.raises:
            error = self.raises.pop(0)
            if error is not None:
                raise error

    async def reach(self, rounds: int) -> None:
        async with asyncio.timeout(30):
            while self.rounds < rounds:
                self.changed.clear()
                await self.changed.wait()


def pausing(task: asyncio.Task[None]) -> bool:
    """The loop waits out its interval: suspended inside ``Periodic._pause`` (an hour here, so
    no further round can come before the test looks)."""
    awaited = task.get_coro().cr_await  # type: ignore[union-attr]
    while awaited is not None:
        code = getattr(awaited, "cr_code", None)
        if code is not None and code.co_name == "_pause":
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


async def settle(task: asyncio.Task[None] | None) -> None:
    """Wait until the loop is back in its pause: every round it would run at once has run."""
    assert task is not None

    async def paused() -> bool:
        return pausing(task)

    await until(paused, "the loop pausing for its interval", interval=0.01)


async def test_at_once_runs_the_first_round_without_waiting_an_interval() -> None:
    step = Steps()
    periodic = Periodic("test", HOUR, step, "test step", log)
    periodic.start(at_once=True)
    try:
        await step.reach(1)
        await settle(periodic._task)
        assert step.rounds == 1  # the next one is an hour away
    finally:
        await periodic.stop()


async def test_without_at_once_the_first_round_waits_an_interval() -> None:
    step = Steps()
    periodic = Periodic("test", HOUR, step, "test step", log)
    periodic.start()
    await settle(periodic._task)
    assert step.rounds == 0
    await periodic.stop()


async def test_wake_brings_the_next_round_forward_once() -> None:
    step = Steps()
    wake = asyncio.Event()
    task = asyncio.create_task(Periodic("test", HOUR, step, "test step", log, wake=wake).run())
    try:
        await settle(task)
        assert step.rounds == 0
        wake.set()
        await step.reach(1)
        await settle(task)
        assert step.rounds == 1  # still set, but it woke the loop once: back to the interval
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_wake_already_set_at_start_counts_once() -> None:
    step = Steps()
    wake = asyncio.Event()
    wake.set()
    periodic = Periodic("test", HOUR, step, "test step", log, wake=wake)
    periodic.start(at_once=True)
    try:
        await step.reach(2)
        await settle(periodic._task)
        assert step.rounds == 2
    finally:
        await periodic.stop()


async def test_failures_are_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    step = Steps(ConnectionError("away"), RuntimeError("bug"), None)
    periodic = Periodic("test", 0.0, step, "test step", log, (ConnectionError,))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        periodic.start(at_once=True)
        try:
            await step.reach(3)
        finally:
            await periodic.stop()
    records = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert (logging.DEBUG, "test step missed: ConnectionError('away')", False) in records
    assert (logging.ERROR, "test step failed", True) in records


async def test_stop_ends_the_loop_and_start_again_is_a_no_op_while_running() -> None:
    step = Steps()
    periodic = Periodic("test", HOUR, step, "test step", log)
    periodic.start(at_once=True)
    periodic.start(at_once=True)
    await step.reach(1)
    await settle(periodic._task)
    assert step.rounds == 1
    await periodic.stop()
    await periodic.stop()  # twice is harmless
