"""How long to wait before offering a prediction to a runner that refused it.

A runner that says ``Retry-After`` is taken at its word: the director waits that long (capped,
so one absurd header cannot park a worker) plus a little jitter, never less, so that workers
refused at the same moment do not come back in lockstep. A runner that says nothing gets
exponential backoff with jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StartBackoff:
    #: First wait without ``Retry-After``, doubling per attempt up to ``max_delay``; also the
    #: shortest wait ever (``Retry-After: 0`` must not become a busy loop).
    initial: float = 0.05
    max_delay: float = 2.0
    #: Longest ``Retry-After`` honoured as given.
    max_retry_after: float = 120.0
    #: Fraction of a ``Retry-After`` wait added at random on top of it.
    jitter: float = 0.1
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after is not None:
            base = min(max(retry_after, self.initial), self.max_retry_after)
            return base * (1 + self.rng.uniform(0, self.jitter))
        ceiling = min(self.initial * 2.0 ** min(attempt, 30), self.max_delay)
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)
