"""A shuffle-sharding collision, seen and undone: a light account whose shards are all among
a flooder's is named on the fairness page, ``conduit admin move-shards`` moves it away, and its
new predictions are served while the flood still waits; what it queued before the move is read
where it lies."""

from __future__ import annotations

import uuid

import httpx
import psycopg
import pytest
from playwright.sync_api import Page

from core.ids import token_sha256
from tests.conftest import Stack
from tests.fixtures.admin import Admin, run_admin_cli
from tests.fixtures.api import wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for
from tracker.keys import DEFAULT_SHARDS, account_shards

pytestmark = pytest.mark.e2e

FLOOD = 30
#: Each flood prediction's run: the flood takes a few seconds to drain on one slot.
WORK = {"delay": 0.1}


def _account_id(database_url: str, token: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT account_id FROM api_tokens WHERE token_sha256 = %s", (token_sha256(token),)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _cornered_name(owner: str, heavy: int, light: int) -> str:
    """A deployment name on which both accounts hash to the same shards (1 in 120)."""
    for _ in range(50_000):
        name = f"{owner}/flood-{uuid.uuid4().hex[:8]}"
        mine = account_shards(light, f"dp-{name}", DEFAULT_SHARDS)
        if mine == account_shards(heavy, f"dp-{name}", DEFAULT_SHARDS):
            return name
    raise AssertionError("no deployment name puts the two accounts on the same shards")


def _create(api_url: str, token: str, deployment: str, n: int) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=30) as http:
        made = [
            http.post(f"/v1/deployments/{deployment}/predictions", json={"input": WORK})
            for _ in range(n)
        ]
    assert all(r.status_code == 201 for r in made), [r.text for r in made]
    return [r.json()["id"] for r in made]


def _unfinished(database_url: str, ids: list[str]) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM predictions WHERE id = ANY(%s) AND completed_at IS NULL",
            (ids,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_cornered_account_is_shown_then_moved_off_the_flood(
    ops_page: Page,
    stack: Stack,
    admin: Admin,
    launcher: Launcher,
    database_url: str,
    redis_url: str,
) -> None:
    owner = f"shards{uuid.uuid4().hex[:8]}"
    heavy_name, light_name = f"{owner}-heavy", f"{owner}-light"
    heavy, light = admin.create_account(heavy_name), admin.create_account(light_name)
    heavy_id, light_id = (_account_id(database_url, t) for t in (heavy, light))
    deployment = _cornered_name(owner, heavy_id, light_id)
    _, runner_url = launcher.runner("echo", concurrency=1)
    admin.create_model(f"{owner}/model", runner_url)
    admin.create_deployment(
        deployment, f"{owner}/model", shards=DEFAULT_SHARDS, visibility="public"
    )
    flood = _create(stack.api_url, heavy, deployment, FLOOD)
    before = _create(stack.api_url, light, deployment, 2)  # behind the flood, on its shards

    # The fairness page names the light account as sharing all of the heaviest's shards.
    ops_page.goto(f"{stack.api_url}/ops/fairness")
    row = ops_page.locator("#collisions tr", has_text=deployment).inner_text()
    assert heavy_name in row and "1 in 120" in row
    assert f"{light_name} (" in row and "all its shards" in row

    moved = run_admin_cli(
        database_url,
        redis_url,
        "move-shards",
        light_name,
        "--deployment",
        deployment,
        "--away-from",
        heavy_name,
    )
    assert moved.returncode == 0, moved.stderr
    assert "entries queued before stay" in moved.stdout
    ops_page.goto(f"{stack.api_url}/ops/fairness")
    row = ops_page.locator("#collisions tr", has_text=deployment).inner_text()
    assert light_name not in row  # off the heaviest's shards now

    after = _create(stack.api_url, light, deployment, 3)
    launcher.director(deployment, runner_url, concurrency=1)
    with httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {light}"}, timeout=30
    ) as http:
        for prediction in after:
            assert wait_status(http, prediction)["status"] == "succeeded"
    # Served in turn beside the flood, not after it: most of the flood still waits.
    assert _unfinished(database_url, flood) >= FLOOD // 2

    # What it queued before the move is read where it lies, as is the whole flood.
    wait_for(lambda: _unfinished(database_url, flood + before) == 0, "everything run", 120)
