"""Fault drills run against their own throwaway Redis and Postgres (they kill and stop them),
never the session's or the machine's shared servers."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conduit.binaries import postgres_account
from conduit.runtime import migrate
from tests.faults.harness import Drill, drill_stack
from tests.fixtures.servers import PostgresServer, RedisServer, create_database

#: The database every drill runs on, in its own Postgres.
DRILL_DATABASE = "drill"


class DrillServers:
    def __init__(self, root: Path) -> None:
        self.redis = RedisServer(root / "redis", appendonly=True)
        self.postgres = PostgresServer(root / "postgres")

    @property
    def database_url(self) -> str:
        return self.postgres.url.rsplit("/", 1)[0] + "/" + DRILL_DATABASE


def _drill_root(prefix: str) -> tempfile.TemporaryDirectory[str]:
    tmp = tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True)
    Path(tmp.name).chmod(0o711)  # a root-started postgres runs as user postgres and must enter it
    return tmp


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[Path]:
    """A stopped Postgres data directory holding the migrated ``drill`` database, made once:
    each drill's own Postgres starts from a copy of it, not from initdb and the migrations
    (seconds of CPU per drill, on the suite's busiest worker)."""
    with _drill_root("conduit-drill-template-") as tmp:
        server = PostgresServer(Path(tmp) / "postgres")
        server.start()
        try:
            migrate(create_database(server.url, DRILL_DATABASE))
        finally:
            server.stop()
        yield server.data_dir


def _copy_cluster(template: Path, server: PostgresServer) -> None:
    """``template`` as ``server``'s data directory, owners and modes kept (``cp -a``)."""
    server.workdir.mkdir(parents=True, exist_ok=True)
    account = postgres_account()
    if account:
        os.chown(server.workdir, account["user"], account["group"])
    subprocess.run(["cp", "-a", str(template), str(server.data_dir)], check=True)


@pytest.fixture
def servers(postgres_template: Path) -> Iterator[DrillServers]:
    with _drill_root("conduit-drill-") as tmp:
        servers = DrillServers(Path(tmp))
        _copy_cluster(postgres_template, servers.postgres)
        servers.redis.start()
        servers.postgres.start()
        try:
            yield servers
        finally:
            servers.redis.stop()
            servers.postgres.stop()


@pytest.fixture
def drill(servers: DrillServers, tmp_path: Path) -> Iterator[Drill]:
    with drill_stack(Drill, servers.database_url, servers.redis.url, tmp_path) as drill:
        yield drill


def register_faulty(drill: Drill, runner_url: str) -> None:
    drill.admin.create_model("drill/faulty", runner_url)
