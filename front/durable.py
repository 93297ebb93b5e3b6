"""The durable path every entry ends on: a prediction committed, then queued on the stream of
its destination that its account is sharded to. A 201 (or a gateway task's subscription) is
never given for a prediction that is not stored; a Redis failure after the commit is left to
the reconciler (:mod:`director.submit`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from director.queue import Queue
from director.submit import Submitted, enqueue_stored, submit
from tracker.group_commit import Batcher
from tracker.keys import Target
from tracker.store import NewPrediction

#: Inserts a prediction in the caller's transaction, unless its idempotency key already names
#: one: the row, and whether it is that earlier one (a replay).
InsertOnce = Callable[[AsyncConnection, NewPrediction], Awaitable[tuple[RowMapping, bool]]]


class Durable:
    """One process's way to store and queue: its grouped inserts, its queue client and the
    engine for the inserts that must run in a transaction of their own."""

    def __init__(
        self,
        inserter: Batcher[NewPrediction, RowMapping],
        queue: Queue,
        engine: AsyncEngine,
    ) -> None:
        self.inserter = inserter
        self.queue = queue
        self.engine = engine

    async def submit(self, new: NewPrediction, target: Target) -> RowMapping:
        """Commit ``new`` (grouped with other creates), then queue it: the stored row."""
        return await submit(self.inserter, self.queue, new, target)

    async def submit_once(
        self, new: NewPrediction, target: Target, insert_once: InsertOnce
    ) -> tuple[RowMapping, bool]:
        """Commit ``new`` under an idempotency key, then queue it; a replay is neither stored
        nor queued again. The row, and whether it is a replay."""
        async with self.engine.begin() as conn:
            row, replayed = await insert_once(conn, new)
        if not replayed:
            await enqueue_stored(self.queue, new, target)
        return row, replayed

    async def enqueue(self, stored: Submitted, target: Target) -> None:
        """Queue a prediction committed already (the operator page's retries)."""
        await enqueue_stored(self.queue, stored, target)
