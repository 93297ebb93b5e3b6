"""Forwarding a slot's request to its backend and the backend's answer back, as it comes."""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web

from protocol.headers import NDJSON
from runners.errors import BackendUnreachableError
from runners.pool.backends import Backend

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        "authorization",  # the pool's token; the backend is given its own (Backend.headers)
        "connection",
        "content-length",
        "host",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


async def proxy(
    request: web.Request,
    session: aiohttp.ClientSession,
    backend: Backend,
    path: str,
    body: bytes | None = None,
    extra: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Forward the request to the backend and its answer back, streaming an NDJSON one, with
    the ``extra`` headers added to the answer."""
    url = backend.url
    if url is None:
        raise BackendUnreachableError("the model is not running")
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
    headers.update(backend.headers)
    try:
        upstream = await session.request(
            request.method,
            url + path,
            params=request.query,
            data=body if body is not None else await request.read(),
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=5),
        )
    except (aiohttp.ClientError, TimeoutError) as error:
        raise BackendUnreachableError(f"the model's server did not answer: {error!r}") from None
    try:
        answer = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
        answer.update(extra or {})
        if upstream.content_type != NDJSON:
            data = await upstream.read()
            return web.Response(body=data, status=upstream.status, headers=answer)
        response = web.StreamResponse(status=upstream.status, headers=answer)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError) as error:
            log.info("snapshot stream of %s closed early: %r", request.path, error)
        return response
    finally:
        upstream.release()
