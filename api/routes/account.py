"""``GET /v1/account``: who the bearer token belongs to (the clients' "is my token valid")."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import AccountDep
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from api.schemas import Account

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


@router.get(
    "/account",
    response_model=Account,
    responses=problems(401, 503),
    openapi_extra=operation(),
)
async def get_account(account: AccountDep) -> FastJSONResponse:
    return FastJSONResponse(render_account(account.name))


def render_account(name: str) -> dict[str, Any]:
    # Replicate's shape; Conduit's accounts are all organizations and none has a GitHub page.
    return {"type": "organization", "username": name, "name": name, "github_url": None}
