"""The fleet registry on a live stack: a director registers the runner it drives, admins read
the fleet (``GET /v1/fleet``, ``conduit admin fleet``), and an entry goes when its director
does."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from api.app import create_app
from api.settings import ApiSettings
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher, Proc, base_env
from tests.fixtures.waiting import wait_for
from tracker.fleet import runner_entry_id

pytestmark = pytest.mark.e2e

#: Slots the runner advertises; its director sends fewer at once, so the entry's concurrency
#: can only have come from the runner's capabilities.
RUNNER_SLOTS = 3


def _admin_cli(database_url: str, redis_url: str, *args: str) -> str:
    ran = subprocess.run(
        [sys.executable, "-m", "conduit", "admin", *args],
        env=base_env(database_url, redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


@pytest.fixture(scope="module")
def runner(stack: Stack, launcher: Launcher, admin: Admin) -> tuple[str, str]:
    """A runner of its own, and the deployment it serves (private to its owner)."""
    _, url = launcher.runner("echo", concurrency=RUNNER_SLOTS)
    name = f"fleet-{uuid.uuid4().hex[:8]}/echo"
    admin.create_model(name, url)
    admin.create_deployment(name, name, shards=1)
    return url, name


@pytest.fixture(scope="module")
def admin_token(database_url: str, redis_url: str) -> str:
    name = f"ops-{uuid.uuid4().hex[:8]}"
    return _admin_cli(database_url, redis_url, "create-account", name, "--admin").strip()


def _fleet(stack: Stack, token: str) -> httpx.Response:
    return httpx.get(f"{stack.api_url}/v1/fleet", headers={"Authorization": f"Bearer {token}"})


def _entry(stack: Stack, token: str, entry_id: str) -> dict[str, Any] | None:
    response = _fleet(stack, token)
    assert response.status_code == 200, response.text
    return next((r for r in response.json()["runners"] if r["id"] == entry_id), None)


def _documented(body: Any) -> None:
    """The body matches ``GET /v1/fleet``'s schema in the OpenAPI document (schemathesis sees
    only the 404 of a non-admin account)."""
    doc = create_app(ApiSettings()).openapi()
    schema = {"$ref": "#/components/schemas/Fleet", "components": doc["components"]}
    Draft202012Validator(schema).validate(body)


def _director(launcher: Launcher, runner: tuple[str, str], public_url: str) -> Proc:
    url, name = runner
    return launcher.director(
        name,
        url,
        concurrency=1,
        runner_public_url=public_url,
        fleet_heartbeat_interval="0.2",
        fleet_ttl="1",
    )


def test_the_director_registers_its_runner_with_the_advertised_concurrency(
    stack: Stack,
    launcher: Launcher,
    runner: tuple[str, str],
    admin_token: str,
    database_url: str,
    redis_url: str,
) -> None:
    url, name = runner
    # Reached by api replicas at another address than the director's.
    public = url.replace("127.0.0.1", "localhost")
    entry_id = runner_entry_id(public)
    director = _director(launcher, runner, public)
    try:
        entry = wait_for(
            lambda: (e := _entry(stack, admin_token, entry_id)) and e["state"] == "ready" and e,
            "the runner's entry, ready",
        )
        assert entry["url"] == public
        assert entry["deployment"] == name
        assert entry["concurrency"] == RUNNER_SLOTS
        assert entry["kind"].startswith("conduit")  # its runnerType, not stock Cog
        assert entry["hardware"] == "cpu"
        assert len(entry["version_id"]) == 64
        assert entry["director"]
        assert 0 <= entry["heartbeat_age"]
        _documented(_fleet(stack, admin_token).json())

        table = _admin_cli(database_url, redis_url, "fleet")
        line = next(line for line in table.splitlines() if line.startswith(entry_id))
        assert line.split()[1:6] == [name, public, "ready", str(RUNNER_SLOTS), "cpu"]
        assert table.splitlines()[0].split() == [
            "ID",
            "DEPLOYMENT",
            "URL",
            "STATE",
            "CONCURRENCY",
            "HARDWARE",
            "HEARTBEAT",
        ]

        director.stop()  # graceful: the entry is deleted, not left to expire
        assert _entry(stack, admin_token, entry_id) is None
    finally:
        director.stop()


def test_a_killed_directors_entry_expires(
    stack: Stack, launcher: Launcher, runner: tuple[str, str], admin_token: str
) -> None:
    public = runner[0].replace("127.0.0.1", "127.0.0.2")
    entry_id = runner_entry_id(public)
    director = _director(launcher, runner, public)
    try:
        wait_for(lambda: _entry(stack, admin_token, entry_id), "the runner's entry")
        director.kill()
        wait_for(
            lambda: _entry(stack, admin_token, entry_id) is None,
            "the entry to expire once heartbeats stop",
        )
    finally:
        director.stop()


def test_the_fleet_is_invisible_to_accounts_that_are_not_admins(
    stack: Stack, token: str, admin: Admin, database_url: str, redis_url: str
) -> None:
    hidden = _fleet(stack, token)
    unknown = httpx.get(
        f"{stack.api_url}/v1/no-such-route", headers={"Authorization": f"Bearer {token}"}
    )
    assert hidden.status_code == unknown.status_code == 404
    assert hidden.headers["content-type"].startswith("application/problem+json")
    assert {k: v for k, v in hidden.json().items() if k != "instance"} == {
        k: v for k, v in unknown.json().items() if k != "instance"
    }
    assert httpx.get(f"{stack.api_url}/v1/fleet").status_code == 401

    name = f"ops-{uuid.uuid4().hex[:8]}"
    later = admin.create_account(name)
    assert _fleet(stack, later).status_code == 404
    said = _admin_cli(database_url, redis_url, "set-admin", name)
    assert said.strip() == f"account {name} is an admin"
    # Tokens are cached for CONDUIT_API_CACHE_TTL: the flag shows once the entry is re-read.
    wait_for(lambda: _fleet(stack, later).status_code == 200, "the admin flag to apply")
