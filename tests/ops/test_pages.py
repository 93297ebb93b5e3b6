"""Every page answers without a console error, and what the others act on: dead letters,
webhooks, the directors and runners, the gateway's registry and request log."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import redis
from playwright.sync_api import Page

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import wait_status
from tests.fixtures.browser import Console
from tests.fixtures.waiting import wait_for
from tests.ops.seeding import idle_deployment
from tracker import keys

pytestmark = pytest.mark.e2e

PAGES = [
    "/ops",
    "/ops/workers",
    "/ops/predictions",
    "/ops/failed",
    "/ops/webhooks",
    "/ops/fairness",
    "/ops/gateway",
    "/ops/actions",
]


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def test_every_page_renders_without_a_console_error(
    ops_page: Page, stack: Stack, client: httpx.Client, console: Console
) -> None:
    created = client.post("/v1/deployments/conduit/echo/predictions", json={"input": {}})
    wait_status(client, created.json()["id"])
    for path in PAGES:
        answer = ops_page.goto(f"{stack.api_url}{path}")
        assert answer is not None and answer.status == 200, path
        assert ops_page.locator("h1").count() >= 1, path
    ops_page.goto(f"{stack.api_url}/ops/workers")
    directors = ops_page.locator("table").first.inner_text()
    assert "alive, key expires in" in directors  # the stack's echo director
    assert stack.runner_url in ops_page.locator("table").nth(1).inner_text()
    said = ops_page.locator("h3", has_text=stack.runner_url).inner_text()
    assert "conduit-echo" in said and "health" in said  # the runner's own capability document
    assert console.errors == []


def test_a_dead_letter_is_listed_and_discarded_with_an_audit_row(
    ops_page: Page,
    stack: Stack,
    admin: Admin,
    redis_url: str,
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    idle = idle_deployment(admin, stack)
    dead = keys.dead_letter_stream(idle.streams()[0])
    r = redis.Redis.from_url(redis_url)
    try:
        entry = r.xadd(
            dead,
            {
                "id": "pgone",
                "entry": "1-0",
                "deliveries": "4",
                "reason": "runner kept dying",
                "consumer": "d9",
            },
        ).decode()
        ops_page.goto(f"{stack.api_url}/ops/failed")
        row = ops_page.locator("tr", has_text="runner kept dying")
        assert entry in row.inner_text()
        ops_page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button:has-text('discard')").click()
        ops_page.wait_for_url(re.compile(r".*/ops/failed\?message=.*"))
        assert r.xlen(dead) == 0
    finally:
        r.close()
    assert db.execute(
        "SELECT action FROM ops_actions WHERE subject = %s", (f"{dead} {entry}",)
    ).fetchall() == [("discard_dead",)]


def test_a_failed_webhook_is_retried_now_from_the_page(
    ops_page: Page,
    stack: Stack,
    client: httpx.Client,
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    created = client.post(
        "/v1/deployments/conduit/echo/predictions",
        json={
            "input": {},
            "webhook": "http://127.0.0.1:9/nobody",
            "webhook_events_filter": ["completed"],
        },
    )
    assert created.status_code == 201, created.text
    prediction_id = created.json()["id"]
    wait_status(client, prediction_id)

    def delivery() -> tuple[object, ...] | None:
        row = db.execute(
            "SELECT id, status, attempts FROM webhook_deliveries WHERE prediction_id = %s",
            (prediction_id,),
        ).fetchone()
        return row if row is not None and row[1] == "failed" else None

    delivery_id, _, attempts = wait_for(delivery, "the webhook given up", timeout=60)
    ops_page.goto(f"{stack.api_url}/ops/webhooks")
    row = ops_page.locator("tr", has_text=str(delivery_id))
    row.locator("button:has-text('retry now')").click()
    ops_page.wait_for_url(re.compile(r".*/ops/webhooks\?message=.*"))

    def tried_again() -> bool:
        row = db.execute(
            "SELECT attempts FROM webhook_deliveries WHERE id = %s", (delivery_id,)
        ).fetchone()
        return row is not None and int(row[0]) > int(attempts)  # type: ignore[call-overload]

    wait_for(tried_again, "another attempt", timeout=60)
    ops_page.goto(f"{stack.api_url}/ops/predictions/{prediction_id}")
    assert (
        str(delivery_id) in ops_page.locator("section", has_text="Webhook deliveries").inner_text()
    )


def test_the_request_log_search_says_what_it_ignored(ops_page: Page, stack: Stack) -> None:
    ops_page.goto(f"{stack.api_url}/ops/gateway?request=not-a-uuid&session={uuid.uuid4()}")
    assert "request: ignored (not a UUID)" in ops_page.content()
    assert "No log entry matches." in ops_page.content()
