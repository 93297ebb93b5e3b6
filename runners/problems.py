"""The one place a refusal (:mod:`runners.errors`) becomes an HTTP response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from runners.errors import RequestRefused


def refusal(error: RequestRefused) -> web.Response:
    """``error``'s body, status and headers; keys sorted, as coglet serialises its bodies."""
    body = orjson.dumps(error.body(), option=orjson.OPT_SORT_KEYS)
    return web.Response(
        body=body, status=error.status, content_type=error.media_type, headers=error.headers()
    )


@web.middleware
async def refusals(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Answer a :class:`RequestRefused` raised by any handler."""
    try:
        return await handler(request)
    except RequestRefused as error:
        return refusal(error)
