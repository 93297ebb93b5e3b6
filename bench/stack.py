"""A throwaway Conduit stack for benchmarks, built from the test suite's fixtures.

:func:`running_stack` starts Redis and Postgres (:func:`conduit.services.local_services`),
creates and migrates a database, and yields a :class:`BenchStack` whose methods start runners,
directors, the api and the gateway as subprocesses (:class:`tests.fixtures.processes.Launcher`)
and create accounts, models and deployments (:class:`tests.fixtures.admin.Admin`). Leaving the
context stops every process and server it started, also on errors, after printing their log
tails.

Unlike the tests, settings are left at their production defaults (webhook polling, the
director's retry interval), so the figures describe a stack as deployed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from conduit.runtime import migrate
from conduit.services import local_services
from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher, Proc, _ready, base_env
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent

# base_env() tunes these for fast tests; benchmarks want the defaults.
_TEST_ONLY: tuple[str, ...] = ("CONDUIT_WEBHOOK_RETRY_SCHEDULE", "CONDUIT_WEBHOOK_RETRY_JITTER")


class ModuleProc(Proc):
    """A :class:`Proc` running ``python -m <module>`` rather than ``python -m conduit``."""

    def __init__(
        self, module: str, name: str, args: list[str], env: dict[str, str], logdir: Path
    ) -> None:
        super().__init__(name, args, env, logdir)
        self.module = module

    def start(self) -> ModuleProc:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self


class BenchStack:
    def __init__(self, launcher: Launcher, admin: Admin, database_url: str, redis_url: str) -> None:
        self.launcher = launcher
        self.admin = admin
        self.database_url = database_url
        self.redis_url = redis_url
        #: Started processes by role ("api", "director", "runner", or a module's name).
        self.roles: dict[str, list[Proc]] = {}

    def _track(self, role: str, proc: Proc) -> Proc:
        self.roles.setdefault(role, []).append(proc)
        return proc

    def runner(
        self, concurrency: int = 4, model: str = "echo", env: dict[str, str] | None = None
    ) -> str:
        """A stock ``conduit runner <model>`` (``echo`` unless told); returns its URL once it
        is READY. ``env`` adds to the stack's environment (``CONDUIT_RUNNER_MODELS``)."""
        proc, url = self.launcher.runner(model, concurrency=concurrency, env=env)
        self._track("runner", proc)
        return url

    def module(
        self, module: str, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> ModuleProc:
        """``python -m <module> <args>`` with the stack's environment (``env`` over it),
        stopped at the end."""
        proc = ModuleProc(
            module,
            f"{len(self.launcher.procs) + 1:03d}-{name}",
            args,
            {**self.launcher.env, **(env or {})},
            self.launcher.logdir,
        )
        self.launcher.procs.append(proc.start())
        self._track(name, proc)
        return proc

    def stamped_runner(self, concurrency: int = 4) -> str:
        """A :mod:`bench.stamped_runner`; returns its URL once it is READY."""
        port = free_port()
        args = ["--port", str(port), "--concurrency", str(concurrency)]
        proc = self.module("bench.stamped_runner", "runner-stamped", args)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(proc, url), "stamped runner ready", timeout=30)
        return url

    def deploy(
        self, name: str, runner_url: str, concurrency: int = 4, *, director: bool = True
    ) -> None:
        """Model and deployment ``name`` on ``runner_url``, and (unless told not to) a director
        for it."""
        self.admin.create_model(name, runner_url)
        self.admin.create_deployment(name, name, visibility="public")
        if director:
            self.director(name, runner_url, concurrency)

    def director(
        self, deployment: str, runner_url: str, concurrency: int = 4, **settings: str
    ) -> Proc:
        """One more director for ``deployment``, driving the runner at ``runner_url``;
        ``settings`` become ``CONDUIT_DIRECTOR_*``.

        The director's id derives from deployment and runner URL, so two directors of one
        deployment need two runners (the sidecar layout anyway)."""
        settings.setdefault("retry_interval", "5")
        proc = self.launcher.director(deployment, runner_url, concurrency, None, **settings)
        return self._track("director", proc)

    def api(self, env: dict[str, str] | None = None) -> str:
        proc, url = self.launcher.api(env)
        self._track("api", proc)
        return url

    def gateway(self, env: dict[str, str] | None = None) -> str:
        """``conduit gateway`` on a free port; its ``host:port`` once it answers SERVING."""
        proc, address = self.launcher.gateway(env)
        self._track("gateway", proc)
        return address

    def token(self) -> str:
        return self.admin.create_account(f"bench-{uuid.uuid4().hex[:10]}")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on the stack's database (autocommit) and return its rows."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(
            f"--- {proc.name} ---\n" + "\n".join(proc.log().splitlines()[-lines:])
            for proc in self.launcher.procs
        )


@contextmanager
def running_stack() -> Iterator[BenchStack]:
    with (
        local_services() as services,
        tempfile.TemporaryDirectory(prefix="conduit-bench-") as logdir,
    ):
        database_url = create_database(services.database_url, f"bench_{uuid.uuid4().hex[:12]}")
        migrate(database_url)
        env = base_env(database_url, services.redis_url)
        for key in _TEST_ONLY:
            env.pop(key)
        # The peers limit nothing: one account's creates and one address's connections are
        # measured unthrottled (the defaults are 600 creates a minute and 1,024 connections).
        env["CONDUIT_API_CREATE_RATE_LIMIT"] = "off"
        env["CONDUIT_API_MAX_CONNECTIONS_PER_ADDRESS"] = "8192"
        launcher = Launcher(env, Path(logdir))
        stack = BenchStack(launcher, Admin(database_url), database_url, services.redis_url)
        try:
            yield stack
        except BaseException:
            print(stack.log_tails(), file=sys.stderr)
            raise
        finally:
            launcher.stop_all()
