"""What every Redis-backed limit shares: its script's clock, failing open, whole-second waits.

A limit is one Lua script called with its keys and ``ARGV[1]`` the instant to count at (µs):
empty for Redis's own clock (``TIME``, the one clock every replica shares, so theirs never need
to agree), or a test's. :data:`CLOCK` is the script's first lines and leaves it in ``now``.

Redis unreachable: the limit lets the request through (fails open) and logs a warning once per
outage, and once when it applies again. A limit must not turn a short Redis outage into an
outage of its own, and what it guards needs Redis anyway, which answers for itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

SECOND_US = 1_000_000

#: The script's first lines: ``now`` (µs), ``ARGV[1]`` or Redis's clock.
CLOCK = """
local now = tonumber(ARGV[1])
if not now then
  local clock = redis.call('TIME')
  now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
end
"""

#: What a script's arguments may be.
Arg = str | int | float | bytes


def whole_seconds(seconds: float) -> int:
    """A wait as ``Retry-After`` says it: whole seconds, rounded up, at least one."""
    return max(1, math.ceil(seconds))


class LimitScript:
    """One limit's script on one Redis (``body`` follows :data:`CLOCK`), failing open.

    ``log`` and ``what`` name the limit in its outage warnings (``"<what> not applied (Redis
    unavailable)"``, ``"<what> applied again"``); ``clock``: µs to count at instead of Redis's
    clock (tests of the arithmetic).
    """

    def __init__(
        self,
        redis: Redis,
        body: str,
        log: logging.Logger,
        what: str,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._script = redis.register_script(CLOCK + body)
        self.log = log
        self.what = what
        self.clock = clock
        #: Redis was away at the last call (its warning logged).
        self.failing = False

    async def call(self, keys: Sequence[str], args: Sequence[Arg], at: str | None = None) -> Any:
        """The script's reply; counted at ``at`` (µs, as an earlier reply gave it) if given.
        Redis's errors are raised."""
        now = at if at is not None else (str(self.clock()) if self.clock else "")
        return await self._script(keys=list(keys), args=[now, *args])

    async def guarded(self, keys: Sequence[str], args: Sequence[Arg]) -> Any | None:
        """The script's reply, or None while Redis is away (the request goes through)."""
        try:
            reply = await self.call(keys, args)
        except (RedisError, OSError) as error:
            if not self.failing:
                self.log.warning("%s not applied (Redis unavailable): %r", self.what, error)
            self.failing = True
            return None
        if self.failing:
            self.log.info("%s applied again", self.what)
            self.failing = False
        return reply
