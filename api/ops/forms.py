"""The actions of ``/ops`` (POST): sign in and out, retry and cancel one prediction or every
one a filter matches, discard a dead letter, retry or give up a webhook. Each needs an admin's
session and its CSRF token (``api.ops.access.acting``); each answers with a redirect to the
page that shows its outcome (post/redirect/get), and each is in the audit (``ops_actions``)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from api.auth import client_address
from api.errors import RateLimited
from api.ops import actions, reads
from api.ops.access import ActingDep, OpenedDep, safe_next, same_origin, sessions
from api.ops.filters import PredictionFilter
from api.ops.sign_ins import COOKIE, LOGIN_COOKIE, Role, same_token
from api.ops.tasks import spawn
from api.ops.web import page
from catalog import lookups

router = APIRouter(prefix="/ops", include_in_schema=False)


def _see(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


def _with_message(path: str, message: str) -> RedirectResponse:
    joiner = "&" if "?" in path else "?"
    return _see(f"{path}{joiner}message={quote(message)}")


@router.post("/login")
async def login(
    request: Request,
    resources: OpenedDep,
    token: str = Form(""),
    csrf: str = Form(""),
    next: str = Form("/ops"),
) -> Response:
    failures = resources.auth.failures
    address = client_address(request)
    wait = failures.retry_after(address)
    if wait is not None:
        raise RateLimited("Too many failed sign-ins from your address.", retry_after=wait)
    if not same_token(csrf, request.cookies.get(LOGIN_COOKIE, "")) or not same_origin(request):
        return _see("/ops/login?next=" + quote(safe_next(next)))
    account = await lookups.account_for_token(resources.engine, token.strip())
    role = None
    if account is not None and account.active:
        is_admin, ops_role = await reads.ops_role(resources.engine, account.id)
        role = Role.ADMIN if is_admin else Role.VIEWER if ops_role == "viewer" else None
    if account is None or role is None:
        failures.spend(address)
        return page(
            request,
            "login.html",
            None,
            status_code=403,
            login_csrf=csrf,
            next=safe_next(next),
            failed="That token is not an operator's (an admin or viewer account's).",
        )
    cookie, _ = await sessions(resources).start(account.id, account.name, role)
    response = _see(safe_next(next))
    secure = request.url.scheme == "https"
    response.set_cookie(
        COOKIE,
        cookie,
        httponly=True,
        samesite="strict",
        path="/ops",
        secure=secure,
        max_age=resources.settings.ops_session_ttl,
    )
    response.delete_cookie(LOGIN_COOKIE, path="/ops")
    return response


@router.post("/logout")
async def logout(request: Request, resources: OpenedDep) -> Response:
    if same_origin(request):
        await sessions(resources).end(request.cookies.get(COOKIE))
    response = _see("/ops/login")
    response.delete_cookie(COOKIE, path="/ops")
    return response


@router.post("/predictions/{prediction_id}/retry")
async def retry(prediction_id: str, operator: ActingDep, resources: OpenedDep) -> Response:
    try:
        new_id = await actions.retry_one(resources, operator.account_id, prediction_id)
    except actions.Refused as refused:
        return _with_message(f"/ops/predictions/{prediction_id}", str(refused))
    return _with_message(f"/ops/predictions/{new_id}", f"Retry of {prediction_id}.")


@router.post("/predictions/{prediction_id}/cancel")
async def cancel(
    request: Request, prediction_id: str, operator: ActingDep, resources: OpenedDep
) -> Response:
    try:
        await actions.cancel_one(
            resources, operator.account_id, prediction_id, resources.links(request)
        )
    except actions.Refused as refused:
        return _with_message(f"/ops/predictions/{prediction_id}", str(refused))
    return _with_message(f"/ops/predictions/{prediction_id}", "Cancel requested.")


@router.post("/predictions/bulk")
async def bulk(request: Request, operator: ActingDep, resources: OpenedDep) -> Response:
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    where, _ = PredictionFilter.parse(fields)
    try:
        expected = int(fields.get("expected", ""))
        action_id = await actions.start_bulk(
            resources, operator.account_id, fields.get("action", ""), where, expected
        )
    except (ValueError, actions.Refused) as refused:
        return _with_message("/ops/predictions?" + where.query(), str(refused))
    start_bulk_task(request, action_id)
    return _see(f"/ops/actions/{action_id}")


def start_bulk_task(request: Request, action_id: int) -> None:
    resources = request.app.state.resources
    spawn(request.app, actions.run_bulk(resources, action_id, resources.links(request)))


@router.post("/dead/discard")
async def discard(
    operator: ActingDep, resources: OpenedDep, stream: str = Form(), entry: str = Form()
) -> Response:
    try:
        await actions.discard_dead(resources, operator.account_id, stream, entry)
    except actions.Refused as refused:
        return _with_message("/ops/failed", str(refused))
    return _with_message("/ops/failed", f"Discarded {entry} from {stream}.")


@router.post("/webhooks/{delivery_id}/{act}")
async def webhook(
    delivery_id: str, act: str, operator: ActingDep, resources: OpenedDep
) -> Response:
    try:
        await actions.webhook_action(resources, operator.account_id, delivery_id, act)
    except actions.Refused as refused:
        return _with_message("/ops/webhooks", str(refused))
    return _with_message("/ops/webhooks", f"Webhook {delivery_id}: {act.replace('_', ' ')}.")
