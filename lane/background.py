"""Work a ``/run`` leaves behind when its handler is done (telling a runner to cancel a run
nobody reads any more), owned by the lane so that shutdown waits for it rather than dropping
it with the event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` on its own; kept until it ends."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for what runs, then cancel what is left."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            log.warning("lane: %d background task(s) cancelled at shutdown", len(late))
            await asyncio.wait(late)
