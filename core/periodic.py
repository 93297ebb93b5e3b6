"""A step run every ``interval`` seconds in the background, whatever one round meets.

The one shape of Conduit's background loops (queue heartbeats, takeovers, reconciliation,
the read order's refresh, fleet heartbeats and views, the lane's supply and membership, the
runner monitor): a failure in ``transient`` (an outage the owner expects, e.g.
:data:`core.transient.TRANSIENT`) is logged at debug level, anything else with its traceback;
neither stops the loop. The first round runs ``interval`` after the start unless the owner asks
for one at once (``at_once``), and a ``wake`` event, once set, brings the next round forward
(once: a director that starts stopping says so in its heartbeat without waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    def __init__(
        self,
        name: str,
        interval: float,
        step: Callable[[], Awaitable[object]],
        what: str,
        log: logging.Logger,
        transient: tuple[type[BaseException], ...] = (),
        *,
        wake: asyncio.Event | None = None,
    ) -> None:
        """``name``: the task's; ``what``: the step as logs name it ("<what> missed: ...",
        "<what> failed"), on the owner's ``log``; ``transient``: what is only missed;
        ``wake``: an event whose setting runs the next round at once (the first time only)."""
        self.name = name
        self.interval = interval
        self.step = step
        self.what = what
        self.log = log
        self.transient = transient
        self.wake = wake
        self._woken = False
        self._task: asyncio.Task[None] | None = None

    async def step_logged(self) -> None:
        """One round; a failure is logged, never raised."""
        try:
            await self.step()
        except self.transient as error:
            self.log.debug("%s missed: %r", self.what, error)
        except Exception:  # the loop must go on whatever one round met
            self.log.exception("%s failed", self.what)

    async def run(self, *, at_once: bool = False) -> None:
        """Run the step every ``interval`` (first at once with ``at_once``), until cancelled."""
        if at_once:
            await self.step_logged()
        while True:
            await self._pause()
            await self.step_logged()

    def start(self, *, at_once: bool = False) -> None:
        """Run the step every ``interval`` until :meth:`stop` (once started, again is a no-op)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(at_once=at_once), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pause(self) -> None:
        wake = self.wake
        if wake is None or self._woken:
            await asyncio.sleep(self.interval)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), self.interval)
        self._woken = wake.is_set()
