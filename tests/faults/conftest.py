"""Fault drills run against their own throwaway Redis and Postgres (they kill and stop them),
never the session's or the machine's shared servers."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.harness import Drill, drill_stack
from tests.fixtures.servers import PostgresServer, RedisServer, create_database


class DrillServers:
    def __init__(self, root: Path) -> None:
        self.redis = RedisServer(root / "redis", appendonly=True)
        self.postgres = PostgresServer(root / "postgres")


@pytest.fixture
def servers() -> Iterator[DrillServers]:
    with tempfile.TemporaryDirectory(prefix="conduit-drill-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        root.chmod(0o711)  # a root-started postgres runs as user postgres and must enter it
        servers = DrillServers(root)
        servers.redis.start()
        servers.postgres.start()
        try:
            yield servers
        finally:
            servers.redis.stop()
            servers.postgres.stop()


@pytest.fixture
def drill(servers: DrillServers, tmp_path: Path) -> Iterator[Drill]:
    database_url = create_database(servers.postgres.url, "drill")
    with drill_stack(Drill, database_url, servers.redis.url, tmp_path) as drill:
        yield drill


def register_faulty(drill: Drill, runner_url: str) -> None:
    drill.admin.create_model("drill/faulty", runner_url)
