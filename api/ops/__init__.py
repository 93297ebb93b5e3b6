"""The operator page, ``/ops``: the queue, its workers, its failures, and what to do about them.

Server-rendered (Jinja2, autoescaped) with htmx and its SSE extension served from this package
(``static/``): no build step, no CDN, no inline script, so that the page works offline and
under ``script-src 'self'``. Closed (404 throughout) until an admin or viewer account exists;
see ``api.ops.access`` for who sees and who acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from api.ops import actions, forms, gateway_page, pages
from api.ops.access import Gate, SignInRequired, login_path
from api.ops.tasks import spawn
from api.settings import ApiSettings
from core.transient import TRANSIENT
from tracker.render import PredictionLinks

log = logging.getLogger(__name__)
#: Seconds between tries to read the bulk actions to resume while Postgres is away.
RESUME_RETRY = 5.0


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
    """Resume, in the background, bulk actions a restart cut short (each batch is locked:
    replicas take turns). In the background: the api starts, and answers that it is not
    ready, while Postgres is away; the actions resume once it is back."""
    spawn(app, _resume(app))


async def _resume(app: FastAPI) -> None:
    resources = app.state.resources
    links = PredictionLinks((resources.settings.public_url or "").rstrip("/"), None)
    while True:
        try:
            unfinished = await actions.unfinished_bulk(resources.engine)
            break
        except TRANSIENT as error:
            log.info("bulk actions not resumed yet (%r); trying again", error)
            await asyncio.sleep(RESUME_RETRY)
    for action_id in unfinished:
        spawn(app, actions.run_bulk(resources, action_id, links))


async def stop(app: FastAPI) -> None:
    """Stop bulk actions between batches: each resumes at the next start."""
    tasks = list(app.state.ops_tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
