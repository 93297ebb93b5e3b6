"""The operator page, ``/ops``: the queue, its workers, its failures, and what to do about them.

Server-rendered (Jinja2, autoescaped) with htmx and its SSE extension served from this package
(``static/``): no build step, no CDN, no inline script, so that the page works offline and
under ``script-src 'self'``. Closed (404 throughout) until an admin or viewer account exists;
see ``api.ops.access`` for who sees and who acts.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from api.ops import actions, forms, gateway_page, pages
from api.ops.access import Gate, SignInRequired, login_path
from api.settings import ApiSettings
from tracker.render import PredictionLinks


async def _sign_in(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SignInRequired)
    target = login_path(exc.next_path)
    if request.headers.get("hx-request") == "true":  # htmx follows this header, not a 303
        return Response(status_code=204, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


def install(app: FastAPI, settings: ApiSettings) -> None:
    app.state.ops_gate = Gate(settings.cache_ttl)
    app.state.ops_tasks = set()
    app.add_exception_handler(SignInRequired, _sign_in)
    app.include_router(pages.router)
    app.include_router(forms.router)
    app.include_router(gateway_page.router)


async def start(app: FastAPI) -> None:
    """Resume bulk actions a restart cut short (each batch is locked: replicas take turns)."""
    resources = app.state.resources
    links = PredictionLinks((resources.settings.public_url or "").rstrip("/"), None)
    for action_id in await actions.unfinished_bulk(resources.engine):
        task = asyncio.create_task(actions.run_bulk(resources, action_id, links))
        app.state.ops_tasks.add(task)
        task.add_done_callback(app.state.ops_tasks.discard)


async def stop(app: FastAPI) -> None:
    """Stop bulk actions between batches: each resumes at the next start."""
    tasks = list(app.state.ops_tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
