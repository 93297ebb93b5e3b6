"""Who a call is: the bearer token of its ``authorization`` metadata, as the api reads it.

``authorization: Bearer r8_...`` names an account through the catalog's token lookup. Answers
(an account, or none) are remembered for ``token_cache_ttl`` seconds in a bounded map, and
concurrent calls with one new token share one query. A token that cannot be one by its shape
costs no query. Missing, unknown, or an inactive account's: ``UNAUTHENTICATED``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from gateway.errors import Unauthenticated
from tracker.catalog import AccountInfo

#: What ``core.ids.new_api_token`` makes: ``r8_`` and 30 random bytes, URL-safe base64.
TOKEN_SHAPE = re.compile(r"r8_[A-Za-z0-9_-]{40}")
MISSING = "a bearer token is required (metadata `authorization: Bearer <token>`)"
REFUSED = "the bearer token is not valid"


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of the call's ``authorization: Bearer <token>``; None without one."""
    for key, value in metadata or ():
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


class TokenAuth:
    def __init__(
        self,
        load: Callable[[str], Awaitable[AccountInfo | None]],
        ttl: float,
        max_cached: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self.ttl = ttl
        self.max_cached = max_cached
        self._clock = clock
        #: token -> (expires, account or None); the oldest answer first.
        self._cache: OrderedDict[str, tuple[float, AccountInfo | None]] = OrderedDict()
        self._loading: dict[str, asyncio.Task[AccountInfo | None]] = {}

    async def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> AccountInfo:
        """The call's account, from its metadata (what :class:`gateway.admission.Admission`
        calls before the call's message is read)."""
        return await self.account(context.invocation_metadata())

    async def account(self, metadata: Iterable[tuple[str, Any]] | None) -> AccountInfo:
        token = bearer_token(metadata)
        if token is None:
            raise Unauthenticated(MISSING, "authorization")
        if TOKEN_SHAPE.fullmatch(token) is None:
            raise Unauthenticated(REFUSED, "authorization")
        account = await self._lookup(token)
        if account is None or not account.active:
            raise Unauthenticated(REFUSED, "authorization")
        return account

    async def _lookup(self, token: str) -> AccountInfo | None:
        hit = self._cache.get(token)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        task = self._loading.get(token)
        if task is None:
            task = asyncio.create_task(self._query(token))
            self._loading[token] = task
            # Its callers may all be gone when it fails: its error is not "never retrieved".
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return await asyncio.shield(task)

    async def _query(self, token: str) -> AccountInfo | None:
        try:
            account = await self._load(token)
        finally:
            del self._loading[token]
        self._cache.pop(token, None)
        self._cache[token] = (self._clock() + self.ttl, account)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return account
