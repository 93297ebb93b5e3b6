"""Per-process read-through caches for what every request looks up (models, versions, ...).

These change rarely and are read on every create, by the api and by the gateway alike, without
a Postgres round trip per request. A change announced over Redis is seen by the next read in
every process (``catalog.generation``); a short TTL bounds the rest (a revoked grant,
a change whose announcement was lost). (Tokens are cached apart, in ``catalog.token_checks``.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from jsonschema import Draft7Validator
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import lookups, records
from catalog.generation import CatalogGeneration
from tracker.input_checks import build_validator

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Fraction of an entry's life at the end of which it is refreshed in the background.
_REFRESH_AHEAD = 0.2


class TTLCache(Generic[K, V]):
    """Entries live ``ttl`` seconds, or until the catalogue's generation moves on (a ``get``
    given a generation reloads an entry cached under another). Concurrent misses of one key
    share one load, and an entry in the last fifth of its life is refreshed in the background
    while it is still served: a busy server never stalls all its requests on the same expiry."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        #: key → (expires at, value, generation it was loaded under).
        self._entries: dict[K, tuple[float, V, int | None]] = {}
        self._loading: dict[K, tuple[int | None, asyncio.Task[V]]] = {}

    async def get(
        self, key: K, load: Callable[[], Awaitable[V]], generation: int | None = None
    ) -> V:
        """The cached value, or a fresh one; ``generation``: the catalogue's now (None: go by
        the TTL alone)."""
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now and generation in (None, hit[2]):
            if hit[0] - now < self.ttl * _REFRESH_AHEAD and key not in self._loading:
                self._load(key, load, generation)
            return hit[1]
        loading = self._loading.get(key)
        if loading is None or generation not in (None, loading[0]):
            task = self._load(key, load, generation)
        else:
            task = loading[1]
        return await asyncio.shield(task)

    def discard(self, key: K) -> None:
        """Forget ``key`` now (this process changed it): the next get loads it."""
        self._entries.pop(key, None)

    def _load(
        self, key: K, load: Callable[[], Awaitable[V]], generation: int | None
    ) -> asyncio.Task[V]:
        async def run() -> V:
            try:
                value = await load()
            finally:
                if self._loading.get(key, (None, None))[1] is task:
                    del self._loading[key]
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + self.ttl, value, generation)
            return value

        task = asyncio.create_task(run())
        self._loading[key] = (generation, task)
        # A background refresh that fails is retried by the next request; its error must not
        # be reported as never retrieved.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task


class Catalog:
    """Cached views of models, versions (with compiled validators) and deployments.

    Models, versions and deployments are looked up for an account: one it may not see is
    None, exactly as one that does not exist. Entries are shared by every account; what each
    account was granted is cached per account, with the same TTL. With a ``generation``
    (``catalog.generation``) every lookup first reads it, and a change committed by any
    process that announced it (:meth:`changed`) is seen at once.
    """

    def __init__(
        self, engine: AsyncEngine, ttl: float, generation: CatalogGeneration | None = None
    ) -> None:
        self.engine = engine
        self.generation = generation
        self._versions: TTLCache[str, tuple[records.VersionInfo, Draft7Validator | None] | None] = (
            TTLCache(ttl)
        )
        self._models: TTLCache[tuple[str, str], records.ModelInfo | None] = TTLCache(ttl)
        self._deployments: TTLCache[tuple[str, str], records.DeploymentInfo | None] = TTLCache(ttl)
        self._grants: TTLCache[int, records.Grants] = TTLCache(ttl)

    def forget(
        self,
        model: tuple[str, str] | None = None,
        deployment: tuple[str, str] | None = None,
        version: str | None = None,
    ) -> None:
        """Drop what this process just changed, so that its next read is fresh (other
        processes see the change within the TTL, or at once once it is announced:
        :meth:`changed`)."""
        if model is not None:
            self._models.discard(model)
        if deployment is not None:
            self._deployments.discard(deployment)
        if version is not None:
            self._versions.discard(version)

    async def changed(
        self,
        model: tuple[str, str] | None = None,
        deployment: tuple[str, str] | None = None,
        version: str | None = None,
    ) -> None:
        """A change this process committed: forgotten here, and announced to every process."""
        self.forget(model, deployment, version)
        if self.generation is not None:
            await self.generation.bump()

    async def reading(self) -> CatalogReading:
        """Lookups that share one read of the generation: what one request resolves (a
        deployment and its released version, a model and its latest) costs one GET."""
        return CatalogReading(
            self, None if self.generation is None else await self.generation.current()
        )

    async def grants(self, account_id: int) -> records.Grants:
        """The private models and deployments granted to the account; a grant or revoke is
        seen like any other catalogue change."""
        return await (await self.reading()).grants(account_id)

    async def model(
        self, account: records.AccountInfo, owner: str, name: str
    ) -> records.ModelInfo | None:
        return await (await self.reading()).model(account, owner, name)

    async def version(
        self, account: records.AccountInfo, version_id: str
    ) -> tuple[records.VersionInfo, Draft7Validator | None] | None:
        return await (await self.reading()).version(account, version_id)

    async def version_of(
        self, model: records.ModelInfo, version_id: str
    ) -> tuple[records.VersionInfo, Draft7Validator | None] | None:
        return await (await self.reading()).version_of(model, version_id)

    async def deployment(
        self, account: records.AccountInfo, owner: str, name: str
    ) -> records.DeploymentInfo | None:
        return await (await self.reading()).deployment(account, owner, name)

    async def _grants_at(self, account_id: int, generation: int | None) -> records.Grants:
        return await self._grants.get(
            account_id, lambda: lookups.grants_of(self.engine, account_id), generation
        )

    async def _version(
        self, version_id: str, generation: int | None
    ) -> tuple[records.VersionInfo, Draft7Validator | None] | None:
        async def load() -> tuple[records.VersionInfo, Draft7Validator | None] | None:
            info = await lookups.get_version(self.engine, version_id)
            return None if info is None else (info, build_validator(info.openapi_schema))

        return await self._versions.get(version_id, load, generation)

    async def _model(
        self, owner: str, name: str, generation: int | None
    ) -> records.ModelInfo | None:
        return await self._models.get(
            (owner, name), lambda: lookups.get_model(self.engine, owner, name), generation
        )

    async def _deployment(
        self, owner: str, name: str, generation: int | None
    ) -> records.DeploymentInfo | None:
        return await self._deployments.get(
            (owner, name), lambda: lookups.get_deployment(self.engine, owner, name), generation
        )


