"""Counters the host exports as metrics, and the recent request rates the cost policy reads."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class PoolStats:
    window: float = 300.0
    loads_total: Counter[str] = field(default_factory=Counter)
    """By reason: ``request``, ``admin``, ``pin``, ``oom-retry``."""
    evictions_total: Counter[str] = field(default_factory=Counter)
    """Unloads forced by memory or an operator, by reason: ``lru``, ``cost``, ``reconcile``,
    ``admin``, ``oom-retry``, ``too_large``."""
    unloads_total: Counter[str] = field(default_factory=Counter)
    """Every unload, by its ``StartUnload.reason``."""
    load_seconds: list[float] = field(default_factory=list)
    requests_total: int = 0
    _loads: deque[float] = field(default_factory=deque)
    _requests: deque[tuple[float, str]] = field(default_factory=deque)

    def load_started(self, reason: str, now: float) -> None:
        self.loads_total[reason] += 1
        self._loads.append(now)
        self._trim(now)

    def request(self, model: str, now: float) -> None:
        self.requests_total += 1
        self._requests.append((now, model))
        self._trim(now)

    def recent_requests(self, model: str, now: float) -> int:
        self._trim(now)
        return sum(1 for _, m in self._requests if m == model)

    def thrash_ratio(self, now: float) -> float:
        """Loads ÷ requests over the window (0 without requests)."""
        self._trim(now)
        return len(self._loads) / len(self._requests) if self._requests else 0.0

    def _trim(self, now: float) -> None:
        while self._loads and self._loads[0] <= now - self.window:
            self._loads.popleft()
        while self._requests and self._requests[0][0] <= now - self.window:
            self._requests.popleft()
