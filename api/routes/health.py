"""Liveness, readiness and reachability of what the API depends on.

- ``/livez``: the process's event loop answers. No backend is asked: restarting an api
  because Postgres is away would only add load to it.
- ``/readyz``: the api can serve. Postgres answers, the pools are open, and it is not shutting
  down (after SIGTERM it answers 503, so a Service stops sending before it goes). Redis is
  reported and does not decide: during a Redis outage the api still answers reads from
  Postgres, stores creates (queued once Redis is back) and answers the rest 503 with
  ``Retry-After``; failing readiness would take every replica out of the Service at once.
- ``/health``: both backends, as before (200 only when Postgres and Redis both answer).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import Resources, ResourcesDep
from api.responses import FastJSONResponse
from api.schemas import Health

router = APIRouter()

#: Seconds a backend gets to answer a probe: under a kubelet's usual 3 s probe timeout.
CHECK_TIMEOUT = 2.0
OK = "ok"


async def _database(resources: Resources) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            async with resources.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        return OK
    except Exception as error:  # any failure means unhealthy; the reason is reported
        return f"error: {type(error).__name__}"


async def _redis(resources: Resources) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            await resources.redis.ping()
        return OK
    except Exception as error:
        return f"error: {type(error).__name__}"


def _answer(checks: dict[str, str], deciding: tuple[str, ...]) -> FastJSONResponse:
    healthy = all(checks[name] == OK for name in deciding)
    return FastJSONResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks},
        status_code=200 if healthy else 503,
    )


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "Postgres or Redis is unreachable."}},
)
async def health(resources: ResourcesDep) -> FastJSONResponse:
    database, redis = await asyncio.gather(_database(resources), _redis(resources))
    return _answer({"database": database, "redis": redis}, ("database", "redis"))


@router.get("/livez", response_model=Health, include_in_schema=False)
async def livez() -> FastJSONResponse:
    return FastJSONResponse({"status": "ok", "checks": {}})


@router.get(
    "/readyz",
    response_model=Health,
    include_in_schema=False,
    responses={503: {"model": Health, "description": "Postgres away, or shutting down."}},
)
async def readyz(resources: ResourcesDep) -> FastJSONResponse:
    database, redis = await asyncio.gather(_database(resources), _redis(resources))
    checks = {
        "database": database,
        "accepting": "shutting down" if resources.hub.released else OK,
        # Reported only: see the module's docstring.
        "redis": redis,
    }
    return _answer(checks, ("database", "accepting"))
