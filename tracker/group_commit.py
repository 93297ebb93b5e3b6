"""Group commit: writes that arrive together share one statement.

Every state write used to pay a pool checkout and a round trip of its own; under load that,
not Postgres, bounds the rate (a create, a start, a finish each cost a few milliseconds of
Python and a round trip). A :class:`Batcher` collects calls: the first one in an idle
process is written at once (no added latency), and every call that arrives while a write is
in flight goes into the next one. The write function turns a batch into one statement, so a
batch is atomic (autocommit): either every row of it is written or none is; when a batch fails,
its items are written again one by one, so a bad row fails only its own caller. Each caller
gets its own result back, or its own exception, and only then goes on: a caller that
acknowledges or answers after ``await`` still does so after the commit.

Batchers group only the calls that reach the same instance: build them (or what holds them)
once per process, in its composition root, and pass them to every caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar, cast

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """Run ``write`` over groups of at most ``max_batch`` items; one result per item, in order."""

    def __init__(
        self,
        write: Callable[[list[Item]], Awaitable[Sequence[Result]]],
        max_batch: int = 64,
    ) -> None:
        self._write = write
        self.max_batch = max_batch
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        """Write ``item`` with whatever else is waiting; returns its result once committed."""
        done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, done))
        writer = self._writer
        # A writer of another (closed) event loop never runs again: start one in this loop.
        if writer is None or writer.done() or writer.get_loop() is not done.get_loop():
            self._writer = asyncio.create_task(self._write_batches())
        return await done

    async def _write_batches(self) -> None:
        while self._waiting:
            batch = self._waiting[: self.max_batch]
            del self._waiting[: self.max_batch]
            try:
                results = await self._write([item for item, _ in batch])
            except Exception as error:
                if len(batch) == 1:
                    _settle(batch[0][1], error=error)
                else:
                    # One bad row must not fail its neighbours: write each on its own, so
                    # every caller gets its own outcome.
                    await self._write_one_by_one(batch)
                continue
            for (_, done), result in zip(batch, results, strict=True):
                _settle(done, result)

    async def _write_one_by_one(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        for item, done in batch:
            try:
                (result,) = await self._write([item])
            except Exception as error:  # the caller raises it as its own
                _settle(done, error=error)
            else:
                _settle(done, result)

    async def close(self) -> None:
        """Let the batch in flight (and any still waiting) finish."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer


def _settle(
    done: asyncio.Future[Result], result: Result | None = None, *, error: Exception | None = None
) -> None:
    if done.done() or done.get_loop().is_closed():  # the caller is gone (cancelled, or its loop)
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(cast(Result, result))
