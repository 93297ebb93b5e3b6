"""The wait queue: requests (and admin loads) waiting for a permit, a load or memory.

Order in warm mode: priority (higher first), then arrival; a request that has waited longer
than ``starvation_after`` is no longer overtaken (aged requests go first, in arrival order).
In FIFO mode the order is arrival alone, and the core lets the head block the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from runners.pool.config import QueueMode


@dataclass(slots=True)
class Waiter:
    request_id: str
    model: str
    deadline: float | None
    priority: int
    arrived: float
    seq: int
    keep_alive: float | None
    """Already capped; None: the model's default."""
    admin: bool = False
    """An ``AdminLoad``: answered with ``AdminDone`` when the model is READY; takes no permit."""


class WaitQueue:
    def __init__(self, mode: QueueMode, max_depth: int, starvation_after: float) -> None:
        self.mode = mode
        self.max_depth = max_depth
        self.starvation_after = starvation_after
        self._waiters: dict[str, Waiter] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiters

    def full(self) -> bool:
        return len(self._waiters) >= self.max_depth

    def add(self, waiter: Waiter) -> None:
        self._waiters[waiter.request_id] = waiter

    def remove(self, request_id: str) -> Waiter | None:
        return self._waiters.pop(request_id, None)

    def aged(self, waiter: Waiter, now: float) -> bool:
        return now - waiter.arrived >= self.starvation_after

    def ordered(self, now: float) -> list[Waiter]:
        waiters = list(self._waiters.values())
        if self.mode is QueueMode.FIFO:
            return sorted(waiters, key=lambda w: w.seq)
        return sorted(
            waiters,
            key=lambda w: (0, 0, w.seq) if self.aged(w, now) else (1, -w.priority, w.seq),
        )

    def for_model(self, model: str) -> list[Waiter]:
        return [w for w in self._waiters.values() if w.model == model]

    def wakeups(self, now: float) -> list[float]:
        """Deadlines and aging instants still ahead (each may change what happens next)."""
        times = [w.deadline for w in self._waiters.values() if w.deadline is not None]
        times += [w.arrived + self.starvation_after for w in self._waiters.values()]
        return [t for t in times if t > now]
