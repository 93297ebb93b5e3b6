"""The retry budget: concurrent retries at most max(``minimum``, ``ratio`` × active requests).

A fixed "retry each request once" doubles the load exactly when the runners are failing or
full, which is when they can least take it. Envoy's budget bounds retries to a share of the
traffic instead, with a small floor so a quiet deployment can still retry at all.
"""

from __future__ import annotations


class RetryBudget:
    def __init__(self, ratio: float = 0.2, minimum: int = 3) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.retrying = 0
        """Retries in flight now."""

    def allows(self, active: int) -> bool:
        """Whether one more retry fits, ``active`` counting every request holding a permit
        plus the one to retry."""
        return self.retrying + 1 <= max(self.minimum, self.ratio * active)

    def start(self) -> None:
        self.retrying += 1

    def finish(self) -> None:
        if self.retrying <= 0:
            raise RuntimeError("no retry in flight")
        self.retrying -= 1
