"""Throwaway local Redis and PostgreSQL servers for ``conduit dev`` (and the test suite).

This module says which servers and how each is started and probed; ``local_services`` uses
``REDIS_URL``/``DATABASE_URL`` when given and otherwise starts throwaway servers in a temporary
directory. Finding (or installing) their binaries is :mod:`conduit.binaries`; running a child
process with a readiness deadline is :mod:`conduit.child_server`. It never touches system-wide
services or their data directories. What only the tests do to these servers (pause, resume,
restart, a database per test) lives with them, in ``tests/fixtures/servers.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from conduit.binaries import (
    ServicesUnavailable,
    check_traversable,
    ensure_binaries,
    install_hint,
    postgres_account,
    postgres_bindir,
)
from conduit.child_server import CHILD_STDIO, Server, ServerStartError
from core.ports import LOOPBACK as HOST

__all__ = ["PostgresServer", "RedisServer", "ServiceUrls", "local_services", "redis_command"]


def redis_command(port: int, *args: str, timeout: float = 1.0) -> bytes:
    """Send one RESP command to 127.0.0.1:port; return the first reply line (e.g. b"+PONG")."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(payload.encode())
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.split(b"\r\n", 1)[0]


class RedisServer(Server):
    """redis-server on 127.0.0.1 without persistence; its files live in ``workdir``."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def _argv(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServicesUnavailable(install_hint(["redis-server"]))
        opts = f"--port {self.port} --bind {HOST} --daemonize no".split()
        return [binary, *opts, *self.persistence(), "--save", "", "--dir", str(self.data_dir)]

    def persistence(self) -> list[str]:
        """The persistence options: none (a throwaway server)."""
        return ["--appendonly", "no"]

    def _ready(self) -> bool:
        try:
            return redis_command(self.port, "PING") == b"+PONG"
        except OSError:
            return False


class PostgresServer(Server):
    """A fresh PostgreSQL cluster (trust auth, user ``postgres``) in ``workdir/data``."""

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown; SIGTERM ("smart") waits for clients
    start_timeout = 30.0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def _prepare(self) -> dict[str, Any]:
        bindir = postgres_bindir()
        if bindir is None:
            raise ServicesUnavailable(install_hint(["postgresql"]))
        self._bindir = bindir
        self.workdir.mkdir(parents=True, exist_ok=True)
        kwargs = postgres_account()
        if kwargs:
            os.chown(self.workdir, kwargs["user"], kwargs["group"])
            check_traversable(self.workdir, kwargs["user"], kwargs["group"])
        if not (self.data_dir / "PG_VERSION").exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)
            cmd = [str(bindir / "initdb"), "-D", str(self.data_dir), "-A", "trust"]
            cmd += ["-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"]
            with open(self.log_path, "ab") as log:
                rc = subprocess.run(
                    cmd, stdout=log, cwd=self.workdir, **CHILD_STDIO, **kwargs
                ).returncode
            if rc != 0:
                raise ServerStartError(f"initdb failed ({rc}):\n{self.log_tail()}")
        return kwargs

    def _argv(self) -> list[str]:
        # Unix socket paths are limited to 107 bytes; fall back to TCP only when too long.
        sock = str(self.workdir)
        if len(f"{sock}/.s.PGSQL.{self.port}") > 107:
            sock = ""
        argv = [str(self._bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        argv += ["-k", sock, "-c", f"listen_addresses={HOST}"]
        for opt in ("fsync", "synchronous_commit", "full_page_writes"):
            argv += ["-c", f"{opt}=off"]
        return [*argv, "-c", "max_connections=200"]

    def _ready(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False


@dataclass(frozen=True)
class ServiceUrls:
    redis_url: str
    database_url: str
    started_redis: bool
    started_postgres: bool


@contextmanager
def local_services(
    redis_url: str | None = None, database_url: str | None = None
) -> Iterator[ServiceUrls]:
    """Yield service URLs, starting throwaway servers for whichever URL is not given."""
    start_redis, start_postgres = not redis_url, not database_url
    ensure_binaries(redis=start_redis, postgres=start_postgres)
    with ExitStack() as stack:
        if start_redis or start_postgres:
            tmp = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="conduit-", ignore_cleanup_errors=True)
            )
            os.chmod(tmp, 0o711)  # a root-started postgres runs as user postgres: let it in
        if start_redis:
            redis_url = stack.enter_context(RedisServer(Path(tmp, "redis"))).url
        if start_postgres:
            database_url = stack.enter_context(PostgresServer(Path(tmp, "postgres"))).url
        assert redis_url and database_url
        yield ServiceUrls(redis_url, database_url, start_redis, start_postgres)
