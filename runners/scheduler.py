"""Prediction slots and the bounded priority queue in front of them.

A request is *admitted* (a slot now, or a place in the queue) or refused at once: with
``max_queue_depth == 0`` the runner behaves as Cog does (409 when every slot is busy); otherwise
up to ``max_queue_depth`` predictions wait, served high → normal → low and first come first
served within a priority, and beyond that the runner answers 503 with ``Retry-After``. Refusing
early is the point: the caller (a director) can back off or go elsewhere instead of holding a
connection open behind an unbounded queue.

Single-threaded: everything runs on the runner's event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

from protocol.values import Priority
from runners.errors import AtCapacityError, QueueFullError

__all__ = ["Priority", "Scheduler", "Ticket"]

_RECENT = 256
"""Waits and run times remembered for averages and the p95."""


@dataclass(eq=False)
class Ticket:
    """One admitted prediction's claim on a slot."""

    priority: Priority
    admitted_at: float = field(default_factory=time.monotonic)
    granted_at: float | None = None
    released: bool = False
    _granted: asyncio.Future[None] | None = None

    @property
    def queue_wait(self) -> float:
        """Seconds spent queued (so far, if still waiting)."""
        end = self.granted_at if self.granted_at is not None else time.monotonic()
        return end - self.admitted_at


class Scheduler:
    def __init__(self, slots: int, max_queue_depth: int) -> None:
        if slots < 1 or max_queue_depth < 0:
            raise ValueError("slots must be at least 1 and max_queue_depth not negative")
        self.slots = slots
        self.max_queue_depth = max_queue_depth
        self.in_use = 0
        self._queue: list[tuple[int, int, Ticket]] = []
        self._order = itertools.count()
        self._waits: deque[float] = deque(maxlen=_RECENT)
        self._runs: deque[float] = deque(maxlen=_RECENT)

    @property
    def depth(self) -> int:
        """Predictions waiting for a slot."""
        return len(self._queue)

    @property
    def saturated(self) -> bool:
        """True when the next request would be refused."""
        if self.in_use < self.slots and not self._queue:
            return False
        return self.depth >= self.max_queue_depth

    def admit(self, priority: Priority) -> Ticket:
        """A slot now, or a place in the queue; raises when there is neither."""
        ticket = Ticket(priority)
        if self.in_use < self.slots and not self._queue:
            self._grant(ticket)
            return ticket
        if self.max_queue_depth == 0:
            raise AtCapacityError()
        if self.depth >= self.max_queue_depth:
            average_wait = self.wait_stats()["avg_wait_ms"]
            raise QueueFullError(self.depth, self.max_queue_depth, average_wait, self.retry_after())
        ticket._granted = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (priority.rank, next(self._order), ticket))
        return ticket

    async def acquire(self, ticket: Ticket) -> None:
        """Wait until ``ticket`` holds a slot. Cancelling the wait gives the place up."""
        if ticket.granted_at is not None:
            return
        assert ticket._granted is not None
        try:
            await asyncio.shield(ticket._granted)
        except asyncio.CancelledError:
            self.release(ticket)
            raise

    def release(self, ticket: Ticket, ran_for: float | None = None) -> None:
        """Give the slot (or the queue place) back; safe to call more than once."""
        if ticket.released:
            return
        ticket.released = True
        if ticket.granted_at is None:
            self._queue = [item for item in self._queue if item[2] is not ticket]
            heapq.heapify(self._queue)
            return
        if ran_for is not None:
            self._runs.append(ran_for)
        self.in_use -= 1
        while self._queue and self.in_use < self.slots:
            _, _, waiting = heapq.heappop(self._queue)
            self._grant(waiting)

    def retry_after(self) -> int:
        """Whole seconds until a place is likely to free up: the queue ahead of a newcomer,
        drained at the recent average run time across all slots (at least 1 s)."""
        average_run = sum(self._runs) / len(self._runs) if self._runs else 1.0
        return max(1, math.ceil(average_run * (self.depth + 1) / self.slots))

    def wait_stats(self) -> dict[str, float]:
        """Average and p95 of recent queue waits, in milliseconds."""
        waits = sorted(self._waits)
        if not waits:
            return {"avg_wait_ms": 0.0, "p95_wait_ms": 0.0}
        p95 = waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)]
        return {
            "avg_wait_ms": round(1000 * sum(waits) / len(waits), 3),
            "p95_wait_ms": round(1000 * p95, 3),
        }

    def _grant(self, ticket: Ticket) -> None:
        self.in_use += 1
        ticket.granted_at = time.monotonic()
        self._waits.append(ticket.queue_wait)
        if ticket._granted is not None and not ticket._granted.done():
            ticket._granted.set_result(None)
