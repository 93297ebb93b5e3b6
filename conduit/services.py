"""Throwaway local Redis and PostgreSQL servers for ``conduit dev`` (and the test suite).

This module owns child server processes and nothing else: binary discovery (plus an
``apt-get`` install when running as root on Debian/Ubuntu), start with a readiness deadline,
stop, and ``local_services`` which uses ``REDIS_URL``/``DATABASE_URL`` when given and otherwise
starts throwaway servers in a temporary directory. It never touches system-wide services or
their data directories. What only the tests do to these servers (pause, resume, restart,
a database per test) lives with them, in ``tests/fixtures/servers.py``.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg

from core.ports import LOOPBACK as HOST
from core.ports import free_port

PG_BIN_GLOBS = (
    "/usr/lib/postgresql/*/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql@*/bin",
    "/usr/local/opt/postgresql@*/bin",
)
_POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
_DEBIAN_VERSION = Path("/etc/debian_version")
_BREW_NAMES = {"redis-server": "redis", "postgresql": "postgresql@16"}


class ServicesUnavailable(RuntimeError):
    """Server binaries are missing (and could not be installed), or cannot be run here."""


class ServerStartError(RuntimeError):
    """A server exited during startup or was not ready before its deadline."""


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


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


def postgres_bindir() -> Path | None:
    """Directory holding ``initdb`` and ``postgres``: PATH first, then the highest version."""
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).parent / "postgres").exists():
        return Path(initdb).parent
    found = [Path(d) for pat in PG_BIN_GLOBS for d in glob.glob(pat)]
    found = [d for d in found if (d / "initdb").exists() and (d / "postgres").exists()]
    key = lambda d: tuple(int(n) for n in re.findall(r"\d+", str(d)))  # noqa: E731
    return max(found, key=key, default=None)


def _missing_packages(redis: bool, postgres: bool) -> list[str]:
    missing = []
    if redis and shutil.which("redis-server") is None:
        missing.append("redis-server")
    if postgres and postgres_bindir() is None:
        missing.append("postgresql")
    return missing


def install_hint(packages: list[str]) -> str:
    brew = " ".join(_BREW_NAMES[p] for p in packages)
    return (
        f"local server binaries missing ({', '.join(packages)}): install them with "
        f"`sudo apt-get install {' '.join(packages)}` (Debian/Ubuntu) or `brew install {brew}` "
        "(macOS), or set REDIS_URL/DATABASE_URL to existing servers"
    )


def apt_install(packages: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    created = not _POLICY_RC_D.exists()
    if created:  # forbid maintainer scripts from starting the distro's own services
        _POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n")
        _POLICY_RC_D.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update"], check=True, env=env)
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
        subprocess.run(cmd, check=True, env=env)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ServicesUnavailable(f"apt-get failed ({exc}); {install_hint(packages)}") from exc
    finally:
        if created:
            _POLICY_RC_D.unlink(missing_ok=True)


def ensure_binaries(redis: bool = True, postgres: bool = True) -> None:
    """Make sure the requested server binaries exist, installing them via apt if possible."""
    missing = _missing_packages(redis, postgres)
    if not missing:
        return
    debian = _DEBIAN_VERSION.exists() and shutil.which("apt-get") is not None
    if os.geteuid() == 0 and debian:
        apt_install(missing)
        missing = _missing_packages(redis, postgres)
        if not missing:
            return
    raise ServicesUnavailable(install_hint(missing))


def postgres_account() -> dict[str, Any]:
    """Popen kwargs to run Postgres as ``postgres`` when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        if shutil.which("useradd") is None:
            raise ServicesUnavailable(
                "PostgreSQL refuses to run as root and there is no 'postgres' user: "
                "create one (`useradd --system --user-group postgres`) or run as a normal user"
            ) from None
        cmd = ["useradd", "--system", "--user-group", "--no-create-home", "postgres"]
        subprocess.run(cmd, check=True, capture_output=True)
        pw = pwd.getpwnam("postgres")
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _children(pid: int) -> list[int]:
    if not os.path.isdir("/proc"):  # macOS
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):  # field 4 of /proc/PID/stat is the ppid; comm may hold spaces
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def check_traversable(path: Path, uid: int, gid: int) -> None:
    for parent in path.parents:
        st = parent.stat()
        bit = (
            stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        )
        if not st.st_mode & bit:
            raise ServicesUnavailable(
                f"postgres runs as user 'postgres' (we are root) and cannot enter {parent}: "
                f"`chmod o+x {parent}` or use a workdir whose parents it can search"
            )


_CHILD: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
_LIVE: set[Server] = set()


@atexit.register
def _stop_all() -> None:  # safety net: never leave servers behind on interpreter exit
    for server in list(_LIVE):
        server.stop(timeout=5)


class Server:
    """A child server process on 127.0.0.1:port whose files live in ``workdir``."""

    name = "server"
    stop_signal = signal.SIGTERM
    start_timeout = 10.0

    def __init__(self, workdir: str | os.PathLike[str], port: int | None = None) -> None:
        self.workdir = Path(workdir).absolute()
        self.port = port if port is not None else free_port()
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_bytes()[-8192:].decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> dict[str, Any]:
        """Create directories; return extra Popen kwargs."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return {}

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float | None = None) -> Self:
        """Start the server and block until it accepts connections (or raise)."""
        if self.running:
            raise RuntimeError(f"{self.name} already running (pid {self.pid})")
        kwargs = self._prepare()
        if not port_is_free(self.port):
            raise ServerStartError(f"{self.name}: port {HOST}:{self.port} is already in use")
        # Own session: a terminal's Ctrl-C only reaches us, and we stop the servers in order.
        with open(self.log_path, "ab") as log:
            self._proc = proc = subprocess.Popen(
                self._argv(),
                stdout=log,
                **_CHILD,
                cwd=self.workdir,
                start_new_session=True,
                **kwargs,
            )
        _LIVE.add(self)
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self._ready():
            if proc.poll() is not None:
                _LIVE.discard(self)
                raise ServerStartError(
                    f"{self.name} exited with code {proc.returncode} during startup; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(
                    f"{self.name} not ready on port {self.port} after {limit:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.02)
        return self

    def _signal_all(self, sig: signal.Signals) -> None:
        """Signal the server's process group and its direct children (postgres children call
        setsid(), so the group alone misses them). Only while the leader is unreaped (its pid
        cannot be reused), and with the leader frozen so it neither forks nor reaps meanwhile."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with suppress(ProcessLookupError):
            if sig != signal.SIGCONT:
                os.kill(proc.pid, signal.SIGSTOP)
            for pid in _children(proc.pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, sig)
            os.killpg(proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown signal, wait up to ``timeout``, then SIGKILL everything."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(self.stop_signal)
            self._signal_all(signal.SIGCONT)  # a paused server must wake up to exit
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_all(signal.SIGKILL)
                proc.wait()
        _LIVE.discard(self)

    def kill(self) -> None:
        """SIGKILL the server and all its processes (one that never became ready; a crash)."""
        self._signal_all(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()
        _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self if self.running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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
                    cmd, stdout=log, cwd=self.workdir, **_CHILD, **kwargs
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
