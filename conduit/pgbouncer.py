"""A throwaway PgBouncer in front of a Postgres server, for tests of Conduit behind a pooler.

Like the servers of :mod:`conduit.services`: binary discovery (plus an ``apt-get`` install
when running as root on Debian/Ubuntu), a free loopback port, files in a working directory,
start with a readiness deadline. Transaction pooling by default, the mode that lets many
client connections share few server ones, and that breaks statements prepared on a server
connection a later transaction does not get.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from conduit.services import (
    HOST,
    ServicesUnavailable,
    _apt_install,
    _check_traversable,
    _postgres_account,
    _Server,
)

_DEBIAN_VERSION = Path("/etc/debian_version")
_SBIN = Path("/usr/sbin/pgbouncer")  # Debian's package installs it outside a user's PATH
_HINT = (
    "pgbouncer is missing: install it with `sudo apt-get install pgbouncer` (Debian/Ubuntu) "
    "or `brew install pgbouncer` (macOS)"
)


def pgbouncer_binary() -> Path | None:
    found = shutil.which("pgbouncer")
    if found:
        return Path(found)
    return _SBIN if _SBIN.exists() else None


def ensure_pgbouncer() -> Path:
    """The pgbouncer binary, installed with apt-get when missing and running as root."""
    binary = pgbouncer_binary()
    debian = _DEBIAN_VERSION.exists() and shutil.which("apt-get") is not None
    if binary is None and os.geteuid() == 0 and debian:
        _apt_install(["pgbouncer"])
        binary = pgbouncer_binary()
    if binary is None:
        raise ServicesUnavailable(_HINT)
    return binary


class PgBouncer(_Server):
    """PgBouncer on 127.0.0.1, forwarding every database name to ``postgres_url``'s server.

    Authentication is ``trust`` for the user of ``postgres_url`` (the throwaway servers
    trust loopback clients too); the user must exist on the server.
    """

    name = "pgbouncer"
    start_timeout = 15.0

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        postgres_url: str,
        port: int | None = None,
        *,
        pool_mode: Literal["session", "transaction", "statement"] = "transaction",
        pool_size: int = 20,
    ) -> None:
        super().__init__(workdir, port)
        target = urlsplit(postgres_url)
        self.server_host = target.hostname or HOST
        self.server_port = target.port or 5432
        self.user = target.username or "postgres"
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self._binary: Path | None = None

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return urlunsplit(
            ("postgresql", f"{quote(self.user)}@{HOST}:{self.port}", "/" + quote(database), "", "")
        )

    def reroute(self, database_url: str) -> str:
        """``database_url`` (a database on the server behind) through this pooler."""
        return urlunsplit(urlsplit(database_url)._replace(netloc=f"{self.user}@{HOST}:{self.port}"))

    def _config(self) -> str:
        return "\n".join(
            [
                "[databases]",
                f"* = host={self.server_host} port={self.server_port}",
                "[pgbouncer]",
                f"listen_addr = {HOST}",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.workdir / 'userlist.txt'}",
                f"pool_mode = {self.pool_mode}",
                f"default_pool_size = {self.pool_size}",
                "max_client_conn = 1000",
                # Clients may set these at connect; PgBouncer refuses unknown ones otherwise.
                "ignore_startup_parameters = extra_float_digits,options",
                "",
            ]
        )

    def _prepare(self) -> dict[str, Any]:
        self._binary = ensure_pgbouncer()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.workdir / "pgbouncer.ini").write_text(self._config())
        kwargs = _postgres_account()  # PgBouncer refuses to run as root, like Postgres
        if kwargs:
            for path in (self.workdir, *self.workdir.iterdir()):
                os.chown(path, kwargs["user"], kwargs["group"])
            _check_traversable(self.workdir, kwargs["user"], kwargs["group"])
        return kwargs

    def _argv(self) -> list[str]:
        assert self._binary is not None
        return [str(self._binary), str(self.workdir / "pgbouncer.ini")]

    def _ready(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False
