"""The api's answer to a statement Postgres refuses as past its own limits: a 400
``too_complex`` problem, never 503 "the database is unreachable" with a Retry-After. The error
is Postgres's own (a real statement on the session's database) raised through the api's
installed exception handlers."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api import error_handlers

#: A SQL/JSON path of 30,000 alternatives: Postgres's parser refuses it as too complex.
TOO_COMPLEX = "$ ? (" + " || ".join(f"@ == {i}" for i in range(30_000)) + ")"


async def test_a_statement_too_complex_is_400_not_unreachable(engine: AsyncEngine) -> None:
    app = FastAPI()
    error_handlers.install(app)

    @app.get("/complex")
    async def complex_statement() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT CAST(:p AS jsonpath)"), {"p": TOO_COMPLEX})

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        answer = await client.get("/complex")
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == "too_complex"
    assert "retry-after" not in answer.headers
