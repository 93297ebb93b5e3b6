"""Who may call a runner (DESIGN §8): the runner token, and nothing else for the internal calls.

With ``CONDUIT_RUNNER_TOKEN`` set, every request but the health checks (``GET /health-check``
and ``GET /health``, so probes need no secret) must carry ``Authorization: Bearer <token>``,
compared in constant time; anything else is 401. Operation tokens stay an additional check on
the lifecycle calls (:mod:`runners.control`).

Some calls are internal: only the runner's own director may stop the runner, cancel a
prediction or take one over (an attach, ``If-Match: *``, or a ``PUT`` that redirects a running
prediction's snapshots to its caller). With a token they need it like everything else, and
directors always send it. Without one they are refused (403): loopback is no credential, since
whatever on the host sends requests to URLs others choose (a webhook dispatcher, another
runner's webhooks) reaches loopback too. ``CONDUIT_RUNNER_TRUST_LOOPBACK=true`` takes them from
loopback peers again, for a host where nothing else can, and even then never from a request
that carries the marks of a webhook delivery.

The peer is the address of the connection (``request.remote`` as the transport reports it): do
not put a forwarded-header middleware in front of a runner.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Collection

from aiohttp import web
from aiohttp.typedefs import Middleware

from protocol.headers import AUTHORIZATION, USER_AGENT
from protocol.paths import PROBE_PATHS
from runners.request_errors import InternalOnlyError, UnauthorizedError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TOKEN_REQUIRED = web.AppKey("token_required", bool)
"""Whether the app checks a runner token (set by :func:`protect`)."""
LOOPBACK_TRUSTED = web.AppKey("loopback_trusted", bool)
"""Whether, without a token, internal calls are taken from loopback peers (absent: no)."""

#: Headers every webhook delivery carries and no director sends: Standard Webhooks' (Conduit's
#: and Replicate's signed deliveries).
_DELIVERY_HEADERS = ("webhook-id", "webhook-signature", "webhook-timestamp")
#: User agents of the webhook senders a runner's host may run: Conduit's, a runner's (coglet's).
_DELIVERY_AGENTS = ("conduit-webhooks/", "coglet/")

_PROBE_METHODS = frozenset({"GET", "HEAD"})


def protect(
    app: web.Application,
    token: str | None,
    trust_loopback: bool = False,
    probes: Collection[str] = PROBE_PATHS,
) -> None:
    """Put the token check in front of every route of ``app`` (after the refusal renderer).

    ``probes`` are the routes (as registered, e.g. ``/models/{model}/health``) that a ``GET``
    or ``HEAD`` may call without the token.
    """
    app[TOKEN_REQUIRED] = token is not None
    app[LOOPBACK_TRUSTED] = trust_loopback
    app.middlewares.append(_authenticate(token, frozenset(probes)))


def _authenticate(token: str | None, probes: frozenset[str]) -> Middleware:
    expected = None if token is None else token.encode()

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and not _is_probe(request, probes):
            if not hmac.compare_digest(_bearer(request), expected):
                raise UnauthorizedError()
        return await handler(request)

    return authenticate


def _bearer(request: web.Request) -> bytes:
    """The credentials of an ``Authorization: Bearer`` header (the scheme is case-insensitive,
    RFC 9110); empty when there is none."""
    scheme, _, credentials = request.headers.get(AUTHORIZATION, "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return credentials.strip().encode("utf-8", "surrogateescape")


def _is_probe(request: web.Request, probes: frozenset[str]) -> bool:
    resource = request.match_info.route.resource
    return (
        request.method in _PROBE_METHODS and resource is not None and resource.canonical in probes
    )


def require_internal(request: web.Request, action: str) -> None:
    """Refuse ``action`` (403) unless the request was authenticated with the runner token or,
    when the runner has none and trusts loopback, comes from loopback and is no webhook."""
    if request.app[TOKEN_REQUIRED]:
        return  # the middleware has checked the token
    if not request.app.get(LOOPBACK_TRUSTED, False):
        raise InternalOnlyError(
            action,
            f"{action} needs the runner token: set CONDUIT_RUNNER_TOKEN on the runner and its "
            "director (or CONDUIT_RUNNER_TRUST_LOOPBACK=true where nothing else on the host "
            "can reach loopback)",
        )
    if not is_loopback(request.remote):
        raise InternalOnlyError(action)
    mark = delivery_mark(request)
    if mark is not None:
        raise InternalOnlyError(action, f"{action} is never taken from a webhook ({mark})")


def delivery_mark(request: web.Request) -> str | None:
    """What shows a request to be a webhook delivery (a header of one), or None."""
    for name in _DELIVERY_HEADERS:
        if name in request.headers:
            return name
    agent = request.headers.get(USER_AGENT, "").strip().lower()
    if agent.startswith(_DELIVERY_AGENTS):
        return f"{USER_AGENT}: {agent.split()[0]}"
    return None


def is_loopback(peer: str | None) -> bool:
    """Whether a peer address is loopback (``127.0.0.0/8``, ``::1``, or IPv4-mapped
    ``::ffff:127.x.y.z``); False for anything unreadable, such as a Unix socket's empty peer."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_loopback_host(host: str) -> bool:
    """Whether a listening address only takes loopback connections (``localhost`` counts)."""
    return host == "localhost" or is_loopback(host)
