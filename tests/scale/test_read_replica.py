"""``CONDUIT_DATABASE_READ_URL``: the api reads predictions (get, list) and usage there, and
writes nothing there.

The "replica" is the primary database seen through a read-only session whose ``search_path``
puts views first: predictions whose logs carry a mark, and every usage record twice. A read
that went to the primary shows no mark (or single usage); a write that went to the replica
fails (``default_transaction_read_only``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
from psycopg import sql

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher, base_env
from tests.fixtures.servers import create_database

ECHO = "conduit/echo"
MARK = "from the replica: "
REPLICA_OPTIONS = "-c search_path=replica,public -c default_transaction_read_only=on"


def _conninfo(url: str) -> str:
    return re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", url)


def _replica_views(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    columns = [
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = 'predictions' "
            "ORDER BY ordinal_position"
        ).fetchall()
    ]
    marked = [
        sql.SQL("{} || coalesce(logs, '') AS logs").format(sql.Literal(MARK))
        if column == "logs"
        else sql.Identifier(str(column))
        for column in columns
    ]
    conn.execute("CREATE SCHEMA replica")
    conn.execute(
        sql.SQL("CREATE VIEW replica.predictions AS SELECT {} FROM public.predictions").format(
            sql.SQL(", ").join(marked)
        )
    )
    conn.execute(
        "CREATE VIEW replica.usage_records AS "
        "SELECT * FROM public.usage_records UNION ALL SELECT * FROM public.usage_records"
    )


@pytest.fixture
def urls(services: ServiceUrls) -> Iterator[tuple[str, str]]:
    """(primary URL, read URL) of a fresh migrated database."""
    primary = create_database(services.database_url, f"conduit_reads_{uuid.uuid4().hex[:12]}")
    migrate(primary)
    with psycopg.connect(_conninfo(primary), autocommit=True) as conn:
        _replica_views(conn)
    yield primary, f"{primary}?options={quote(REPLICA_OPTIONS)}"


def test_the_replica_refuses_writes(urls: tuple[str, str]) -> None:
    """The test's replica is a real guard: a write through it fails."""
    _, read_url = urls
    with psycopg.connect(_conninfo(read_url)) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO models (owner, name) VALUES ('o', 'm')")


def test_the_api_reads_predictions_and_usage_from_the_replica(
    urls: tuple[str, str], services: ServiceUrls, tmp_path: Path
) -> None:
    primary, read_url = urls
    admin = Admin(primary)
    launcher = Launcher(
        {**base_env(primary, services.redis_url), "CONDUIT_DATABASE_READ_URL": read_url}, tmp_path
    )
    try:
        _, api_url = launcher.api()
        _, runner_url = launcher.runner("echo", concurrency=2)
        admin.create_model(ECHO, runner_url)
        # A deployment of its own: the session's stack shares this Redis, and its director
        # would read (and drop, not finding the rows) entries queued for a shared name.
        deployment = f"conduit/replica-{uuid.uuid4().hex[:8]}"
        admin.create_deployment(deployment, ECHO, visibility="public")
        launcher.director(deployment, runner_url, concurrency=2)
        path = f"/v1/deployments/{deployment}/predictions"
        token = admin.create_account(f"acct-{uuid.uuid4().hex[:10]}")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api_url, headers=headers, timeout=30) as client:
            created = [create(client, path, input={"prompt": f"p{i}"}) for i in range(3)]
            for prediction in created:  # answered by the create, from the primary
                assert not (prediction["logs"] or "").startswith(MARK)
                done = wait_status(client, prediction["id"])
                assert done["status"] == "succeeded", done
                assert done["logs"].startswith(MARK), done  # GET: the replica
            listed = client.get("/v1/predictions").json()["results"]
            assert len(listed) == 3
            assert all(p["logs"].startswith(MARK) for p in listed)
            assert client.get("/v1/usage").json()["predictions"] == 6  # each record twice
            canceled = client.post(f"/v1/predictions/{created[0]['id']}/cancel")
            assert canceled.status_code == 200, canceled.text  # a write: the primary
    finally:
        launcher.stop_all()
