"""Retry (one, and thousands in batches), cancel, and the audit of both; what the page shows
of hostile text and of live logs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from urllib.parse import quote

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
from tests.ops.seeding import Idle, idle_deployment, queue, seed_failed

pytestmark = pytest.mark.e2e


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def test_retry_makes_a_new_prediction_with_the_byte_identical_input(
    ops_page: Page, stack: Stack, client: httpx.Client, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    payload = {"prompt": 'ünïcödé ✓ "quoted" <b>', "n": 2, "fail": True}
    created = client.post("/v1/deployments/conduit/echo/predictions", json={"input": payload})
    failed = wait_status(client, created.json()["id"])
    assert failed["status"] == "failed"
    ops_page.goto(f"{stack.api_url}/ops/predictions/{failed['id']}")
    ops_page.once("dialog", lambda dialog: dialog.accept())
    ops_page.click("#retry")
    ops_page.wait_for_url(re.compile(r".*/ops/predictions/(?!" + failed["id"] + ")[^/?]+\\?.*"))
    new_id = ops_page.url.split("/ops/predictions/")[1].split("?")[0]
    assert ops_page.locator("#retry-of").inner_text() == failed["id"]
    (old_text, new_text) = (
        db.execute(
            "SELECT input::text FROM predictions WHERE id = %s", (prediction_id,)
        ).fetchone()[0]  # type: ignore[index]
        for prediction_id in (failed["id"], new_id)
    )
    assert new_text == old_text
    retried = wait_status(client, new_id)  # it really runs, as the original did
    assert retried["input"] == failed["input"] and retried["status"] == "failed"
    assert retried["logs"] == failed["logs"]
    ops_page.goto(f"{stack.api_url}/ops/predictions/{failed['id']}")
    assert ops_page.locator(".retry-link").inner_text() == new_id
    audit = db.execute(
        "SELECT action, subject FROM ops_actions WHERE subject = %s", (failed["id"],)
    ).fetchall()
    assert audit == [("retry", failed["id"])]


@pytest.fixture
def idle(admin: Admin, stack: Stack) -> Idle:
    return idle_deployment(admin, stack)


def test_bulk_retry_of_thousands_runs_in_batches_and_is_audited(
    ops_page: Page,
    stack: Stack,
    admin: Admin,
    idle: Idle,
    database_url: str,
    redis_url: str,
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    account = f"bulk-{uuid.uuid4().hex[:8]}"
    admin.create_account(account)
    marker = f"model exploded {uuid.uuid4().hex[:8]}"
    seed_failed(database_url, idle, account, 2500, marker)
    ops_page.goto(
        f"{stack.api_url}/ops/predictions?status=failed&error={quote(marker)}&account={account}"
    )
    assert ops_page.locator("#match-count").inner_text() == "2,500"
    ops_page.click("#retry-all")
    assert "2,500" in ops_page.locator("#confirm-count").inner_text()
    ops_page.click("#confirm-bulk")
    ops_page.wait_for_url(re.compile(r".*/ops/actions/\d+$"))
    action_id = int(ops_page.url.rsplit("/", 1)[1])
    # The page polls its progress; the overview answers meanwhile.
    assert ops_page.request.get(f"{stack.api_url}/ops").status == 200
    ops_page.locator("#action-status", has_text="done").wait_for(timeout=120_000)
    assert ops_page.locator("#action-done").inner_text() == "2,500"
    rows = db.execute(
        "SELECT r.retry_of, r.input::text = o.input::text, r.status, r.source "
        "FROM predictions r JOIN predictions o ON o.id = r.retry_of "
        "WHERE o.error LIKE %s",
        (marker + "%",),
    ).fetchall()
    assert len(rows) == 2500
    assert len({row[0] for row in rows}) == 2500  # each original retried once
    assert all(row[1] and row[2] == "starting" and row[3] == "ops" for row in rows)
    r = redis.Redis.from_url(redis_url)
    try:
        assert sum(int(r.xlen(stream)) for stream in idle.streams()) == 2500
    finally:
        r.close()
    audit = db.execute(
        "SELECT action, expected, done, status, filter->>'error' FROM ops_actions WHERE id = %s",
        (action_id,),
    ).fetchone()
    assert audit == ("retry_all", 2500, 2500, "done", marker)


def test_hostile_text_is_shown_as_text(
    ops_page: Page,
    stack: Stack,
    admin: Admin,
    idle: Idle,
    database_url: str,
    console: Console,
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    account = f"xss-{uuid.uuid4().hex[:8]}"
    admin.create_account(account)
    attack = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    seed_failed(database_url, idle, account, 1, attack)
    prediction_id = db.execute(
        "SELECT p.id FROM predictions p JOIN accounts a ON a.id = p.account_id WHERE a.name = %s",
        (account,),
    ).fetchone()[0]  # type: ignore[index]
    db.execute(
        "UPDATE predictions SET input = jsonb_build_object('prompt', %s::text, "
        "'api_key', 'sk-live-secret'), logs = %s WHERE id = %s",
        (attack, attack + "\n", prediction_id),
    )
    dialogs: list[str] = []
    ops_page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    answer = ops_page.goto(f"{stack.api_url}/ops/predictions/{prediction_id}")
    assert answer is not None
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert attack in ops_page.locator("#error").inner_text()
    assert attack in ops_page.locator("#input").inner_text()
    ops_page.locator("#logs .line").first.wait_for()
    assert ops_page.locator("#logs").inner_text().strip() == attack
    assert "sk-live-secret" not in ops_page.content()
    assert "[redacted]" in ops_page.locator("#input").inner_text()
    ops_page.goto(f"{stack.api_url}/ops/failed")
    ops_page.goto(f"{stack.api_url}/ops/predictions?account={account}")
    assert attack[:40] in ops_page.locator(".error-text").first.inner_text()
    assert ops_page.title() != "pwned" and dialogs == []
    assert ops_page.locator("img[src=x]").count() == 0
    assert console.errors == []


def test_live_logs_arrive_in_order_and_never_twice(
    ops_page: Page, stack: Stack, client: httpx.Client, console: Console
) -> None:
    created = client.post(
        "/v1/deployments/conduit/echo/predictions",
        json={"input": {"prompt": "tick", "n": 12, "delay": 0.1}},
    ).json()
    ops_page.goto(f"{stack.api_url}/ops/predictions/{created['id']}")
    expected = [f"echo tick-{i}" for i in range(12)]
    lines = ops_page.locator("#logs .line")
    wait_for(lambda: lines.count() >= 12, "every log line", timeout=60)
    # The stream ended with done and the page closed it: no reconnection to repeat the lines.
    ops_page.wait_for_function(
        "() => { const el = document.querySelector('[sse-connect]');"
        " const data = el && el['htmx-internal-data'];"
        " return data && data.sseEventSource && data.sseEventSource.readyState === 2; }"
    )
    assert lines.all_inner_texts() == expected
    assert wait_status(client, created["id"])["status"] == "succeeded"
    ops_page.reload()
    wait_for(lambda: lines.count() >= 12, "the replayed lines", timeout=30)
    ops_page.wait_for_function(
        "() => document.querySelector('[sse-connect]')['htmx-internal-data']"
        ".sseEventSource.readyState === 2"
    )
    assert lines.all_inner_texts() == expected
    assert console.errors == []


def test_filters_survive_a_reload(ops_page: Page, stack: Stack, client: httpx.Client) -> None:
    ops_page.goto(f"{stack.api_url}/ops/predictions")
    ops_page.select_option("select[name=status]", "succeeded")
    ops_page.fill("input[name=target]", "dp-conduit/echo")
    ops_page.click("button:has-text('Filter')")
    ops_page.wait_for_url(re.compile(r".*status=succeeded.*"))
    bookmarked = ops_page.url
    ops_page.reload()
    assert ops_page.url == bookmarked
    assert ops_page.locator("select[name=status]").input_value() == "succeeded"
    assert ops_page.locator("input[name=target]").input_value() == "dp-conduit/echo"
    statuses = set(ops_page.locator("td.status").all_inner_texts())
    assert statuses <= {"succeeded"}


def test_cancel_all_matching_cancels_what_is_queued(
    ops_page: Page,
    stack: Stack,
    admin: Admin,
    idle: Idle,
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    account = f"cancel-{uuid.uuid4().hex[:8]}"
    token = admin.create_account(account)
    with httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as own:
        ids = queue(own, idle, 30)
    ops_page.goto(f"{stack.api_url}/ops/predictions?status=starting&account={account}")
    assert ops_page.locator("#match-count").inner_text() == "30"
    ops_page.click("#cancel-all")
    assert "30" in ops_page.locator("#confirm-count").inner_text()
    ops_page.click("#confirm-bulk")
    ops_page.locator("#action-status", has_text="done").wait_for(timeout=60_000)
    statuses = db.execute(
        "SELECT status, count(*) FROM predictions WHERE id = ANY(%s) GROUP BY status", (ids,)
    ).fetchall()
    assert statuses == [("canceled", 30)]
