"""Liveness of the API and reachability of what it depends on."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import ResourcesDep
from api.responses import FastJSONResponse
from api.schemas import Health

router = APIRouter()


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "Postgres or Redis is unreachable."}},
)
async def health(resources: ResourcesDep) -> FastJSONResponse:
    checks: dict[str, str] = {}
    try:
        async with resources.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as error:  # any failure means unhealthy; the reason is reported
        checks["database"] = f"error: {type(error).__name__}"
    try:
        await resources.redis.ping()
        checks["redis"] = "ok"
    except Exception as error:
        checks["redis"] = f"error: {type(error).__name__}"
    healthy = all(value == "ok" for value in checks.values())
    return FastJSONResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks},
        status_code=200 if healthy else 503,
    )
