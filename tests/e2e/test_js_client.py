"""The official ``replicate`` JavaScript client (npm, pinned in tests/js), unmodified, pointed at
Conduit: run, stream, predictions create/get/list/cancel, wait, and validateWebhook.

Each test runs one scenario of tests/js/client.mjs (:mod:`tests.fixtures.js_client`).
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.cog_server import FIXTURES
from tests.fixtures.fleet_entries import registered
from tests.fixtures.js_client import Scenario, needs_node, scenarios
from tests.fixtures.receiver import webhook_receiver
from tests.fixtures.sse import events
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.e2e, needs_node]
TRAINER = FIXTURES / "cog_trainer"


@pytest.fixture
def js(stack: Stack, token: str) -> Scenario:
    """Runs one scenario of client.mjs as the test's account; returns what it printed."""
    return scenarios(stack.api_url, token)


def test_run_by_model_and_by_version(js: Scenario, stack: Stack) -> None:
    seen = js("run", model=ECHO, version=stack.version, input={"prompt": "js", "n": 3})
    assert seen["by_model"] == ["js-0", "js-1", "js-2"]
    assert seen["by_version"] == ["js-0", "js-1", "js-2"]
    creates = [r for r in seen["requests"] if r["method"] == "POST"]
    assert [urlsplit(r["url"]).path for r in creates] == [
        f"/v1/models/{ECHO}/predictions",
        "/v1/predictions",
    ]
    assert all(r["authorization"] for r in seen["requests"])


def test_stream_opens_the_capability_url_without_authorization(js: Scenario) -> None:
    seen = js("stream", model=ECHO, input={"prompt": "tok", "n": 5, "delay": 0.02})
    outputs = [e["data"] for e in seen["events"] if e["event"] == "output"]
    assert outputs == [f"tok-{i}" for i in range(5)]
    assert seen["events"][-1]["event"] == "done"

    create, stream = seen["requests"]
    assert create["method"] == "POST" and create["authorization"]
    # The outputs came through the stream URL alone: no bearer token went with it.
    assert stream["method"] == "GET" and not stream["authorization"]
    url = urlsplit(stream["url"])
    assert url.path.endswith("/stream")
    assert set(parse_qs(url.query)) == {"exp", "sig"}


def test_create_get_list_cancel_and_wait(js: Scenario, stack: Stack) -> None:
    seen = js(
        "lifecycle",
        version=stack.version,
        slow={"prompt": "slow", "n": 500, "delay": 0.05},
        quick={"prompt": "quick", "n": 2},
    )
    long, short = seen["created"]
    assert long["status"] == short["status"] == "starting"
    assert long["version"] == stack.version
    assert seen["got"]["id"] == short["id"]
    assert seen["listed"][:2] == [short["id"], long["id"]]
    assert seen["canceling"]["id"] == long["id"]
    assert seen["finished"]["status"] == "succeeded"
    assert seen["finished"]["output"] == ["quick-0", "quick-1"]
    assert seen["canceled"]["status"] == "canceled"
    assert seen["account"]["type"] == "organization"
    assert seen["account"]["username"] == seen["account"]["name"]


def test_validate_webhook_with_the_account_secret(js: Scenario, stack: Stack) -> None:
    with webhook_receiver() as receiver:
        created = js(
            "createWithWebhook",
            version=stack.version,
            input={"prompt": "hook", "n": 2},
            webhook=f"{receiver.url}/js",
        )
        [delivery] = wait_for(lambda: receiver.to("/js"), "the completed webhook")
    body = delivery.body.decode()
    assert json.loads(body)["status"] == "succeeded"
    seen = js(
        "validate",
        id=delivery.headers["webhook-id"],
        timestamp=delivery.headers["webhook-timestamp"],
        signature=delivery.headers["webhook-signature"],
        body=body,
    )
    assert seen["valid"] is True
    assert seen["tampered"] is False

    # The webhook's body, rendered by the director, carries a stream URL that opens without a
    # bearer token too.
    stream_url = json.loads(body)["urls"]["stream"]
    assert json.loads(body)["id"] == created["id"]
    with httpx.stream("GET", stream_url, headers={"Accept": "text/event-stream"}) as response:
        assert response.status_code == 200, response.read()
        replayed = list(events(response))
    assert [e.data for e in replayed if e.event == "output"] == ["hook-0", "hook-1"]


def test_hardware_list(js: Scenario, redis_url: str) -> None:
    with registered(redis_url, "gpu"):
        assert {"name": "GPU", "sku": "gpu"} in js("hardware")["hardware"]


def test_models_and_deployments_are_managed(stack: Stack, admin: Admin, redis_url: str) -> None:
    owner = f"js-{uuid.uuid4().hex[:8]}"
    js = scenarios(stack.api_url, admin.create_account(owner))
    with registered(redis_url, "cpu"):
        model = js("createModel", owner=owner, model="pix", hardware="cpu")["model"]
        assert (model["owner"], model["name"], model["visibility"]) == (owner, "pix", "private")
        version = admin.create_model(f"{owner}/pix", stack.runner_url)
        schema = httpx.get(f"{stack.api_url}/openapi.json").json()  # any schema: not run
        second = admin.register_version(f"{owner}/pix", schema, "rebuilt")
        seen = js(
            "manage", owner=owner, model="pix", version=version, second=second, hardware="cpu"
        )
    created, updated = seen["created"]["current_release"], seen["updated"]["current_release"]
    assert (created["number"], created["version"], created["configuration"]["hardware"]) == (
        1,
        version,
        "cpu",
    )
    assert (updated["number"], updated["configuration"]["max_instances"]) == (2, 4)
    released = seen["released"]["current_release"]
    assert (released["number"], released["version"]) == (3, second)
    assert released["configuration"]["max_instances"] == 4  # what the release did not change
    assert seen["fetched"]["current_release"] == released
    assert seen["deleted"] is True
    assert seen["versionsDeleted"] == [204, 204]
    assert (seen["modelDeleted"], seen["afterDelete"]) == (204, 404)


def test_trainings_are_created_read_listed_and_canceled(stack: Stack, admin: Admin) -> None:
    owner = f"js-{uuid.uuid4().hex[:8]}"
    js = scenarios(stack.api_url, admin.create_account(owner))
    schema = json.loads((TRAINER / ".cog" / "openapi_schema.json").read_text())
    version = admin.register_version(f"{owner}/words", schema, "0.23.1")
    admin.register_version(f"{owner}/tuned", schema, "0.23.1")
    seen = js(
        "trainings",
        owner=owner,
        model="words",
        version=version,
        destination=f"{owner}/tuned",
        input={"words": "hola"},
    )
    created = seen["created"]
    assert (created["model"], created["version"]) == (f"{owner}/words", version)
    assert (created["destination"], created["status"]) == (f"{owner}/tuned", "starting")
    assert created["input"] == {"words": "hola"}
    assert seen["fetched"]["id"] == created["id"]
    assert seen["listed"][:1] == [created["id"]]
    assert (seen["canceled"], seen["after"]) == ("canceled", "canceled")
    creates = [r for r in seen["requests"] if r["method"] == "POST"]
    assert urlsplit(creates[0]["url"]).path == (
        f"/v1/models/{owner}/words/versions/{version}/trainings"
    )
