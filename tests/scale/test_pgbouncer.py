"""Conduit behind PgBouncer in transaction mode (``CONDUIT_DATABASE_PREPARED_STATEMENTS=false``).

A transaction-pooling PgBouncer (before 1.21, or without ``max_prepared_statements``) hands
each transaction whichever server connection is free, so a statement psycopg prepared on one
(after ``prepare_threshold`` = 5 runs on a client connection) is missing on the next.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from conduit.services import ServiceUrls
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.pgbouncer import PgBouncer
from tests.fixtures.processes import Launcher, base_env
from tests.fixtures.servers import create_database
from tracker.db import make_engine

ECHO = "conduit/echo"
NO_PREPARE = {"CONDUIT_DATABASE_PREPARED_STATEMENTS": "false"}


@pytest.fixture(scope="module")
def bouncer(services: ServiceUrls) -> Iterator[PgBouncer]:
    with tempfile.TemporaryDirectory(prefix="conduit-pgbouncer-") as workdir:
        os.chmod(workdir, 0o711)  # it runs as user postgres when we are root: let it in
        with PgBouncer(workdir, services.database_url, pool_size=8) as server:
            yield server


async def _seventh_run_after_losing_its_server_connection(url: str, prepared: bool | None) -> None:
    """Run one statement 6 times on a client connection (psycopg prepares it on the 6th),
    then once more while another client holds the server connection it was prepared on:
    PgBouncer reuses its most recently freed server connection first, so the 7th run gets
    another one."""
    engine = make_engine(url, pool_size=2, prepared_statements=prepared)
    statement = text("SELECT count(*) FROM pg_class WHERE relpages >= :n")
    try:
        async with engine.connect() as first:
            for n in range(6):
                await first.execute(statement, {"n": n})
                await first.commit()
            async with engine.connect() as second:
                await second.execute(text("SELECT 1"))  # a transaction left open
                await first.execute(statement, {"n": 7})
                await first.commit()
    finally:
        await engine.dispose()


async def test_prepared_statements_break_behind_transaction_pooling(bouncer: PgBouncer) -> None:
    with pytest.raises(ProgrammingError) as failure:
        await _seventh_run_after_losing_its_server_connection(bouncer.url, prepared=True)
    assert isinstance(failure.value.orig, psycopg.errors.InvalidSqlStatementName)


async def test_without_prepared_statements_every_run_works(
    bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setting, read from the environment as every process does."""
    monkeypatch.setenv("CONDUIT_DATABASE_PREPARED_STATEMENTS", "false")
    await _seventh_run_after_losing_its_server_connection(bouncer.url, prepared=None)


def test_predictions_run_end_to_end_through_pgbouncer(
    bouncer: PgBouncer,
    services: ServiceUrls,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """migrate, admin, api, director: every process reaches Postgres through the pooler."""
    direct = create_database(services.database_url, f"conduit_pgb_{uuid.uuid4().hex[:12]}")
    url = bouncer.reroute(direct)
    env = {**base_env(url, services.redis_url), **NO_PREPARE}
    migrated = subprocess.run(
        [sys.executable, "-m", "conduit", "migrate"], env=env, capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stderr

    monkeypatch.setenv("CONDUIT_DATABASE_PREPARED_STATEMENTS", "false")
    admin = Admin(url)
    launcher = Launcher(env, tmp_path)
    try:
        _, api_url = launcher.api()
        _, runner_url = launcher.runner("echo", concurrency=4)
        admin.create_model(ECHO, runner_url)
        # A deployment of its own: the session's stack shares this Redis, and its director
        # would read (and drop, not finding the rows) entries queued for a shared name.
        deployment = f"conduit/pgbouncer-{uuid.uuid4().hex[:8]}"
        admin.create_deployment(deployment, ECHO, visibility="public")
        director = launcher.director(deployment, runner_url, concurrency=4)
        path = f"/v1/deployments/{deployment}/predictions"
        token = admin.create_account(f"acct-{uuid.uuid4().hex[:10]}")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api_url, headers=headers, timeout=30) as client:
            # Enough predictions that every statement runs well past psycopg's threshold on
            # each pooled connection, in several rounds that interleave api and director.
            for round in range(4):
                ids = [
                    create(client, path, input={"prompt": f"r{round}", "n": 2})["id"]
                    for _ in range(6)
                ]
                for prediction_id in ids:
                    done = wait_status(client, prediction_id)
                    assert done["status"] == "succeeded", done
                    assert done["output"] == [f"r{round}-0", f"r{round}-1"]
            listed = client.get("/v1/predictions").json()
            assert len(listed["results"]) == 24
            assert client.get("/v1/usage").json()["predictions"] == 24
        director.check_alive()
        for proc in launcher.procs:
            assert "does not exist" not in proc.log(), proc.log()[-2000:]
    finally:
        launcher.stop_all()
