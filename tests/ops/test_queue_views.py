"""The overview's numbers and "why is this waiting?", against entries really queued in Redis
and rows really in Postgres; "unknown" (never 0) where Redis cannot tell."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from playwright.sync_api import Page

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.browser import sign_in
from tests.fixtures.processes import Launcher
from tests.fixtures.servers import RedisServer
from tests.fixtures.waiting import wait_for
from tests.ops.seeding import Idle, idle_deployment, queue, take

pytestmark = pytest.mark.e2e


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def idle(admin: Admin, stack: Stack) -> Idle:
    return idle_deployment(admin, stack)


def _row(page: Page, deployment: Idle, column: str) -> str:
    return page.locator(f'tr[data-target="{deployment.target}"] td.{column}').inner_text()


def test_overview_counts_what_waits_and_what_is_in_flight(
    ops_page: Page, stack: Stack, client: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    queue(client, idle, 7)
    taken = take(r, idle, "ghost-director", 2)
    assert len(taken) == 2
    ops_page.goto(f"{stack.api_url}/ops")
    assert _row(ops_page, idle, "waiting") == "5"
    assert _row(ops_page, idle, "in-flight") == "2"
    assert _row(ops_page, idle, "pg-starting") == "7"
    assert _row(ops_page, idle, "oldest").endswith(" s")


def test_waiting_is_counted_where_redis_cannot_tell_the_lag(
    ops_page: Page, stack: Stack, client: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    queue(client, idle, 5)
    take(r, idle, "ghost-director", 1)
    # Deleting an entry behind one still there leaves Redis unable to tell the group's lag
    # (XINFO GROUPS answers nil); the page counts the unread entries instead.
    deleted = False
    for stream in idle.streams():
        entries = r.xrange(stream, "-", "+")
        if len(entries) >= 2 and not deleted:
            r.xdel(stream, entries[-1][0])
            group = next(g for g in r.xinfo_groups(stream) if g["name"] == b"directors")
            deleted = group["lag"] is None
    assert deleted, "no shard had two entries to make the lag unknown with"
    ops_page.goto(f"{stack.api_url}/ops")
    assert _row(ops_page, idle, "waiting") == "3"
    assert _row(ops_page, idle, "in-flight") == "1"
    assert _row(ops_page, idle, "pg-starting") == "5"


def test_redis_away_shows_unknown_beside_postgres_counts(
    page: Page, launcher: Launcher, operator: str, idle: Idle, token: str, tmp_path: Path
) -> None:
    with RedisServer(tmp_path / "redis") as server:
        env = {"REDIS_URL": server.url}
        with (
            launcher.own_api(env=env) as api_url,
            httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}) as own,
        ):
            queue(own, idle, 3)
            sign_in(page, api_url, operator)
            assert _row(page, idle, "waiting") == "3"
            server.pause()
            try:
                page.goto(f"{api_url}/ops")
                assert _row(page, idle, "waiting") == "unknown"
                assert _row(page, idle, "in-flight") == "unknown"
                assert _row(page, idle, "pg-starting") == "3"
                assert "Redis could not be read" in page.locator("[role=alert]").inner_text()
            finally:
                server.resume()


def _unread_position(r: redis.Redis, idle: Idle, prediction_id: str) -> tuple[int, int]:
    """(shard, entries ahead of it that no consumer has read)."""
    for shard, stream in enumerate(idle.streams()):
        group = next(g for g in r.xinfo_groups(stream) if g["name"] == b"directors")
        last = group["last-delivered-id"].decode()
        unread = r.xrange(stream, f"({last}", "+")
        ids = [fields[b"id"].decode() for _, fields in unread]
        if prediction_id in ids:
            return shard, ids.index(prediction_id)
    raise AssertionError(f"{prediction_id} is not unread in any shard")


def test_why_is_this_waiting_names_its_shard_and_what_is_ahead(
    ops_page: Page, stack: Stack, client: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    ids = queue(client, idle, 6)
    held = take(r, idle, "ghost-director", 1)[0]
    waiting = ids[-1]
    shard, ahead = _unread_position(r, idle, waiting)
    ops_page.goto(f"{stack.api_url}/ops/predictions/{waiting}")
    verdict = ops_page.locator("#verdict")
    verdict.wait_for()
    expected = f"{ahead} ahead on shard {shard}" if ahead else f"next on shard {shard}"
    assert verdict.inner_text().startswith(expected)
    panel = ops_page.locator("#why")
    assert "no director has read it yet" in panel.inner_text()
    ops_page.goto(f"{stack.api_url}/ops/predictions/{held}")
    verdict.wait_for()
    text = verdict.inner_text()
    assert text.startswith("held by director ghost-director, which has stopped heartbeating")
    assert "reclaimed in" in text
    facts = panel.inner_text()
    assert "yes, with ghost-director" in facts and "none (no heartbeat key" in facts


def test_a_prediction_in_no_stream_is_said_to_wait_for_the_reconciler(
    ops_page: Page, stack: Stack, client: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    (lost,) = queue(client, idle, 1)
    for stream in idle.streams():
        for entry_id, fields in r.xrange(stream, "-", "+"):
            if fields[b"id"].decode() == lost:
                r.xdel(stream, entry_id)
    ops_page.goto(f"{stack.api_url}/ops/predictions/{lost}")
    wait_for(
        lambda: "reconciler" in ops_page.locator("#why").inner_text(), "the verdict", timeout=30
    )
    assert ops_page.locator("#verdict").inner_text().startswith("in no shard stream")


def test_why_is_this_waiting_on_a_deployment_no_director_has_read(
    ops_page: Page, stack: Stack, client: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    """Its streams have no consumer group yet: everything in them is unread."""
    ids = queue(client, idle, 4)
    waiting = ids[-1]
    shard, ahead = next(
        (shard, queued.index(waiting))
        for shard, stream in enumerate(idle.streams())
        if waiting in (queued := [f[b"id"].decode() for _, f in r.xrange(stream, "-", "+")])
    )
    ops_page.goto(f"{stack.api_url}/ops/predictions/{waiting}")
    verdict = ops_page.locator("#verdict")
    verdict.wait_for()
    expected = f"{ahead} ahead on shard {shard}" if ahead else f"next on shard {shard}"
    assert verdict.inner_text().startswith(expected)
    assert "no director has read it yet" in ops_page.locator("#why").inner_text()
