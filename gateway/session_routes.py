"""What a session has resolved, kept in Redis so its later tasks, on any gateway replica, skip
resolving it again: each block it named (the block as the account may use it) and each graph
it ran (the checked plan: order, parents, children, leaves).

Entries live ``ttl`` seconds from when they were written (``CONDUIT_GATEWAY_ROUTE_TTL``): a
block deleted, or a grant revoked, is seen by a session at most that late, as the catalog
cache of every process sees it at most ``cache_ttl`` late. The keys carry the session's hash
tag (``tracker.gateway_keys.session_keys``): one hash per session, a field per entry; a Redis that
cannot be reached costs a resolution, never the task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from datetime import datetime
from typing import Any

import orjson
from redis.asyncio import Redis

from blocks.blocks import BlockInfo
from core.transient import TRANSIENT
from tracker.gateway_keys import session_keys

log = logging.getLogger(__name__)


class SessionRoutes:
    def __init__(self, redis: Redis, ttl: int) -> None:
        self.redis = redis
        self.ttl = ttl

    async def _get(self, account_id: int, session_id: str, field: str) -> Any:
        try:
            raw = await self.redis.hget(session_keys(account_id, session_id).route, field)
        except TRANSIENT as error:
            log.warning("session route cache unreachable: %r", error)
            return None
        return orjson.loads(raw) if raw is not None else None

    async def _put(self, account_id: int, session_id: str, field: str, value: Any) -> None:
        key = session_keys(account_id, session_id).route
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hset(key, field, orjson.dumps(value))
                # The hash lives as long as its newest entry.
                pipe.expire(key, self.ttl)
                await pipe.execute()
        except TRANSIENT as error:
            log.warning("session route cache unreachable: %r", error)

    async def block(self, account_id: int, session_id: str, block_id: str) -> BlockInfo | None:
        found = await self._get(account_id, session_id, f"block:{block_id}")
        if found is None:
            return None
        found["created_at"] = datetime.fromisoformat(found["created_at"])
        return BlockInfo(**found)

    async def keep_block(self, account_id: int, session_id: str, block: BlockInfo) -> None:
        await self._put(account_id, session_id, f"block:{block.id}", dataclasses.asdict(block))

    async def search(self, account_id: int, session_id: str, digest: str) -> Any:
        """What a search (its query's digest) chose for the session: ``{block_id,
        cluster_id, url}``."""
        return await self._get(account_id, session_id, f"search:{digest}")

    async def keep_search(
        self, account_id: int, session_id: str, digest: str, chosen: dict[str, str]
    ) -> None:
        await self._put(account_id, session_id, f"search:{digest}", chosen)

    async def graph(self, account_id: int, session_id: str, digest: str) -> Any:
        return await self._get(account_id, session_id, f"graph:{digest}")

    async def keep_graph(
        self, account_id: int, session_id: str, digest: str, skeleton: dict[str, Any]
    ) -> None:
        await self._put(account_id, session_id, f"graph:{digest}", skeleton)


def graph_digest(output_ptr: Any, head: str) -> str:
    """The same graph with the same head, however its JSON was spelled."""
    canonical = orjson.dumps([head, output_ptr], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()
