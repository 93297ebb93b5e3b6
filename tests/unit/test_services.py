"""Real-process tests for conduit.services (throwaway Redis / PostgreSQL servers)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conduit import binaries, child_server, services
from conduit.binaries import ServicesUnavailable
from conduit.child_server import ServerStartError
from conduit.services import local_services, redis_command
from tests.fixtures.servers import PostgresServer, RedisServer, create_database
from tests.fixtures.waiting import wait_for as shared_wait_for


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Not pytest's tmp_path: as root, postgres runs as user "postgres", which cannot enter
    # /tmp/pytest-of-root (0700); a mkdtemp dir directly under /tmp is reachable.
    with tempfile.TemporaryDirectory(prefix="conduit-test-") as d:
        yield Path(d)


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    shared_wait_for(cond, "condition", timeout, interval=0.01)


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def pg_value(url: str, query: str) -> Any:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_redis_ping_kill_restart_same_port(workdir: Path) -> None:
    with RedisServer(workdir) as r:
        port = r.port
        assert r.url == f"redis://127.0.0.1:{port}/0"
        assert redis_command(port, "PING") == b"+PONG"
        assert redis_command(port, "SET", "k", "v") == b"+OK"
        assert r in child_server._LIVE

        r.kill()
        assert not r.running and r not in child_server._LIVE
        wait_for(lambda: refused(port))

        r.restart()
        assert r.port == port and r.running
        assert redis_command(port, "PING") == b"+PONG"
        assert redis_command(port, "GET", "k") == b"$-1"  # crash: data lost

        redis_command(port, "SET", "k", "v")
        r.restart(keep_data=True)
        assert redis_command(port, "GET", "k") == b"$1"
        r.restart(keep_data=False)
        assert redis_command(port, "GET", "k") == b"$-1"
    assert not r.running and r not in child_server._LIVE
    assert refused(port)


def test_redis_pause_resume(workdir: Path) -> None:
    with RedisServer(workdir) as r:
        r.pause()
        with pytest.raises(TimeoutError):
            redis_command(r.port, "PING", timeout=0.2)
        r.resume()
        assert redis_command(r.port, "PING") == b"+PONG"
        r.pause()
    assert not r.running  # stop() wakes a paused server so it can exit


def test_redis_start_failure_shows_log_tail(workdir: Path) -> None:
    class BadRedis(RedisServer):
        def _argv(self) -> list[str]:
            return [*super()._argv(), "--no-such-directive", "1"]

    with pytest.raises(ServerStartError, match="no-such-directive"):
        BadRedis(workdir).start()


def test_port_in_use_is_refused(workdir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ServerStartError, match="already in use"):
            RedisServer(workdir, port=s.getsockname()[1]).start()


def test_postgres_select_restart_kill(workdir: Path) -> None:
    with PostgresServer(workdir) as pg:
        port = pg.port
        assert pg.url == f"postgresql://postgres@127.0.0.1:{port}/postgres"
        assert pg_value(pg.url, "SELECT 1") == 1
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (42)")

        pg.restart()
        assert pg.port == port
        assert pg_value(pg.url, "SELECT x FROM t") == 42

        pg.kill()
        with pytest.raises(psycopg.OperationalError):
            pg_value(pg.url, "SELECT 1")
        pg.restart()  # crash recovery on the same data dir
        assert pg_value(pg.url, "SELECT count(*) FROM t") == 1
    assert refused(port)


def proc_state(pid: int) -> str:
    """Process state letter from /proc (R, S, T=stopped, Z=zombie), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_postgres_pause_and_kill_reach_every_backend(workdir: Path) -> None:
    with PostgresServer(workdir) as pg, psycopg.connect(pg.url, autocommit=True) as conn:
        assert pg.pid is not None
        pg.pause()  # the frozen postmaster can neither fork nor reap: its children are stable
        backends = child_server._children(pg.pid)
        every = [pg.pid, *backends]
        assert len(backends) >= 3  # checkpointer, walwriter, ..., our client backend
        wait_for(lambda: all(proc_state(p) in "TZ" for p in every))  # Z: was already exiting
        pg.resume()
        wait_for(lambda: all(proc_state(p) != "T" for p in every))
        assert conn.execute("SELECT 1").fetchone() == (1,)

        pg.kill()  # backends run setsid(), so killing the process group alone would miss them
        wait_for(lambda: all(proc_state(p) in ("Z", "gone") for p in backends))
        pg.restart()
        assert pg_value(pg.url, "SELECT 1") == 1


def test_create_database(workdir: Path) -> None:
    with PostgresServer(workdir) as pg:
        url = create_database(pg.url, "conduit_isolated")
        assert url == f"postgresql://postgres@127.0.0.1:{pg.port}/conduit_isolated"
        assert pg_value(url, "SELECT current_database()") == "conduit_isolated"
        sa_url = pg.url.replace("postgresql://", "postgresql+psycopg://")
        assert create_database(sa_url, "other").startswith("postgresql+psycopg://")


def test_local_services_given_urls_start_nothing() -> None:
    with local_services("redis://example:1/0", "postgresql://example/db") as urls:
        assert urls == services.ServiceUrls(
            "redis://example:1/0", "postgresql://example/db", False, False
        )


def test_local_services_starts_missing_ones() -> None:
    before = set(child_server._LIVE)  # the session's own servers may be running too
    with local_services(None, None) as urls:
        assert urls.started_redis and urls.started_postgres
        port = int(urls.redis_url.rsplit(":", 1)[1].split("/")[0])
        assert redis_command(port, "PING") == b"+PONG"
        assert pg_value(urls.database_url, "SELECT 1") == 1
        assert len(child_server._LIVE - before) == 2
    assert child_server._LIVE == before
    assert refused(port)


def test_missing_binaries_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(binaries, "postgres_bindir", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ServicesUnavailable) as err:
        binaries.ensure_binaries(redis=True, postgres=True)
    msg = str(err.value)
    assert "`sudo apt-get install redis-server postgresql`" in msg
    assert "`brew install redis postgresql@16`" in msg
    assert "REDIS_URL/DATABASE_URL" in msg
    binaries.ensure_binaries(redis=False, postgres=False)  # nothing requested: no error


def test_apt_install_as_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    installed: list[str] = []
    calls: list[list[str]] = []
    policy = tmp_path / "policy-rc.d"
    debian = tmp_path / "debian_version"
    debian.write_text("12\n")

    def which(name: str) -> str | None:
        if name == "apt-get" or name in installed:
            return f"/usr/bin/{name}"
        return None

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        assert kw["env"]["DEBIAN_FRONTEND"] == "noninteractive"
        assert policy.read_text().endswith("exit 101\n")  # distro services must not start
        calls.append(cmd)
        if cmd[1] == "install":
            installed.extend(cmd[4:])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(shutil, "which", which)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(binaries, "_POLICY_RC_D", policy)
    monkeypatch.setattr(binaries, "_DEBIAN_VERSION", debian)
    binaries.ensure_binaries(redis=True, postgres=False)
    assert calls == [
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "redis-server"],
    ]
    assert not policy.exists()
