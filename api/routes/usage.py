"""``GET /v1/usage?start=&end=``: an account's usage, aggregated."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from api.deps import AccountDep, ResourcesDep
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from api.schemas import Usage
from tracker import usage
from tracker.render import iso

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


@router.get(
    "/usage",
    response_model=Usage,
    responses=problems(401, 422, 503),
    openapi_extra=operation(),
)
async def get_usage(
    account: AccountDep,
    resources: ResourcesDep,
    start: datetime | None = None,
    end: datetime | None = None,
) -> FastJSONResponse:
    totals = await usage.summary(resources.reads, account.id, start, end)
    return FastJSONResponse({"start": iso(start), "end": iso(end), **totals})
