"""Read-your-writes across api replicas: a change to the catalogue answered by one replica is
seen by the next read on another at once, although that one caches the catalogue for minutes
(``CONDUIT_API_CACHE_TTL=300``): the writer announces it over Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin, run_admin_cli
from tests.fixtures.fleet_entries import registered
from tests.fixtures.processes import Launcher

pytestmark = pytest.mark.e2e

#: Long enough that only an announced change can reach the reader during the test.
LONG_TTL = {"CONDUIT_API_CACHE_TTL": "300"}


@pytest.fixture
def reader_url(launcher: Launcher, redis_url: str) -> Iterator[str]:
    with registered(redis_url, "cpu"), launcher.own_api(LONG_TTL) as url:
        yield url


def test_management_changes_are_seen_at_once_by_another_replica(
    stack: Stack, admin: Admin, reader_url: str
) -> None:
    owner = f"fresh-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {admin.create_account(owner)}"}
    with (
        httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as writer,
        httpx.Client(base_url=reader_url, headers=headers, timeout=30) as reader,
    ):
        model = f"/v1/models/{owner}/sketch"
        assert reader.get(model).status_code == 404  # cached as missing
        created = writer.post(
            "/v1/models",
            json={"owner": owner, "name": "sketch", "visibility": "private", "hardware": "cpu"},
        )
        assert created.status_code == 201, created.text
        assert reader.get(model).status_code == 200

        changed = writer.patch(model, json={"description": "draws"})
        assert changed.status_code == 200, changed.text
        assert reader.get(model).json()["description"] == "draws"

        version = admin.create_model(f"{owner}/sketch", stack.runner_url)
        deployment = f"/v1/deployments/{owner}/sketch"
        assert reader.get(deployment).status_code == 404  # cached as missing
        made = writer.post(
            "/v1/deployments",
            json={
                "name": "sketch",
                "model": f"{owner}/sketch",
                "version": version,
                "hardware": "cpu",
                "min_instances": 0,
                "max_instances": 1,
            },
        )
        assert made.status_code == 201, made.text
        assert (
            reader.get(deployment).json()["current_release"]["configuration"]["max_instances"] == 1
        )
        released = writer.patch(deployment, json={"max_instances": 2})
        assert released.status_code == 200, released.text
        assert (
            reader.get(deployment).json()["current_release"]["configuration"]["max_instances"] == 2
        )

        assert writer.delete(deployment).status_code == 204
        assert reader.get(deployment).status_code == 404
        assert writer.delete(f"{model}/versions/{version}").status_code == 204
        assert writer.delete(model).status_code == 204
        assert reader.get(model).status_code == 404


def test_an_operators_change_is_seen_at_once_by_every_replica(
    stack: Stack, admin: Admin, reader_url: str, database_url: str, redis_url: str
) -> None:
    owner = f"fresh-{uuid.uuid4().hex[:8]}"
    admin.create_account(owner)
    admin.create_model(f"{owner}/shown", stack.runner_url, visibility="private")
    other = {"Authorization": f"Bearer {admin.create_account(f'{owner}-other')}"}
    model = f"{reader_url}/v1/models/{owner}/shown"
    assert httpx.get(model, headers=other).status_code == 404  # private: cached as unseen
    made = run_admin_cli(
        database_url, redis_url, "set-visibility", "--model", f"{owner}/shown", "public"
    )
    assert made.returncode == 0, made.stderr
    assert httpx.get(model, headers=other).status_code == 200
