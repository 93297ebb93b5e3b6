"""Concurrent ``conduit migrate`` runs (every replica migrating as it starts) are serialised by
an advisory lock: all succeed, and the schema is migrated once."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from alembic.script import ScriptDirectory

from conduit.services import ServiceUrls
from tests.fixtures.processes import base_env
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import wait_for
from tracker.db import MIGRATE_LOCK_KEY

ROOT = Path(__file__).resolve().parents[2]


def _conninfo(url: str) -> str:
    return re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", url)


def test_concurrent_migrations_wait_for_each_other(services: ServiceUrls) -> None:
    url = create_database(services.database_url, f"conduit_lock_{uuid.uuid4().hex[:12]}")
    env = base_env(url, services.redis_url)
    with psycopg.connect(_conninfo(url), autocommit=True) as holder:
        # Hold the lock so that both runs are surely inside their migration at once.
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK_KEY,))
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "conduit", "migrate"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]

        def both_waiting() -> bool:
            for run in runs:
                assert run.poll() is None, run.communicate()
            row = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            return row == (2,)

        wait_for(both_waiting, "both migrations waiting on the advisory lock", timeout=60)
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK_KEY,))
        outcomes = [(run.wait(timeout=60), *run.communicate()) for run in runs]
        for code, out, err in outcomes:
            assert code == 0, err
            assert "database migrated to head" in out

        head = ScriptDirectory(str(ROOT / "alembic")).get_current_head()
        versions = holder.execute("SELECT version_num FROM alembic_version").fetchall()
        assert versions == [(head,)]
        tables = holder.execute("SELECT to_regclass('predictions') IS NOT NULL").fetchone()
        assert tables == (True,)
