"""Rendering for ``/ops``: Jinja2 with autoescaping on, the security headers every answer
carries, and the vendored static files (htmx and its SSE extension; no CDN, no build step)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from api.ops.sign_ins import OpsSession

#: No inline script or style anywhere: everything the page runs is a file of its own.
CSP = (
    "default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: Vendored files: name → media type. htmx 2.0.11 and htmx-ext-sse 2.2.4 (BSD-0 licensed,
#: ``static/htmx-LICENSE.txt``), as npm publishes them.
STATIC = {
    "htmx-2.0.11.min.js": "text/javascript",
    "htmx-ext-sse-2.2.4.js": "text/javascript",
    "ops.js": "text/javascript",
    "ops.css": "text/css",
    "favicon.svg": "image/svg+xml",
}


def _when(value: datetime | None) -> str:
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("api.ops", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["pretty"] = _json
    env.filters["thousands"] = lambda n: f"{n:,}"
    return env


ENV = _environment()


def page(
    request: Request,
    template: str,
    session: OpsSession | None,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """``template`` rendered, with what every page needs (the session, its CSRF token, the
    poll interval, when it was read: this server's clock, UTC)."""
    settings = request.app.state.resources.settings
    body = ENV.get_template(template).render(
        request=request,
        session=session,
        poll=settings.ops_poll_seconds,
        read_at=datetime.now(UTC),
        fragment=request.headers.get("hx-request") == "true"
        and request.headers.get("hx-boosted") != "true",
        **context,
    )
    started = getattr(request.state, "ops_started", None)
    timing = {}
    if started is not None:  # what the page cost this server, transport aside
        timing["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
    return HTMLResponse(body, status_code, headers={**HEADERS, **timing, **(headers or {})})


def _read_static() -> dict[str, bytes]:
    folder = resources.files("api.ops").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in STATIC}


_FILES = _read_static()


def static(name: str) -> Response | None:
    body = _FILES.get(name)
    if body is None:
        return None
    return Response(
        body,
        media_type=STATIC[name],
        headers={**HEADERS, "Cache-Control": "public, max-age=3600"},
    )
