"""The one backoff formula every retry loop in Conduit takes its waits from, and the one way
a peer's ``Retry-After`` becomes a wait.

Each caller brings its own numbers: the director's read loop and its start retries, the
event hub's reader, ``core.transient.persistently``, the terminal webhook schedule, the
runner's own webhook retries, the model pool's load cool-down and the lane's ejections.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field


def backoff_delay(
    attempt: int,
    *,
    initial: float = 0.0,
    cap: float = math.inf,
    schedule: Sequence[float] = (),
    jitter: tuple[float, float] = (1.0, 1.0),
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry ``attempt`` (0: the first retry).

    The base is ``schedule[attempt]`` when a schedule is given (its last step repeats past its
    end), otherwise ``initial`` doubled per attempt; at most ``cap``. It is then multiplied by a
    uniform draw from ``jitter``: ``(1, 1)`` none, ``(0.5, 1)`` "equal jitter" (never more than
    the base), ``(1, 1.2)`` only ever longer, ``(0.8, 1.2)`` either way.
    """
    if schedule:
        base = schedule[min(attempt, len(schedule) - 1)]
    else:
        base = initial * 2.0 ** min(attempt, 64)
    base = min(base, cap)
    low, high = jitter
    if low == high:
        return base * low
    draw = rng.uniform if rng is not None else random.uniform
    return base * draw(low, high)


@dataclass(frozen=True, slots=True)
class StartBackoff:
    """How long to wait before offering work again to a runner that refused it.

    A runner that says ``Retry-After`` is taken at its word: the wait is that long (capped, so
    one absurd header cannot park a worker) plus a little jitter, never less, so that workers
    refused at the same moment do not come back in lockstep. A runner that says nothing gets
    exponential backoff with jitter.
    """

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
