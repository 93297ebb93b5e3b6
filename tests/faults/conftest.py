"""Fault drills run against their own throwaway Redis and Postgres (they kill and stop them),
never the session's or the machine's shared servers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conduit.cli import migrate
from conduit.services import PostgresServer, RedisServer, create_database
from tests.faults.harness import RESULTS, Drill
from tests.fixtures.admin import Admin
from tests.fixtures.faulty import REGISTRATION as FAULTY_MODEL
from tests.fixtures.processes import Launcher, base_env


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
    migrate(database_url)
    record = tmp_path / "invocations.txt"
    env = base_env(database_url, servers.redis.url)
    env["CONDUIT_FAULTY_RECORD"] = str(record)
    env["CONDUIT_RUNNER_MODELS"] = FAULTY_MODEL
    launcher = Launcher(env, tmp_path)
    admin = Admin(database_url)
    drill = Drill(launcher, admin, database_url, servers.redis.url, record)
    try:
        _, drill.api_url = launcher.api()
        launcher.env["CONDUIT_PUBLIC_URL"] = drill.api_url
        yield drill
    finally:
        launcher.kill_all()  # a drill's processes owe nothing to anyone at the end
        if os.environ.get("CONDUIT_DRILL_LOGS"):
            print(f"drill logs: {tmp_path}")


def register_faulty(drill: Drill, runner_url: str) -> None:
    drill.admin.create_model("drill/faulty", runner_url)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    write("")
    write("fault drills: submitted / terminal / lost / duplicate runs (explained) / seconds")
    for r in RESULTS:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items()))
        write(
            f"  {r.scenario:<44} {r.submitted:>4} {r.terminal:>4} {r.lost:>3} "
            f"{r.duplicates:>3} ({r.explained}) {r.seconds:>6}s  [{statuses}] {r.note}"
        )
