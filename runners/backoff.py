"""The one backoff formula every retry loop in Conduit takes its waits from, and the one list
of what a failed HTTP exchange with a peer (a runner, a webhook receiver) raises.

It lives with the runners because they import nothing of the rest (they ship alone in a GPU
image) while everything else may import them: the runner's webhook sender uses it directly,
the api, directors and tracker through ``tracker.retry``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Final

import aiohttp

#: A peer that cannot be reached, stops answering, or breaks off mid-answer (aiohttp's own
#: errors, its timeouts, and socket errors it lets through). Never a refusal: those are answers.
UNREACHABLE: Final = (aiohttp.ClientError, TimeoutError, OSError)


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
