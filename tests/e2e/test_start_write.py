"""A run's start is written to Postgres only once it has run ``start_write_delay`` seconds:
``GET`` shows ``processing`` within that bound, with the time the model really began, and a run
that ends sooner has its start written with its end, in one write.

A trigger on the worker's own ``predictions`` table records each status change with the
transaction that made it, for this module's deployment only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import psycopg
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher

START_WRITE_DELAY = 1.0
TERMINAL = {"succeeded", "failed", "canceled", "aborted"}

_TRIGGER = """
CREATE TABLE IF NOT EXISTS status_writes (
    prediction_id text, old_status text, new_status text, txid bigint DEFAULT txid_current()
);
CREATE OR REPLACE FUNCTION record_status_write() RETURNS trigger AS $$
BEGIN
    IF NEW.deployment = %(deployment)s THEN
        INSERT INTO status_writes (prediction_id, old_status, new_status)
        VALUES (NEW.id, OLD.status, NEW.status);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER record_status_writes AFTER UPDATE ON predictions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION record_status_write();
"""


@pytest.fixture(scope="module")
def deferred(stack: Stack, launcher: Launcher, admin: Admin, database_url: str) -> Iterator[str]:
    """A deployment of the echo version whose director writes starts after the delay, with
    its status writes recorded."""
    name = f"conduit/deferred-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, version=stack.version, visibility="public")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(_TRIGGER.replace("%(deployment)s", "'" + name + "'"))
    director = launcher.director(
        name, stack.runner_url, concurrency=2, start_write_delay=str(START_WRITE_DELAY)
    )
    try:
        yield name
    finally:
        director.stop()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER IF EXISTS record_status_writes ON predictions")
            conn.execute("DROP FUNCTION IF EXISTS record_status_write()")
            conn.execute("DROP TABLE IF EXISTS status_writes")


def _status_writes(database_url: str, prediction_id: str) -> list[tuple[str, str, int]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT old_status, new_status, txid FROM status_writes WHERE prediction_id = %s"
            " ORDER BY txid",
            (prediction_id,),
        ).fetchall()
    return [(old, new, txid) for old, new, txid in rows]


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_long_run_shows_processing_within_the_bound_from_its_real_start(
    client: httpx.Client, deferred: str, database_url: str
) -> None:
    path = f"/v1/deployments/{deferred}/predictions"
    created = create(client, path, input={"prompt": "long", "n": 3, "delay": 2.0})
    seen = wait_status(client, created["id"], {"processing", *TERMINAL}, timeout=60)
    seen_at = datetime.now(UTC)
    assert seen["status"] == "processing", seen  # shown while it runs, not only at its end
    done = wait_status(client, created["id"], timeout=60)
    assert done["status"] == "succeeded", done
    assert done["started_at"] == seen["started_at"]
    # Written late, the start still says when the model began: the write came at least the
    # delay after it (a start written at once is seen a poll after it).
    assert (seen_at - _at(seen["started_at"])).total_seconds() >= 0.9 * START_WRITE_DELAY
    writes = _status_writes(database_url, created["id"])
    assert [(old, new) for old, new, _ in writes] == [
        ("starting", "processing"),
        ("processing", "succeeded"),
    ]


def test_a_run_shorter_than_the_bound_has_its_start_written_with_its_end(
    client: httpx.Client, deferred: str, database_url: str
) -> None:
    path = f"/v1/deployments/{deferred}/predictions"
    created = create(client, path, input={"prompt": "short", "n": 2, "delay": 0.1})
    done = wait_status(client, created["id"], timeout=60)
    assert done["status"] == "succeeded", done
    writes = _status_writes(database_url, created["id"])
    assert [(old, new) for old, new, _ in writes] == [("starting", "succeeded")]
    started, completed = _at(done["started_at"]), _at(done["completed_at"])
    assert _at(done["created_at"]) <= started <= completed
    assert done["metrics"]["predict_time"] > 0
