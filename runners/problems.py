"""RFC 9457 problem+json responses for the runner's own (non-Cog) refusals."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from runners.protocol import PROBLEM_JSON


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """``about:blank`` like the api's problems; ``code`` names the refusal for machines."""
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "code": slug,
        **extra,
    }
    return web.Response(
        body=orjson.dumps(body), status=status, content_type=PROBLEM_JSON, headers=headers
    )
