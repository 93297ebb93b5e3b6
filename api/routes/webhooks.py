"""The account's webhook signing secret (Standard Webhooks ``whsec_...``)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import AccountDep
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from api.schemas import WebhookSecret

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


@router.get(
    "/webhooks/default/secret",
    response_model=WebhookSecret,
    responses=problems(401, 503),
    openapi_extra=operation(),
)
async def default_secret(account: AccountDep) -> FastJSONResponse:
    return FastJSONResponse({"key": account.webhook_secret})
