"""``X-Request-Id``: one id per request, in its answer, its log lines and the prediction it creates.

A client's own id is adopted when it is sane (1-128 characters of ``[A-Za-z0-9._-]``), so a
caller can follow its request through its own logs and Conduit's; anything else is replaced
by a new one rather than refused, as a request id is no part of what was asked. The id is
bound for the request's task (:mod:`core.logs`), so every line logged while it is
handled carries it, and a prediction it creates is stored with it
(``predictions.request_id``), for the director's lines about that prediction.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.logs import bound, new_request_id, sane_request_id

HEADER = "X-Request-Id"
_HEADER_KEY = HEADER.lower().encode("latin-1")


def request_id_of(scope: Scope) -> str:
    """The client's id when it is sane, else a new one."""
    for name, value in scope["headers"]:
        if name == _HEADER_KEY:
            adopted = sane_request_id(value.decode("latin-1"))
            if adopted is not None:
                return adopted
    return new_request_id()


class RequestIds:
    """Pure ASGI middleware: bind the request's id and answer with it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        with bound(request_id=request_id):
            await self.app(scope, receive, send_with_id)
