"""Authenticate a request that carries a body before anything reads the body.

FastAPI reads and parses a route's body before it runs the route's dependencies, the bearer
token check among them: without this layer anyone could make the api receive and buffer up to
``max_body_bytes`` per request without a credential. Every route that takes a body needs a
token (the ones open to all, ``/health*``, ``/openapi.json``, ``/metrics`` and signed stream
URLs, are reads), so a request that declares a body and is not a read is authenticated here,
with the same :class:`~api.auth.Authenticator` as the routes, and the account it finds is the
one the route is given (``request.state.account``). A refusal is answered at once and closes the
connection, the body never read.

The operator page (``/ops``) is the exception: its forms authenticate by session cookie
(``api.ops.access``), and its sign-in form by nothing yet. Its bodies are small forms, so a
request under ``/ops`` may declare at most ``OPS_MAX_BODY`` bytes, by ``Content-Length``; a
larger or chunked one is refused here (413), unread.

An authentication that fails for another reason than the token (the database away) lets the
request through: the route authenticates again and answers as it does for any request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import Authenticator
from api.errors import Problem, problem_response

log = logging.getLogger(__name__)

#: Methods that take no body on any route of the api.
READS = frozenset({"GET", "HEAD", "OPTIONS"})
OPS_PREFIX = "/ops/"
OPS_MAX_BODY = 64 * 1024


def _small_form(scope: Scope) -> bool:
    """Whether the request declares a body of at most ``OPS_MAX_BODY`` bytes by length."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding":
            return False
        if name == b"content-length":
            return value.strip().isdigit() and int(value) <= OPS_MAX_BODY
    return True


def declares_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class AuthenticateBeforeBody:
    def __init__(self, app: ASGIApp, authenticator: Callable[[], Authenticator | None]) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in READS or not declares_body(scope):
            await self.app(scope, receive, send)
            return
        if scope.get("path", "").startswith(OPS_PREFIX):
            if _small_form(scope):
                await self.app(scope, receive, send)
                return
            refused = problem_response(
                413,
                "Payload too large",
                f"Forms under /ops take at most {OPS_MAX_BODY} bytes, sent with Content-Length.",
                instance=scope.get("path", ""),
                headers={"Connection": "close"},
            )
            await refused(scope, receive, send)
            return
        authenticator = self.authenticator()
        if authenticator is not None:
            request = Request(scope)
            try:
                # Kept for the route (api.deps.get_account): one authentication a request.
                request.state.account = await authenticator.account(request)
            except Problem as problem:
                response = problem_response(
                    problem.status,
                    problem.title,
                    problem.detail,
                    instance=scope.get("path", ""),
                    headers={**problem.headers, "Connection": "close"},
                    code=problem.code,
                )
                await response(scope, receive, send)
                return
            except Exception as error:  # the route's own check answers for it
                log.debug("authentication before the body failed: %r", error)
        await self.app(scope, receive, send)
