"""A database pool starved by a lock another client holds is an outage, answered as one: 503
problem+json with ``Retry-After`` once the short pool wait runs out, never a 500; requests
that got a connection finish once the lock goes."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import psycopg

from tests.conftest import ECHO, Stack
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.processes import Launcher

#: One pooled connection and one of overflow: the first two reads hold both behind the lock.
POOL = {"CONDUIT_API_DB_POOL_SIZE": "1", "CONDUIT_DATABASE_POOL_TIMEOUT": "1"}
READS = 6


async def test_a_lock_held_elsewhere_gives_503_not_500(
    stack: Stack, launcher: Launcher, token: str, database_url: str
) -> None:
    with launcher.own_api(POOL) as api_url:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api_url, headers=headers, timeout=30) as client:
            created = create(client, f"/v1/deployments/{ECHO}/predictions", input={"prompt": "l"})
            wait_status(client, created["id"])
        path = f"/v1/predictions/{created['id']}"

        with psycopg.connect(database_url) as locker:
            locker.execute("LOCK TABLE predictions IN ACCESS EXCLUSIVE MODE")  # held until rollback
            # Well under SQLAlchemy's default pool wait (30 s): a 500 after that fails it too.
            async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=20) as http:
                reads = [asyncio.create_task(http.get(path)) for _ in range(READS)]
                # Two reads hold the pool's two connections behind the lock; the lock stays
                # until every other one has stopped waiting for a connection, however late it
                # came (a loaded machine), so what each one meets does not race the rollback.
                pending: set[asyncio.Task[httpx.Response]] = set(reads)
                early: list[httpx.Response] = []
                while len(early) < READS - 2:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    early += [task.result() for task in done]
                refused = early[0]
                locker.rollback()
                answers = [await read for read in reads]

        problem = assert_problem(refused, 503)
        assert "busy" in problem["detail"], problem
        assert int(refused.headers["Retry-After"]) >= 1
        codes = Counter(answer.status_code for answer in answers)
        assert codes == {503: READS - 2, 200: 2}, codes
