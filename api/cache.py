"""Per-process read-through caches for what every request looks up (tokens, versions, ...).

These change rarely and are read on every create; a short TTL keeps a revoked token or a new
release visible within seconds without a Postgres round trip per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from jsonschema import Draft7Validator
from sqlalchemy.ext.asyncio import AsyncEngine

from api.validation import build_validator
from tracker import catalog

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Fraction of an entry's life at the end of which it is refreshed in the background.
_REFRESH_AHEAD = 0.2


class TTLCache(Generic[K, V]):
    """Entries live ``ttl`` seconds. Concurrent misses of one key share one load, and an entry
    in the last fifth of its life is refreshed in the background while it is still served: a
    busy api never stalls all its requests on the same expiry."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            if hit[0] - now < self.ttl * _REFRESH_AHEAD and key not in self._loading:
                self._load(key, load)
            return hit[1]
        loading = self._loading.get(key) or self._load(key, load)
        return await asyncio.shield(loading)

    def _load(self, key: K, load: Callable[[], Awaitable[V]]) -> asyncio.Task[V]:
        async def run() -> V:
            try:
                value = await load()
            finally:
                del self._loading[key]
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + self.ttl, value)
            return value

        task = asyncio.create_task(run())
        self._loading[key] = task
        # A background refresh that fails is retried by the next request; its error must not
        # be reported as never retrieved.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task


class Catalog:
    """Cached views of accounts, models, versions (with compiled validators) and deployments."""

    def __init__(self, engine: AsyncEngine, ttl: float) -> None:
        self.engine = engine
        self._accounts: TTLCache[str, catalog.AccountInfo | None] = TTLCache(ttl)
        self._versions: TTLCache[str, tuple[catalog.VersionInfo, Draft7Validator | None] | None] = (
            TTLCache(ttl)
        )
        self._models: TTLCache[tuple[str, str], catalog.ModelInfo | None] = TTLCache(ttl)
        self._deployments: TTLCache[tuple[str, str], catalog.DeploymentInfo | None] = TTLCache(ttl)

    async def account(self, token: str) -> catalog.AccountInfo | None:
        return await self._accounts.get(
            token, lambda: catalog.account_for_token(self.engine, token)
        )

    async def version(
        self, version_id: str
    ) -> tuple[catalog.VersionInfo, Draft7Validator | None] | None:
        async def load() -> tuple[catalog.VersionInfo, Draft7Validator | None] | None:
            info = await catalog.get_version(self.engine, version_id)
            return None if info is None else (info, build_validator(info.openapi_schema))

        return await self._versions.get(version_id, load)

    async def model(self, owner: str, name: str) -> catalog.ModelInfo | None:
        return await self._models.get(
            (owner, name), lambda: catalog.get_model(self.engine, owner, name)
        )

    async def deployment(self, owner: str, name: str) -> catalog.DeploymentInfo | None:
        return await self._deployments.get(
            (owner, name), lambda: catalog.get_deployment(self.engine, owner, name)
        )
