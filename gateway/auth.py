"""Who a call is: the bearer token of its ``authorization`` metadata, checked by the rule the
gateway shares with the api (:mod:`catalog.token_checks`).

``authorization: Bearer r8_...`` names an account through the catalog's token lookup. Verified
tokens are served from memory; made-up ones are refused by their shape, or from a bounded
cache of unknown tokens kept apart from the valid ones, and each failure spends the caller's
address's budget (``auth_failures_per_minute``, ``auth_failure_burst``): past it a call is
``RESOURCE_EXHAUSTED`` with ``retry-after`` in its trailing metadata and costs no query.
Missing, unknown, or an inactive account's: ``UNAUTHENTICATED``. The address is the call's
peer (an IPv6 peer counts as its /64).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from catalog.records import AccountInfo
from catalog.token_checks import Refused, TokenChecks, TooManyFailures, address_key
from gateway.errors import ResourceExhausted, Unauthenticated

MISSING = "a bearer token is required (metadata `authorization: Bearer <token>`)"
REFUSED = "the bearer token is not valid"


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> tuple[str | None, bool]:
    """The token of the call's ``authorization: Bearer <token>`` (None without one), and
    whether the call carried ``authorization`` at all."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            if not isinstance(value, str):
                return None, True
            scheme, _, token = value.partition(" ")
            token = token.strip()
            return (token if scheme.lower() == "bearer" and token else None), True
    return None, False


def peer_address(peer: str) -> str:
    """What a call's peer (``ipv4:10.0.0.1:5000``, ``ipv6:[::1]:5000``) counts as."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return address_key(rest.rpartition(":")[0])
    if kind == "ipv6":
        return address_key(rest.rpartition(":")[0].strip("[]"))
    return address_key(peer)


class TokenAuth:
    """A call's account, by the api's rule (:class:`catalog.token_checks.TokenChecks`), its
    refusals said as gRPC says them."""

    def __init__(self, tokens: TokenChecks) -> None:
        self.tokens = tokens

    async def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> AccountInfo:
        """The call's account, from its metadata and peer (what
        :class:`gateway.admission.Admission` calls before the call's message is read)."""
        return await self.account(context.invocation_metadata(), context.peer())

    async def account(
        self, metadata: Iterable[tuple[str, Any]] | None, peer: str = ""
    ) -> AccountInfo:
        token, presented = bearer_token(metadata)
        try:
            return await self.tokens.account(token, peer_address(peer), presented)
        except TooManyFailures as refused:
            raise ResourceExhausted(
                "too many failed authentications from your address; retry after "
                f"{refused.retry_after} s",
                "authorization",
                trailing=(("retry-after", str(refused.retry_after)),),
            ) from None
        except Refused as refused:
            message = MISSING if refused.missing else REFUSED
            raise Unauthenticated(message, "authorization") from None