class CatalogReading:
    """The catalogue's lookups at one generation (:meth:`Catalog.reading`)."""

    def __init__(self, catalog: Catalog, generation: int | None) -> None:
        self.catalog = catalog
        self.generation = generation

    async def grants(self, account_id: int) -> records.Grants:
        return await self.catalog._grants_at(account_id, self.generation)

    async def model(
        self, account: records.AccountInfo, owner: str, name: str
    ) -> records.ModelInfo | None:
        """The model, or None when it does not exist or ``account`` may not see it: the two are
        answered alike, so a private name is no oracle."""
        model = await self.catalog._model(owner, name, self.generation)
        if model is None:
            return None
        return model if await self._sees(account, model, "model") else None

    async def version(
        self, account: records.AccountInfo, version_id: str
    ) -> tuple[records.VersionInfo, Draft7Validator | None] | None:
        """A version (with its validator) of a model ``account`` sees, else None."""
        found = await self.catalog._version(version_id, self.generation)
        if found is None:
            return None
        owner, _, name = found[0].model.partition("/")
        seen = await self.model(account, owner, name)
        return found if seen is not None else None

    async def version_of(
        self, model: records.ModelInfo, version_id: str
    ) -> tuple[records.VersionInfo, Draft7Validator | None] | None:
        """A version of ``model``, which the caller has already found visible (a model page
        read from the database): checking again against cached grants could disagree with
        that read for up to a TTL and refuse a model the same answer lists."""
        found = await self.catalog._version(version_id, self.generation)
        if found is None or found[0].model != f"{model.owner}/{model.name}":
            return None
        return found

    async def deployment(
        self, account: records.AccountInfo, owner: str, name: str
    ) -> records.DeploymentInfo | None:
        """The deployment, or None when it does not exist or ``account`` may not see it."""
        deployment = await self.catalog._deployment(owner, name, self.generation)
        if deployment is None:
            return None
        return deployment if await self._sees(account, deployment, "deployment") else None

    async def released_version(
        self, deployment: records.DeploymentInfo
    ) -> tuple[records.VersionInfo, Draft7Validator | None] | None:
        """The version a deployment runs: whoever may use the deployment may run it, whether
        or not it sees the model."""
        return await self.catalog._version(deployment.version_id, self.generation)

    async def _sees(
        self,
        account: records.AccountInfo,
        thing: records.ModelInfo | records.DeploymentInfo,
        kind: records.Kind,
    ) -> bool:
        if records.sees(account, thing.owner, thing.visibility, granted=False):
            return True  # public or its own: no grants to read
        grants = await self.grants(account.id)
        return thing.id in (grants.models if kind == "model" else grants.deployments)
