"""Minimal create endpoints that ``bench.enqueue`` measures Conduit's api against.

``python -m bench.baselines.server KIND --port P`` serves ``POST /v1/predictions`` (201) and
``GET /health`` under uvicorn with the same options as ``conduit api`` (uvloop, httptools, no
access log). Kinds:

- ``fastapi-xadd``: FastAPI, one ``XADD`` per request.
- ``fastapi-insert-xadd``: FastAPI, one ``INSERT ... RETURNING`` into ``bench_predictions``
  (autocommit, one round trip, as Conduit's create does) then one ``XADD``.
- ``starlette-insert-xadd``: the same work on raw Starlette.

Redis and Postgres are opened like Conduit's api opens them: :func:`director.queue.connect`
and :func:`tracker.db.make_engine` (same pool settings) from ``REDIS_URL``/``DATABASE_URL``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response as FastAPIResponse
from redis.asyncio import Redis
from sqlalchemy import (
    Column,
    DateTime,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.routing import Route

from core.ids import new_prediction_id
from director.queue import connect as connect_redis
from tracker.db import autocommit, make_engine, sqlalchemy_url

STREAM = "bench:baseline"
POOL_SIZE = 10  # ApiSettings.db_pool_size's default

metadata = MetaData()
bench_predictions = Table(
    "bench_predictions",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("model", String(401), nullable=False),
    Column("input", JSONB, nullable=False),
    Column("status", String(16), nullable=False, server_default="starting"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


def create_table(database_url: str) -> None:
    """Create ``bench_predictions`` (before the servers start, so they never race to)."""
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()


class Backends:
    def __init__(self) -> None:
        self.redis: Redis = connect_redis(os.environ["REDIS_URL"])
        self.engine: AsyncEngine = make_engine(os.environ["DATABASE_URL"], pool_size=POOL_SIZE)

    async def close(self) -> None:
        await self.redis.aclose()
        await self.engine.dispose()

    async def xadd(self, body: dict[str, Any]) -> dict[str, Any]:
        prediction_id = new_prediction_id()
        await self.redis.xadd(STREAM, {"id": prediction_id})
        return {"id": prediction_id, "input": body.get("input"), "status": "starting"}

    async def insert_xadd(self, body: dict[str, Any]) -> dict[str, Any]:
        values = {"id": new_prediction_id(), "model": "bench/echo", "input": body.get("input")}
        async with autocommit(self.engine).connect() as conn:
            result = await conn.execute(
                insert(bench_predictions).values(values).returning(bench_predictions)
            )
            row = result.one()
        await self.redis.xadd(STREAM, {"id": row.id})
        return {
            "id": row.id,
            "model": row.model,
            "input": row.input,
            "status": row.status,
            "created_at": row.created_at.isoformat(),
        }


Work = Callable[[Backends, dict[str, Any]], Awaitable[dict[str, Any]]]


def fastapi_app(work: Work) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.backends = Backends()
        yield
        await app.state.backends.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/predictions", status_code=201)
    async def create(request: Request, body: dict[str, Any]) -> FastAPIResponse:
        created = await work(request.app.state.backends, body)
        return FastAPIResponse(orjson.dumps(created), 201, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def starlette_app(work: Work) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.backends = Backends()
        yield
        await app.state.backends.close()

    async def create(request: StarletteRequest) -> Response:
        body = orjson.loads(await request.body())
        created = await work(request.app.state.backends, body)
        return Response(orjson.dumps(created), 201, media_type="application/json")

    async def health(request: StarletteRequest) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    routes = [
        Route("/v1/predictions", create, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


KINDS: dict[str, Callable[[], FastAPI | Starlette]] = {
    "fastapi-xadd": lambda: fastapi_app(Backends.xadd),
    "fastapi-insert-xadd": lambda: fastapi_app(Backends.insert_xadd),
    "starlette-insert-xadd": lambda: starlette_app(Backends.insert_xadd),
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.server", description=__doc__)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        KINDS[args.kind](),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
