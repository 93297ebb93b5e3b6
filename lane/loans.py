"""Permits shared through Redis: a runner with fewer permits than there are api replicas is not
sliced (:mod:`lane.slices`); a replica whose request finds no free permit borrows one of its
shared permits here, and gives it back when no request of its own holds it any more.

Each runner's loans are a hash, replica id → permits borrowed (``tracker.keys.lane_loans_key``),
beside the lane's membership (one hash tag: one script, one slot). A borrow counts the loans of
live members only, dropping those of replicas the membership no longer lists (a replica that
died gives its loans back ``lane_member_ttl`` later), and takes one when fewer than the
runner's shared permits are out: the replicas together never hold more than the runner's
concurrency. A request that borrows nothing (Redis away, all lent) is refused at once, as it
was before: it costs one round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from redis.asyncio import Redis

from core.transient import TRANSIENT
from lane.events import Repay
from tracker.keys import LANE_MEMBERS, lane_loans_key

log = logging.getLogger(__name__)

# KEYS[1]: the members; KEYS[2..]: each candidate runner's loans. ARGV[1]: this replica,
# ARGV[2]: the oldest live heartbeat (ms), ARGV[3..]: each candidate's shared permits. Borrows
# one permit of the first candidate with one left; returns its index (1-based) or 0.
_BORROW_SCRIPT = """
local cutoff = tonumber(ARGV[2])
for i = 2, #KEYS do
  local held = redis.call('HGETALL', KEYS[i])
  local out = 0
  for j = 1, #held, 2 do
    local score = redis.call('ZSCORE', KEYS[1], held[j])
    if held[j] ~= ARGV[1] and (not score or tonumber(score) < cutoff) then
      redis.call('HDEL', KEYS[i], held[j])
    else
      out = out + tonumber(held[j + 1])
    end
  end
  if out < tonumber(ARGV[i + 1]) then
    redis.call('HINCRBY', KEYS[i], ARGV[1], 1)
    return i - 1
  end
end
return 0
"""

# KEYS[1]: a runner's loans; ARGV[1]: this replica. One permit back.
_REPAY_SCRIPT = """
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""


class Loans:
    def __init__(self, redis: Redis, me: str, member_ttl: float) -> None:
        self.redis = redis
        self.me = me
        self.member_ttl = member_ttl
        self._borrow = redis.register_script(_BORROW_SCRIPT)
        self._repay = redis.register_script(_REPAY_SCRIPT)
        self._repays: set[asyncio.Task[None]] = set()

    async def borrow(self, runners: Sequence[tuple[str, int]]) -> str | None:
        """Borrow one permit of the first of ``runners`` (``(runner id, shared permits)``)
        with one left; its id, or None (none left, or Redis away)."""
        if not runners:
            return None
        cutoff = round(time.time() * 1000) - round(self.member_ttl * 1000)
        keys = [LANE_MEMBERS, *(lane_loans_key(runner) for runner, _ in runners)]
        try:
            index = int(
                await self._borrow(
                    keys=keys, args=[self.me, cutoff, *(shared for _, shared in runners)]
                )
            )
        except TRANSIENT as error:
            log.info("lane: no permit borrowed, Redis is away: %r", error)
            return None
        return runners[index - 1][0] if index else None

    def repay(self, repay: Repay) -> None:
        """Give the permit back, in the background (the core already counts it returned)."""
        task = asyncio.get_running_loop().create_task(self._give_back(repay.runner_id))
        self._repays.add(task)
        task.add_done_callback(self._repays.discard)

    async def _give_back(self, runner_id: str) -> None:
        try:
            await self._repay(keys=[lane_loans_key(runner_id)], args=[self.me])
        except TRANSIENT as error:  # the membership's pruning gives it back later
            log.info("lane: borrowed permit of %s not given back: %r", runner_id, error)

    async def settled(self) -> None:
        """Wait until the permits given back so far are back in Redis: a replica's answer
        then never races its own give-back (the client's next call may go to another)."""
        if self._repays:
            await asyncio.gather(*list(self._repays), return_exceptions=True)
