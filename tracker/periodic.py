"""A step run every ``interval`` seconds in the background, whatever one round meets.

A transient failure (Redis or Postgres away, :data:`tracker.retry.TRANSIENT`) is logged at
debug level, anything else with its traceback; neither stops the loop. The first round runs
``interval`` after :meth:`Periodic.start`: an owner that wants one at once calls
:meth:`Periodic.step_logged` (or its step) itself first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tracker.retry import TRANSIENT


class Periodic:
    def __init__(
        self,
        name: str,
        interval: float,
        step: Callable[[], Awaitable[object]],
        what: str,
        log: logging.Logger,
        transient: tuple[type[BaseException], ...] = TRANSIENT,
    ) -> None:
        """``name``: the task's; ``what``: the step as logs name it ("<what> missed: ...",
        "<what> failed"), on the owner's ``log``; ``transient``: what is only missed."""
        self.name = name
        self.interval = interval
        self.step = step
        self.what = what
        self.log = log
        self.transient = transient
        self._task: asyncio.Task[None] | None = None

    async def step_logged(self) -> None:
        """One round; a failure is logged, never raised."""
        try:
            await self.step()
        except self.transient as error:
            self.log.debug("%s missed: %r", self.what, error)
        except Exception:  # the loop must go on whatever one round met
            self.log.exception("%s failed", self.what)

    def start(self) -> None:
        """Run the step every ``interval`` until :meth:`stop` (once started, again is a no-op)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.step_logged()
