"""Who a bearer token is: the one rule the api and the gateway check tokens by, built so that
made-up tokens cannot be used as a lever.

Every token a process has not seen costs a Postgres query, so a client sending made-up tokens
could load the database and, if unknown tokens shared the cache with valid ones, push the valid
ones out. Hence, in this order, and before any query:

1. A token this process verified within ``cache_ttl`` is served from memory; a valid token is
   never refused for its address's failures.
2. An address over its budget of failed authentications (``20/min`` with a burst of ``20`` by
   default: the one limiter's rate, :mod:`tracker.limits.gcra`) is refused with the seconds
   until it may try again (:class:`TooManyFailures`: the api's 429 ``rate_limited`` with
   ``Retry-After``, the gateway's ``RESOURCE_EXHAUSTED`` with ``retry-after``).
3. A token that cannot be one by its shape (not ``r8_`` + 40 URL-safe characters, what
   :func:`core.ids.new_api_token` makes) is refused (:class:`Refused`).
4. A token refused within ``cache_ttl`` is refused again from a bounded LRU of unknown tokens,
   kept apart from the valid ones: a flood of them evicts only its own kind.
5. Otherwise Postgres is asked (one query per token however many requests wait for it).

Failures (2 to 5, and an inactive account's token) spend the address's budget; a query is
paid for before it is made and refunded when the token is good, so concurrent requests cannot
get more queries than the budget holds (requests joining a query under way add none and pay
only if the token is refused). Each door says what the address is (:func:`address_key`: IPv6
clients are counted per /64, the block one host usually holds); the budget is per process,
in its memory: it is asked before every query, and checking and spending it with no await
between them is what keeps concurrent requests within it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from catalog.records import AccountInfo
from tracker.limits.gcra import LocalGcra

#: What :func:`core.ids.new_api_token` makes: ``r8_`` and 30 random bytes, URL-safe base64.
TOKEN_SHAPE = re.compile(r"r8_[A-Za-z0-9_-]{40}")
#: Fraction of a valid token's life at the end of which it is re-checked in the background.
_REFRESH_AHEAD = 0.2
#: Client addresses whose budgets are remembered; the least recently failing are forgotten.
MAX_ADDRESSES = 100_000


class Refused(Exception):
    """No token (``missing``), or one that names no active account."""

    def __init__(self, missing: bool = False) -> None:
        self.missing = missing
        super().__init__("no bearer token" if missing else "the bearer token is not valid")


class TooManyFailures(Exception):
    """The address is past its budget of failed authentications; ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(f"too many failed authentications; retry after {retry_after} s")


def well_formed(token: str) -> bool:
    return TOKEN_SHAPE.fullmatch(token) is not None


