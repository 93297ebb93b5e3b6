"""Request bodies are taken as they are sent: one with a ``Content-Encoding`` is refused, unread.

Cog's protocol never compresses a request body, and aiohttp inflates one on the fly: a few
kilobytes of gzip would be read as up to the body cap (100 MiB) before being refused for its
size. A body with any encoding but ``identity`` is answered 415 (problem+json naming the
header) before anyone reads it. Runners are served with ``auto_decompress=False``, so what the
client still sends is drained and dropped as it came, never inflated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from protocol.headers import CONTENT_ENCODING
from runners.request_errors import UnsupportedEncodingError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def refuse_encoded_bodies(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Raise :class:`UnsupportedEncodingError` for a body sent with a ``Content-Encoding``."""
    encoding = request.headers.get(CONTENT_ENCODING, "").strip().lower()
    if encoding not in ("", "identity") and request.body_exists:
        raise UnsupportedEncodingError(encoding)
    return await handler(request)
