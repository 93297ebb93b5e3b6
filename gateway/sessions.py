"""Sessions: ``(session_id, seq_no)`` names one task of an account, across gateway replicas.

- **Replay.** A task's answer (the serialised ``AIOSPacket``) is kept ``session_ttl`` seconds
  after the session's latest task. The same pair again gets that answer back and runs nothing.
  A task that failed keeps no answer: asking again runs it again.
- **Once at a time.** The replica that runs a task holds its claim (``SET NX`` with the
  call's deadline as expiry, so a replica that dies frees it); a second call of the same pair
  waits for the first one's answer (or, if the first failed, claims and runs it itself).
- **Order.** Tasks of one session that are running at once run in ``seq_no`` order: a task
  waits until no task of a lower ``seq_no`` holds a claim. A task whose predecessors never
  came is not held back (an in-order stream need not be gap-free, and a lost one must not
  stall its session).

Every key of a session carries one hash tag (``tracker.gateway_keys.session_keys``), so each script
names one slot and sessions spread over a Redis Cluster. A task without a ``session_id`` is
none of this: it simply runs. Waiting is a poll with backoff (``POLL_*``, doubling by
:func:`core.backoff.backoff_delay`), bounded by the call's deadline.

``seq_no`` is ordered as a double in the sorted set: exact up to 2**53.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from core.backoff import backoff_delay
from gateway.errors import FailedPrecondition
from gateway.task import session_id_of
from tracker.gateway_keys import SessionKeys, session_keys

POLL_FIRST = 0.005
POLL_MAX = 0.1
#: What is kept instead of an answer larger than ``max_answer_bytes``: the pair still ran
#: once, and asking again says so instead of running it twice.
TOO_LARGE = b"\x00too-large"

# KEYS: answers, claim, inflight. ARGV: seq_no, token, claim ms, session ttl s.
# Returns {1, answer} when answered, {2} when claimed now, {3} when another holds the claim.
_CLAIM = """
local answer = redis.call('HGET', KEYS[1], ARGV[1])
if answer then return {1, answer} end
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
  redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return {2}
end
return {3}
"""

# KEYS: answers, claim, inflight. ARGV: seq_no, token, answer ('' to keep none), session ttl.
_FINISH = """
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""

# KEYS: inflight. ARGV: seq_no, the claim keys' prefix. How many lower seq_nos still hold a
# claim (entries whose claim expired, their replica gone, are dropped).
_EARLIER = """
local earlier = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1])
local live = 0
for _, seq in ipairs(earlier) do
  if redis.call('EXISTS', ARGV[2] .. 'claim:' .. seq) == 1 then
    live = live + 1
  else
    redis.call('ZREM', KEYS[1], seq)
  end
end
return live
"""


class Sessions:
    def __init__(self, redis: Redis, ttl: int, max_answer_bytes: int) -> None:
        self.redis = redis
        self.ttl = ttl
        self.max_answer_bytes = max_answer_bytes
        self._claim = redis.register_script(_CLAIM)
        self._finish = redis.register_script(_FINISH)
        self._earlier = redis.register_script(_EARLIER)

    async def run_once(
        self,
        account_id: int,
        session_id: str,
        seq_no: int,
        deadline: float,
        run: Callable[[], Awaitable[bytes]],
    ) -> bytes:
        """The answer of ``(session_id, seq_no)``: the stored one, or ``run()``'s (stored)."""
        if not session_id:
            return await run()
        session_id_of(session_id)
        keys = session_keys(account_id, session_id)
        token = secrets.token_hex(8)
        polls = 0
        while True:
            claim_ms = max(1, int((deadline - time.monotonic()) * 1000)) + 1000
            reply = await self._claim(
                keys=[keys.answers, keys.claim(seq_no), keys.inflight],
                args=[seq_no, token, claim_ms, self.ttl],
            )
            if int(reply[0]) == 1:
                return _answered(reply[1], session_id, seq_no)
            if int(reply[0]) == 2:
                break
            await asyncio.sleep(_poll(polls))  # another call of the pair runs it: wait for it
            polls += 1
        answer = b""
        try:
            await self._wait_for_earlier(keys, seq_no)
            answer = await run()
            return answer
        finally:
            kept = answer if len(answer) <= self.max_answer_bytes else TOO_LARGE
            # Shielded: a call canceled here still frees its claim at once.
            await asyncio.shield(
                self._finish(
                    keys=[keys.answers, keys.claim(seq_no), keys.inflight],
                    args=[seq_no, token, kept if answer else b"", self.ttl],
                )
            )

    async def _wait_for_earlier(self, keys: SessionKeys, seq_no: int) -> None:
        polls = 0
        while int(await self._earlier(keys=[keys.inflight], args=[seq_no, keys.prefix])):
            await asyncio.sleep(_poll(polls))
            polls += 1


def _poll(attempt: int) -> float:
    """Seconds before poll ``attempt + 1``: ``POLL_FIRST`` doubled per poll, at most
    ``POLL_MAX``."""
    return backoff_delay(attempt, initial=POLL_FIRST, cap=POLL_MAX)


def _answered(stored: Any, session_id: str, seq_no: int) -> bytes:
    answer = bytes(stored)
    if answer == TOO_LARGE:
        raise FailedPrecondition(
            f"task {seq_no} of session {session_id!r} ran; its answer was too large to keep "
            "for replay"
        )
    return answer
