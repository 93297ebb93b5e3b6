"""Who a request is: its bearer token checked by the rule the api shares with the gateway
(:mod:`catalog.token_checks`: verified tokens from memory, a failed-auth budget per client
address, made-up tokens refused by their shape or from their own bounded cache before any
query), answered here in HTTP: a refusal is 401, an address past its budget 429
``rate_limited`` with ``Retry-After``.

The address is the connection's peer, or what ``X-Forwarded-For`` says when the peer is a
configured trusted proxy (``trusted_proxies``; the server applies it, see
``conduit.commands.cmd_api``).

Stream URLs carry their own credential (``tracker.stream_urls``): :func:`stream_capability`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn

from fastapi import Request

from api.errors import Forbidden, RateLimited, Unauthenticated
from api.settings import ApiSettings
from catalog.records import AccountInfo
from catalog.token_checks import Refused, TokenChecks, TooManyFailures, address_key
from tracker.stream_urls import Signature, StreamSigner


def bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def client_address(request: Request) -> str:
    """The address failures are counted against (an IPv6 address stands for its /64)."""
    return address_key(request.client.host if request.client else "")


class Authenticator:
    """The account behind a request's bearer token."""

    def __init__(
        self, load: Callable[[str], Awaitable[AccountInfo | None]], settings: ApiSettings
    ) -> None:
        self.tokens = TokenChecks(
            load,
            settings.cache_ttl,
            settings.unknown_tokens_cached,
            settings.auth_failures_per_minute,
            settings.auth_failure_burst,
        )
        #: The per-address budget of failed authentications (``/ops`` sign-ins spend it too).
        self.failures = self.tokens.failures

    async def account(self, request: Request) -> AccountInfo:
        presented = "authorization" in request.headers
        try:
            return await self.tokens.account(
                bearer_token(request), client_address(request), presented
            )
        except TooManyFailures as refused:
            raise RateLimited(
                "Too many failed authentications from your address; retry after Retry-After.",
                retry_after=refused.retry_after,
            ) from None
        except Refused:
            raise Unauthenticated() from None


async def stream_capability(
    signer: StreamSigner, prediction_id: str, exp: str | None, sig: str | None
) -> Signature | None:
    """What the stream URL's ``exp``/``sig`` are worth for this prediction; None without them.

    Checking costs no query: an HMAC cannot be guessed, so refusals spend no address's budget.
    """
    if exp is None and sig is None:
        return None
    return await signer.check(prediction_id, exp, sig)


def refuse_capability(verdict: Signature) -> NoReturn:
    """A signature no key made is 401 ``invalid_signature``; a genuine one past its expiry is
    403 ``expired_signature`` (the link was good: fetching the prediction gives a fresh one)."""
    if verdict is Signature.EXPIRED:
        raise Forbidden(
            "This stream URL has expired; fetch the prediction again for a fresh one.",
            code="expired_signature",
        )
    raise Unauthenticated(
        "This stream URL's signature is not valid for this prediction.",
        code="invalid_signature",
    )
