"""A statement Postgres refuses as past its own limits (too complex, stack too deep) is the
request's fault: classed so by ``core.transient.past_database_limit``, answered 400 by the api
and INVALID_ARGUMENT by the gateway, and never retried as an outage, although psycopg reports it
as an ``OperationalError`` as it does a lost connection."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from core.transient import TRANSIENT, past_database_limit, persistently
from gateway.errors import status_of

#: A SQL/JSON path of 30,000 alternatives: Postgres's parser refuses it as too complex.
TOO_COMPLEX = "$ ? (" + " || ".join(f"@ == {i}" for i in range(30_000)) + ")"


async def _refusal(engine: AsyncEngine, sql: str, **params: object) -> DBAPIError:
    with pytest.raises(DBAPIError) as refused:
        async with engine.connect() as conn:
            await conn.execute(text(sql), params)
    return refused.value


async def test_statements_past_postgres_limits_are_not_outages(engine: AsyncEngine) -> None:
    complex_path = await _refusal(engine, "SELECT CAST(:p AS jsonpath)", p=TOO_COMPLEX)
    deep_json = await _refusal(engine, "SELECT CAST(:d AS jsonb)", d="[" * 20_000 + "]" * 20_000)
    for refused in (complex_path, deep_json):
        assert isinstance(refused, OperationalError) and isinstance(refused, TRANSIENT)
        assert past_database_limit(refused), refused
        code, message = status_of(refused)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, message
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise complex_path

    with pytest.raises(OperationalError):
        await persistently("a statement too complex", attempt)
    assert attempts == 1


def test_a_lost_connection_is_still_an_outage() -> None:
    lost = OperationalError("SELECT 1", {}, ConnectionError("server closed the connection"))
    assert not past_database_limit(lost)
    assert status_of(lost)[0] is grpc.StatusCode.UNAVAILABLE