def address_key(host: str) -> str:
    """What a client address counts as: itself, or for IPv6 its /64 (the block one host
    usually holds); an IPv4-mapped IPv6 address is its IPv4 address."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailureBudget(LocalGcra):
    """A budget per address, spent only by failed authentications: ``per_minute`` on average,
    ``burst`` at once (the one limiter's rule, :class:`tracker.limits.gcra.LocalGcra`, kept in
    this process: it answers before any query, with no round trip to make)."""

    def __init__(
        self,
        per_minute: float,
        burst: int,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(60.0 / per_minute, burst, max_addresses, clock)


class AccountCache:
    """Token -> account: valid tokens and unknown ones in separate, separately bounded maps.

    Concurrent lookups of one token share one query. A valid token in the last fifth of its
    life is re-checked in the background while still served, so a busy api never stalls on
    the expiry and a revoked token stops working within ``ttl``.
    """

    def __init__(
        self,
        load: Callable[[str], Awaitable[AccountInfo | None]],
        ttl: float,
        max_unknown: int,
        max_known: int = 100_000,
    ) -> None:
        self._load = load
        self.ttl = ttl
        self.max_unknown = max_unknown
        self.max_known = max_known
        self._known: dict[str, tuple[float, AccountInfo]] = {}
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._loading: dict[str, asyncio.Task[AccountInfo | None]] = {}

    def known(self, token: str) -> AccountInfo | None:
        """The account of a token verified within ``ttl``; no query."""
        now = time.monotonic()
        hit = self._known.get(token)
        if hit is None or hit[0] <= now:
            return None
        if hit[0] - now < self.ttl * _REFRESH_AHEAD and token not in self._loading:
            self._start(token)
        return hit[1]

    def unknown(self, token: str) -> bool:
        """Whether the token was refused within ``ttl``; no query."""
        expires = self._unknown.get(token)
        if expires is None:
            return False
        if expires <= time.monotonic():
            del self._unknown[token]
            return False
        self._unknown.move_to_end(token)
        return True

    def loading(self, token: str) -> bool:
        """Whether a query for this token is already under way (joining it costs none)."""
        return token in self._loading

    async def lookup(self, token: str) -> AccountInfo | None:
        """Ask Postgres (once for all concurrent askers) and remember the answer."""
        task = self._loading.get(token) or self._start(token)
        return await asyncio.shield(task)

    def _start(self, token: str) -> asyncio.Task[AccountInfo | None]:
        async def run() -> AccountInfo | None:
            try:
                account = await self._load(token)
            finally:
                del self._loading[token]
            self._remember(token, account)
            return account

        task = asyncio.create_task(run())
        self._loading[token] = task
        # A background re-check that fails is retried by the next request; its error must not
        # be reported as never retrieved.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    def _remember(self, token: str, account: AccountInfo | None) -> None:
        expires = time.monotonic() + self.ttl
        if account is None:
            self._known.pop(token, None)
            self._unknown[token] = expires
            self._unknown.move_to_end(token)
            while len(self._unknown) > self.max_unknown:
                self._unknown.popitem(last=False)
            return
        self._unknown.pop(token, None)
        self._known.pop(token, None)  # re-inserted last: the oldest is the first to go
        self._known[token] = (expires, account)
        while len(self._known) > self.max_known:
            del self._known[next(iter(self._known))]


class TokenChecks:
    """The account behind a bearer token (see the module's docstring for the order)."""

    def __init__(
        self,
        load: Callable[[str], Awaitable[AccountInfo | None]],
        ttl: float,
        max_unknown: int,
        failures_per_minute: float,
        failure_burst: int,
    ) -> None:
        self.accounts = AccountCache(load, ttl, max_unknown)
        self.failures = FailureBudget(failures_per_minute, failure_burst)

    async def account(self, token: str | None, address: str, presented: bool) -> AccountInfo:
        """The active account of ``token``, sent from ``address`` (``presented``: the request
        carried credentials at all, perhaps not a bearer token: those are a failure too)."""
        if token is None:
            if presented:
                self.failures.spend(address)
            raise Refused(missing=True)
        account = self.accounts.known(token)
        if account is not None and account.active:
            return account
        wait = self.failures.retry_after(address)
        if wait is not None:
            raise TooManyFailures(wait)
        if account is None and well_formed(token) and not self.accounts.unknown(token):
            return await self._query(token, address)
        if account is None or not account.active:
            self.failures.spend(address)
            raise Refused()
        return account

    async def _query(self, token: str, address: str) -> AccountInfo:
        """Ask Postgres about a well-formed token neither cache knows.

        A new query is paid for before it is made and given back when the token proves good:
        requests that all arrive before the first answer would otherwise each get a query past
        the budget. A request joining a query already under way costs nothing up front (it
        adds no query) and pays like any failure if the token is refused: a client's burst of
        requests with one new, valid token is never refused.
        """
        joined = self.accounts.loading(token)
        if not joined:
            self.failures.spend(address)
        try:
            account = await self.accounts.lookup(token)
        except Exception:
            if not joined:
                self.failures.refund(address)
            raise
        if account is not None and account.active:
            if not joined:
                self.failures.refund(address)
            return account
        if joined:
            self.failures.spend(address)
        raise Refused()
