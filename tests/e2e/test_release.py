"""A deployment's new version takes over its queue (blue/green): what waited when the release
came runs on the new version's director, what ran finishes on the old one, nothing is lost."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import wait_status
from tests.fixtures.fleet_entries import registered
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def team(admin: Admin, stack: Stack) -> Iterator[tuple[str, httpx.Client]]:
    name = f"rel-{uuid.uuid4().hex[:8]}"
    token = admin.create_account(name)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as client:
        yield name, client


def test_a_new_version_drains_the_old_versions_queue(
    team: tuple[str, httpx.Client],
    admin: Admin,
    launcher: Launcher,
    redis_url: str,
    database_url: str,
) -> None:
    owner, client = team
    _, blue_runner = launcher.runner("echo", concurrency=1)
    _, green_runner = launcher.runner("echo", concurrency=2)
    schema = httpx.get(f"{green_runner}/openapi.json").json()
    with registered(redis_url, "cpu"):
        made = client.post(
            "/v1/models",
            json={"owner": owner, "name": "app", "visibility": "private", "hardware": "cpu"},
        )
        assert made.status_code == 201, made.text
        blue = admin.create_model(f"{owner}/app", blue_runner)
        green = admin.register_version(f"{owner}/app", schema, "green")
        deployed = client.post(
            "/v1/deployments",
            json={
                "name": "app",
                "model": f"{owner}/app",
                "version": blue,
                "hardware": "cpu",
                "min_instances": 1,
                "max_instances": 2,
            },
        )
        assert deployed.status_code == 201, deployed.text
    fast = {"RELEASE_CHECK_INTERVAL": "0.2"}
    launcher.director(f"{owner}/app", blue_runner, concurrency=1, **fast)
    # The green fleet is up before the release: it reads only its version's own streams.
    launcher.director(f"{owner}/app", green_runner, concurrency=2, version=green, **fast)

    def create(text: str, n: int = 1, delay: float = 0.0) -> str:
        answer = client.post(
            f"/v1/deployments/{owner}/app/predictions",
            json={"input": {"prompt": text, "n": n, "delay": delay}},
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    before = create("before")
    assert wait_status(client, before)["version"] == blue
    # Blue's one slot is busy for 5 s: seen processing (written after 1 s) well before its end.
    long = create("long", n=100, delay=0.05)
    wait_for(
        lambda: client.get(f"/v1/predictions/{long}").json()["status"] == "processing",
        "the long one running",
    )
    waiting = [create(f"wait-{i}") for i in range(5)]

    released = client.patch(f"/v1/deployments/{owner}/app", json={"version": green})
    assert released.status_code == 200, released.text
    assert released.json()["current_release"]["version"] == green
    assert released.json()["current_release"]["number"] == 2
    after = [create(f"after-{i}") for i in range(3)]

    finished = {pid: wait_status(client, pid, timeout=60) for pid in [long, *waiting, *after]}
    assert {p["status"] for p in finished.values()} == {"succeeded"}
    assert finished[long]["version"] == blue  # it was running: it ends where it ran
    assert {finished[pid]["version"] for pid in [*waiting, *after]} == {green}
    with psycopg.connect(database_url) as db:
        owners = dict(
            db.execute(
                "SELECT id, claim_owner FROM predictions WHERE id = ANY(%s)",
                ([before, long, *waiting, *after],),
            ).fetchall()
        )
        ran = db.execute(
            "SELECT version_id, count(*) FROM usage_records WHERE prediction_id = ANY(%s)"
            " GROUP BY version_id",
            ([long, *waiting, *after],),
        ).fetchall()
    assert owners[before] == owners[long]  # the blue director
    assert {owners[pid] for pid in [*waiting, *after]} == {owners[waiting[0]]} != {owners[long]}
    assert dict(ran) == {blue: 1, green: 8}  # usage follows the version that ran
