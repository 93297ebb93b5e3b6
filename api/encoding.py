"""Request bodies are taken as they are sent: one with a ``Content-Encoding`` is refused, unread.

Neither the official clients nor Cog compress a request body, and nothing in the api decodes
one: the compressed bytes would reach the JSON parser and come back as an unhelpful 400. A
request that carries a body with any coding but ``identity`` is answered 415 problem+json naming
the header (:class:`api.errors.UnsupportedEncoding`) before a byte of the body is read.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import UnsupportedEncoding, problem_response


class RefuseContentEncoding:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoding = _body_encoding(scope) if scope["type"] == "http" else None
        if encoding is None:
            await self.app(scope, receive, send)
            return
        problem = UnsupportedEncoding(encoding)
        response = problem_response(
            problem.status,
            problem.title,
            problem.detail,
            instance=scope.get("path", ""),
            errors=problem.errors,
            headers=problem.headers,
            code=problem.code,
        )
        await response(scope, receive, send)


def _body_encoding(scope: Scope) -> str | None:
    """The ``Content-Encoding`` of a request that has a body, unless ``identity``; else None."""
    encoding = ""
    has_body = False
    for name, value in scope["headers"]:
        if name == b"content-encoding":
            encoding = value.decode("latin-1").strip().lower()
        elif name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
            has_body = True
    if encoding in ("", "identity") or not has_body:
        return None
    return encoding
