"""Who may see ``/ops`` and act there.

Closed unless configured: while no active account that is an admin (``is_admin``) or a viewer
(``ops_role``) holds a token, every path under ``/ops`` answers 404 exactly as an unknown path
does, static files included. Past that gate a page needs a session (``api.ops.sign_ins``), and
an action needs an admin's session, its CSRF token (form field ``csrf`` or header
``X-CSRF-Token``) and, when the browser sends one, an ``Origin`` of this site.
"""

from __future__ import annotations

import time
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from api.deps import Resources, ResourcesDep
from api.errors import Forbidden
from api.ops import reads
from api.ops.sign_ins import COOKIE, OpsSession, SignIns, same_token


class SignInRequired(Exception):
    """Answered with a redirect to the sign-in page (``api.ops.routes``)."""

    def __init__(self, next_path: str) -> None:
        self.next_path = next_path


class Gate:
    """Whether ``/ops`` is open, asked of Postgres at most once per ``ttl`` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._open = False
        self._until = 0.0

    async def is_open(self, resources: Resources) -> bool:
        now = time.monotonic()
        if now >= self._until:
            self._open = await reads.gate_open(resources.engine)
            # Closed is re-asked sooner: the first admin should not wait long for the page.
            self._until = now + (self.ttl if self._open else min(self.ttl, 1.0))
        return self._open


async def opened(request: Request, resources: ResourcesDep) -> Resources:
    request.state.ops_started = time.perf_counter()  # for the page's Server-Timing
    gate: Gate = request.app.state.ops_gate
    if not await gate.is_open(resources):
        raise HTTPException(404, "Not Found")
    return resources


OpenedDep = Annotated[Resources, Depends(opened)]


def sessions(resources: Resources) -> SignIns:
    return SignIns(resources.engine, resources.settings.ops_session_ttl)


async def signed_in(request: Request, resources: OpenedDep) -> OpsSession:
    session = await sessions(resources).find(request.cookies.get(COOKIE))
    if session is None:
        path = request.url.path
        if request.url.query:
            path += "?" + request.url.query
        raise SignInRequired(path)
    return session


SessionDep = Annotated[OpsSession, Depends(signed_in)]


def same_origin(request: Request) -> bool:
    """A POST from a page of this site: no ``Origin`` (older browsers), or this host's."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def acting(request: Request, session: SessionDep) -> OpsSession:
    """An admin's session whose request carries its CSRF token: else 403, nothing done."""
    if not session.may_act:
        raise Forbidden("This account may look at /ops, not act there.", code="read_only")
    token = request.headers.get("x-csrf-token")
    if token is None:
        form = await request.form()
        value = form.get("csrf")
        token = value if isinstance(value, str) else None
    if not same_token(token, session.csrf) or not same_origin(request):
        raise Forbidden("The form's security token is missing or stale: reload the page.")
    return session


ActingDep = Annotated[OpsSession, Depends(acting)]


def login_path(next_path: str) -> str:
    return "/ops/login?next=" + quote(next_path, safe="/")


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path under ``/ops`` only (never another site)."""
    if value and value.startswith("/ops") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ops"
