"""Request body size limit, enforced before a handler reads the body.

A pure ASGI middleware: it refuses at once when Content-Length is too large, and counts bytes
as they arrive for chunked bodies, so an oversize request is never buffered whole.

Routes that stream their body somewhere other than memory and hold it to a limit of their own
(``POST /v1/files``) are exempt, named by method and path.
"""

from __future__ import annotations

from collections.abc import Collection

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import PROBLEM_JSON


class BodySizeLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, exempt: Collection[tuple[str, str]] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        #: (method, path) pairs the limit does not apply to.
        self.exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) in self.exempt:
            await self.app(scope, receive, send)
            return
        if self._declared_too_large(scope):
            await self._refuse(scope, send)
            return
        received = 0
        refused = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if not refused:
                        refused = True
                        await self._refuse(scope, send)
                    # Tell the app the client is gone, so it stops reading and buffering.
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:  # once refused, whatever the app answers is dropped
                await send(message)

        await self.app(scope, counting_receive, guarded_send)

    def _declared_too_large(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                return int(value) > self.max_bytes
        return False

    async def _refuse(self, scope: Scope, send: Send) -> None:
        body = orjson.dumps(
            {
                "type": "about:blank",
                "title": "Request body too large",
                "status": 413,
                "detail": f"The request body exceeds the limit of {self.max_bytes} bytes.",
                "instance": scope.get("path", ""),
            }
        )
        headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
