"""How long to wait before offering a prediction to a runner that refused it.

A runner that says ``Retry-After`` is taken at its word: the director waits that long (capped,
so one absurd header cannot park a worker) plus a little jitter, never less, so that workers
refused at the same moment do not come back in lockstep. A runner that says nothing gets
exponential backoff with jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tracker.retry import backoff_delay


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
        if retry_after is not None:  # the runner's word: a one-step schedule, jitter upward
            return backoff_delay(
                0,
                schedule=(max(retry_after, self.initial),),
                cap=self.max_retry_after,
                jitter=(1.0, 1.0 + self.jitter),
                rng=self.rng,
            )
        # "Equal jitter": between half the exponential ceiling and all of it.
        return backoff_delay(
            attempt, initial=self.initial, cap=self.max_delay, jitter=(0.5, 1.0), rng=self.rng
        )
