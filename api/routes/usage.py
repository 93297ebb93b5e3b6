"""``GET /v1/usage?start=&end=``: an account's usage, aggregated."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from api.deps import AccountDep, ResourcesDep
from api.responses import FastJSONResponse
from tracker import usage
from tracker.render import iso

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


@router.get("/usage")
async def get_usage(
    account: AccountDep,
    resources: ResourcesDep,
    start: datetime | None = None,
    end: datetime | None = None,
) -> FastJSONResponse:
    totals = await usage.summary(resources.engine, account.id, start, end)
    return FastJSONResponse({"start": iso(start), "end": iso(end), **totals})
