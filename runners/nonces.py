"""Where an operation token verifier (:mod:`runners.optokens`) remembers the nonces it accepted,
so that a token is accepted once: this process's memory, or Redis shared by every replica.
"""

from __future__ import annotations

import heapq
import math
from datetime import datetime
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from runners.control_errors import NonceStoreUnavailableError

NONCE_KEY_PREFIX = "optoken:nonce:"


class NonceStore(Protocol):
    """Remembers accepted nonces until they expire.

    ``add`` must check and record in one atomic step.
    """

    async def add(self, nonce: str, expires_at: datetime, now: datetime) -> bool:
        """Record ``nonce`` until ``expires_at``; False if it is already recorded. Raises
        :class:`NonceStoreUnavailableError` when the store cannot say."""
        ...

    async def aclose(self) -> None: ...


class MemoryNonceStore:
    """A :class:`NonceStore` in this process's memory.

    Only correct while one process verifies tokens for a runner: several worker processes, or
    several replicas behind one address, each keep their own memory and would each accept the
    same token once. They need a shared store instead. Entries are dropped once expired, so
    memory is bounded by the tokens accepted within one validity window. Not thread-safe: call it
    from one event loop.
    """

    def __init__(self) -> None:
        self._expiry: dict[str, datetime] = {}
        self._heap: list[tuple[datetime, str]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    async def add(self, nonce: str, expires_at: datetime, now: datetime) -> bool:
        self.forget_expired(now)
        if nonce in self._expiry:
            return False
        self._expiry[nonce] = expires_at
        heapq.heappush(self._heap, (expires_at, nonce))
        return True

    def forget_expired(self, now: datetime) -> None:
        while self._heap and self._heap[0][0] <= now:
            _, nonce = heapq.heappop(self._heap)
            del self._expiry[nonce]

    async def aclose(self) -> None:
        pass


def nonce_key(nonce: str) -> str:
    """The Redis key that records an accepted nonce."""
    return NONCE_KEY_PREFIX + nonce


class RedisNonceStore:
    """A :class:`NonceStore` in Redis, shared by every verifier that uses it: ``SET key 1 NX
    PXAT <expiry>`` checks and records in one step, and Redis forgets the nonce once no token
    carrying it could be accepted any more."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    @classmethod
    def from_url(cls, url: str) -> RedisNonceStore:
        """From a ``redis://`` or ``rediss://`` URL; connects on first use. Short timeouts: a
        lifecycle call waits on it."""
        return cls(Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5))

    async def add(self, nonce: str, expires_at: datetime, now: datetime) -> bool:
        expiry_ms = math.ceil(expires_at.timestamp() * 1000)
        try:
            created = await self._redis.set(nonce_key(nonce), b"1", nx=True, pxat=expiry_ms)
        except (RedisError, OSError) as error:
            raise NonceStoreUnavailableError() from error
        return bool(created)

    async def aclose(self) -> None:
        await self._redis.aclose()
