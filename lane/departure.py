"""Noticing a ``/run``'s client leave, and stopping what is waited on for it.

Watching takes a task of its own that waits on the caller's ``left`` (for the api, a read of
the receive channel up to ``http.disconnect``): a few scheduling rounds of the event loop on
every request. So it starts only when a wait may be long: at once for a request that has to
queue, :data:`WATCH_AFTER` into a runner call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: A runner call still going after this long (s) has its client watched from then on: a run
#: that ends sooner is over before a cancel could reach its runner anyway.
WATCH_AFTER = 0.02


class Departure:
    """The client's leaving, watched on demand."""

    def __init__(self, left: Callable[[], Awaitable[object]]) -> None:
        self._left = left
        self.watcher: asyncio.Future[Any] | None = None

    def watch(self) -> asyncio.Future[Any]:
        if self.watcher is None:
            self.watcher = asyncio.ensure_future(self._left())
        return self.watcher

    async def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher

    async def first(self, answer: asyncio.Future[T]) -> bool:
        """Wait for ``answer`` or the client's leaving, watching at once; whether ``answer``
        came (it may come in the same round as the leaving)."""
        await asyncio.wait((answer, self.watch()), return_when=asyncio.FIRST_COMPLETED)
        return answer.done()

    async def or_leave(self, call: asyncio.Task[T]) -> T | None:
        """``call``'s result; None when the client left first (the call is cancelled then).
        Watching starts :data:`WATCH_AFTER` into the call unless it has started already."""

        def leave(_: object) -> None:
            call.cancel()

        def watch() -> None:
            self.watch().add_done_callback(leave)

        timer = None
        if self.watcher is None:
            timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watch)
        else:
            self.watcher.add_done_callback(leave)
        try:
            return await call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this handler is cancelled itself (shutdown): not the client leaving
            return None
        finally:
            if timer is not None:
                timer.cancel()
            if self.watcher is not None:
                self.watcher.remove_done_callback(leave)
