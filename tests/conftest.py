"""Session-wide real services and a running Conduit stack.

Redis and Postgres are throwaway servers started for the session unless
``CONDUIT_TEST_REDIS_URL`` / ``CONDUIT_TEST_DATABASE_URL`` point at existing ones; either way
the tests get a fresh, migrated database of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.runtime import migrate
from conduit.services import ServiceUrls, local_services
from tests.faults import report as drill_report
from tests.fixtures import scheduling
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher, base_env
from tests.fixtures.servers import create_database
from tests.fixtures.tls import share_default_context
from tracker.db import make_engine

ECHO = "conduit/echo"

# Thousands of short-lived httpx clients: one CA bundle load per process, not per client.
share_default_context()


@pytest.fixture(scope="session")
def services() -> Iterator[ServiceUrls]:
    with local_services(
        os.environ.get("CONDUIT_TEST_REDIS_URL"), os.environ.get("CONDUIT_TEST_DATABASE_URL")
    ) as urls:
        yield urls


@pytest.fixture(scope="session")
def database_url(services: ServiceUrls) -> str:
    url = create_database(services.database_url, f"conduit_test_{uuid.uuid4().hex[:12]}")
    migrate(url)
    return url


@pytest.fixture(scope="session")
def redis_url(services: ServiceUrls) -> str:
    return services.redis_url


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the session's migrated database, for tests of the store itself."""
    engine = make_engine(database_url, pool_size=2)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def admin(database_url: str) -> Admin:
    return Admin(database_url)


@pytest.fixture(scope="session")
def launcher(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Launcher]:
    logdir: Path = tmp_path_factory.mktemp("logs")
    launcher = Launcher(base_env(database_url, redis_url), logdir)
    _session_launchers.append(launcher)
    yield launcher
    _session_launchers.remove(launcher)
    launcher.stop_all()


#: The session's launcher once a test asked for it (a file that needs none never makes one).
_session_launchers: list[Launcher] = []


@pytest.fixture(autouse=True, scope="module")
def _stop_what_a_file_started() -> Iterator[None]:
    """After each test file, stop the processes it started from the session's launcher; the
    session's own stacks (``stack``, the gateway's ``live``) stay."""
    yield
    for launcher in _session_launchers:
        launcher.stop_passing()


@dataclass(frozen=True)
class Stack:
    api_url: str
    runner_url: str
    version: str


@pytest.fixture(scope="session")
def stack(launcher: Launcher, admin: Admin) -> Stack:
    """api + echo runner (4 slots) + director for deployment conduit/echo, public: every
    test's own account runs on it."""
    with launcher.session_long():
        _, api_url = launcher.api()
        # Everything started from here on renders prediction URLs against this api.
        launcher.env["CONDUIT_PUBLIC_URL"] = api_url
        _, runner_url = launcher.runner("echo", concurrency=4)
        version = admin.create_model(ECHO, runner_url)
        admin.create_deployment(ECHO, ECHO, visibility="public")
        launcher.director(ECHO, runner_url, concurrency=4)
    return Stack(api_url, runner_url, version)


@pytest.fixture
def token(admin: Admin) -> str:
    return admin.create_account(f"acct-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def client(stack: Stack, token: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
        yield http


# --- the fault drills' table, one for the whole run (pytest-xdist workers hand theirs over) ---


def pytest_sessionfinish(session: pytest.Session) -> None:
    drill_report.hand_over(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    drill_report.take_over(getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    drill_report.write_table(terminalreporter)


# --- how the suite is spread over pytest-xdist workers (tests/fixtures/scheduling.py) ---


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    scheduling.heavy_first(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    return scheduling.DrillsTogether(config, log)
