"""Service time and the ``Retry-After`` a rejection carries.

A rejection is only useful with a hint the client can act on: roughly how long until the
requests ahead of it have been served, ``queue ahead × service p50 ÷ permits``, clamped to
1–30 s so a cold estimate never tells a client to hammer (0) or to give up for minutes.
The p50 is the median of the last ``window`` successful calls: robust to the odd multi-minute
call that would drag a mean.
"""

from __future__ import annotations

import math
import statistics
from collections import deque


class ServiceTime:
    def __init__(self, default_s: float = 1.0, window: int = 64) -> None:
        self.default_s = default_s
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self._recent.append(max(0.0, seconds))

    def p50(self) -> float:
        return statistics.median(self._recent) if self._recent else self.default_s


def retry_after(ahead: int, p50_s: float, permits: int, low: int = 1, high: int = 30) -> int:
    """Whole seconds (HTTP ``Retry-After``) until ``ahead`` requests are likely served."""
    seconds = math.ceil(ahead * p50_s / max(1, permits))
    return max(low, min(high, seconds))
