"""What the overview tells at a glance: a deployment's row counts what waits on its version's
streams, a backlog nobody reads is marked, the page says when it was read, and trainings and
trainer directors are shown."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis
from playwright.sync_api import Page

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.waiting import wait_for
from tests.ops.seeding import Idle, idle_deployment, take_from
from tracker import keys

pytestmark = pytest.mark.e2e

TRAINABLE = {
    "openapi": "3.0.2",
    "info": {"title": "Cog", "version": "0.1.0"},
    "paths": {},
    "components": {
        "schemas": {
            "Input": {"type": "object", "properties": {"prompt": {"type": "string"}}},
            "Output": {"type": "string"},
            "TrainingInput": {"type": "object", "properties": {"steps": {"type": "integer"}}},
        }
    },
}


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def idle(admin: Admin, stack: Stack) -> Idle:
    return idle_deployment(admin, stack)


@pytest.fixture
def owner(stack: Stack, idle: Idle) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {idle.owner_token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
        yield http


def _cell(page: Page, target: str, column: str) -> str:
    return page.locator(f'tr[data-target="{target}"] td.{column}').first.inner_text()


def test_a_deployment_row_counts_what_waits_on_its_version(
    ops_page: Page, stack: Stack, owner: httpx.Client, idle: Idle
) -> None:
    for i in range(3):
        made = owner.post(
            "/v1/predictions", json={"version": idle.version, "input": {"prompt": f"v{i}"}}
        )
        assert made.status_code == 201, made.text
    ops_page.goto(f"{stack.api_url}/ops")
    row = ops_page.locator(f'tr[data-target="{idle.target}"]')
    assert _cell(ops_page, idle.target, "waiting") == "3"
    assert _cell(ops_page, idle.target, "pg-starting") == "3"
    # The version's part, on the line beneath the deployment's:
    part = ops_page.locator(f'tr.part[data-part-of="{idle.target}"]')
    assert part.get_attribute("data-target") == f"vp-{idle.version}"
    assert part.locator("td.waiting").inner_text() == "3"
    assert "of which on its version" in part.inner_text()
    # Nobody reads them: the row is marked, and the summary above the table names it.
    assert "attention" in (row.get_attribute("class") or "")
    assert "waiting, no director reads it" in row.locator("td.marks").inner_text()
    assert idle.name in ops_page.locator("#attention-summary").inner_text()


def test_a_backlog_past_the_threshold_and_errors_are_marked(
    ops_page: Page, stack: Stack, client: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    # An entry appended 45 s ago (its id is its time), read by no one.
    stream = idle.streams()[0]
    r.xadd(stream, {"id": "pold"}, id=f"{int(datetime.now(UTC).timestamp() * 1000) - 45_000}-0")
    ops_page.goto(f"{stack.api_url}/ops")
    row = ops_page.locator(f'tr[data-target="{idle.target}"]')
    assert "late" in (row.locator("td.oldest").get_attribute("class") or "")
    assert "oldest waiting over 30 s" in row.locator("td.marks").inner_text()
    assert "backlog" in (row.locator("td.waiting").get_attribute("class") or "")
    # The stack's own deployment, read by its director, with nothing waiting is not marked
    # for waiting (it may be for failures other tests made).
    echo = ops_page.locator('tr[data-target="dp-conduit/echo"] td.marks').inner_text()
    assert "no director reads it" not in echo and "oldest waiting" not in echo


def test_the_page_says_when_it_was_read_and_a_refresh_updates_it(
    ops_page: Page, stack: Stack
) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    ops_page.goto(f"{stack.api_url}/ops")
    stamp = ops_page.locator("#read-at time")
    first = datetime.fromisoformat(stamp.get_attribute("datetime") or "")
    assert first.utcoffset() == timedelta(0)
    assert before <= first <= datetime.now(UTC)
    assert ops_page.locator("#read-at").inner_text().endswith(" UTC")
    # The page refreshes itself every few seconds: the time it says moves with it.
    wait_for(
        lambda: datetime.fromisoformat(stamp.get_attribute("datetime") or "") > first,
        "the refreshed page's read time",
        timeout=30,
    )
    ops_page.goto(f"{stack.api_url}/ops/workers")
    assert ops_page.locator("#read-at time").count() == 1


def test_trainings_and_trainer_directors_are_shown(
    ops_page: Page, stack: Stack, admin: Admin, owner: httpx.Client, idle: Idle, r: redis.Redis
) -> None:
    model = idle.name.split("/")[0] + "/model"
    version = admin.register_version(model, TRAINABLE, f"train-{uuid.uuid4().hex[:6]}")
    ids = []
    for steps in (1, 2):
        made = owner.post(
            f"/v1/models/{model}/versions/{version}/trainings",
            json={"destination": model, "input": {"steps": steps}},
        )
        assert made.status_code == 201, made.text
        ids.append(made.json()["id"])
    target = keys.Target.training(version, keys.DEFAULT_SHARDS)
    trainer = f"trainer-{uuid.uuid4().hex[:6]}"
    assert len(take_from(r, target.all_streams(), trainer, 1)) == 1
    director = f"director-{uuid.uuid4().hex[:6]}"
    made = owner.post(f"/v1/deployments/{idle.name}/predictions", json={"input": {"prompt": "d"}})
    assert made.status_code == 201, made.text
    assert len(take_from(r, idle.streams(), director, 1)) == 1
    ops_page.goto(f"{stack.api_url}/ops")
    row = ops_page.locator(f'tr[data-target="{target.name}"]')
    assert row.get_attribute("data-kind") == "tp"
    assert "trainings" in row.locator("td").first.inner_text()
    assert _cell(ops_page, target.name, "waiting") == "1"
    assert _cell(ops_page, target.name, "in-flight") == "1"
    ops_page.goto(f"{stack.api_url}/ops/predictions?target={target.name}")
    kinds = ops_page.locator("table.predictions td.kind").all_inner_texts()
    assert kinds == ["training", "training"]
    ops_page.goto(f"{stack.api_url}/ops/predictions/{ids[0]}")
    assert ops_page.locator("h1").inner_text().startswith("Training")
    ops_page.goto(f"{stack.api_url}/ops/workers")
    said = ops_page.locator(f'tr[data-director="{trainer}"] td.kind').inner_text()
    assert said.startswith("trainings") and "trainer director" in said
    said = ops_page.locator(f'tr[data-director="{director}"] td.kind').inner_text()
    assert said == "predictions"
