"""The account's webhook signing secret (Standard Webhooks ``whsec_...``)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import AccountDep
from api.responses import FastJSONResponse

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


@router.get("/webhooks/default/secret")
async def default_secret(account: AccountDep) -> FastJSONResponse:
    return FastJSONResponse({"key": account.webhook_secret})
