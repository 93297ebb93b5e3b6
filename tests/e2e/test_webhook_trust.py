"""A webhook is no way into a runner: the attack of a webhook aimed at a runner's ``/shutdown``,
against a real api, director and a runner without a token (the session's webhook allow list
opens loopback, as an operator's ``CONDUIT_WEBHOOK_ALLOW_CIDRS=127.0.0.0/8`` does).

Any account may create a prediction on a deployment it can see with any webhook; the runner it
aims at serves a deployment that account cannot see. The api refuses a Cog route as a webhook
(422 naming ``webhook``), and any URL of a runner the fleet registry lists; a delivery stored
before (its URL changed under it here, as the fleet may change after a create) is refused by
the dispatcher at send time. Through all of it the runner keeps running and serving.

Also here: a request body with a ``Content-Encoding`` is 415 problem+json naming the header.
"""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.receiver import Receiver, webhook_receiver
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

PATH = f"/v1/deployments/{ECHO}/predictions"


@dataclass(frozen=True)
class OpenRunner:
    proc: Proc
    url: str


@pytest.fixture(scope="module")
def open_runner(stack: Stack, launcher: Launcher, admin: Admin) -> OpenRunner:
    """An echo runner without a token, driven by its director for a private deployment."""
    name = f"conduit/open-{uuid.uuid4().hex[:8]}"
    proc, url = launcher.runner("echo", concurrency=2, env={"CONDUIT_RUNNER_TOKEN": ""})
    admin.create_model(name, url)
    admin.create_deployment(name, name)  # private: no test account sees it
    launcher.director(name, url, concurrency=2)
    return OpenRunner(proc, url)


def assert_running(runner: OpenRunner) -> None:
    runner.proc.check_alive()
    assert "shutting down" not in runner.proc.log()
    health = httpx.get(f"{runner.url}/health-check", timeout=10).json()
    assert health["status"] == "READY", health


def assert_webhook_refused(response: httpx.Response, why: str) -> None:
    problem = assert_problem(response, 422)
    assert [e["field"] for e in problem["errors"]] == ["webhook"], problem
    assert why in problem["detail"], problem


@pytest.mark.parametrize("path", ["/shutdown", "/predictions/p1/cancel", "/%73hutdown/"])
def test_a_webhook_aimed_at_a_runners_route_is_refused_at_create(
    client: httpx.Client, open_runner: OpenRunner, path: str
) -> None:
    response = client.post(PATH, json={"input": {"prompt": "x"}, "webhook": open_runner.url + path})
    assert_webhook_refused(response, "route of Cog's runner protocol")
    assert_running(open_runner)


def test_any_url_of_a_fleet_runner_is_refused_at_create(
    client: httpx.Client, open_runner: OpenRunner
) -> None:
    webhook = open_runner.url.replace("127.0.0.1", "localhost") + "/hook"

    def refused() -> httpx.Response | None:
        response = client.post(PATH, json={"input": {"prompt": "x"}, "webhook": webhook})
        assert response.status_code in (201, 422), response.text
        return response if response.status_code == 422 else None

    # The api learns of the runner from the fleet registry, a read every few seconds.
    response = wait_for(refused, "the api refusing the fleet runner's address")
    assert_webhook_refused(response, "is a runner's")
    assert_running(open_runner)


@pytest.fixture
def refusing() -> Iterator[Receiver]:
    """A receiver that answers 503 to everything, keeping each delivery pending."""
    with webhook_receiver() as receiver:
        receiver.respond = lambda request, index: (503, {})
        yield receiver


def _delivery(database_url: str, prediction_id: str) -> tuple[str, str, int, str | None] | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT url, status, attempts, last_error FROM webhook_deliveries "
            "WHERE prediction_id = %s",
            (prediction_id,),
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def test_a_stored_delivery_to_a_runner_is_refused_at_send_time(
    client: httpx.Client, refusing: Receiver, open_runner: OpenRunner, database_url: str
) -> None:
    created = create(
        client,
        PATH,
        input={"prompt": "d"},
        webhook=refusing.url + "/hook",
        webhook_events_filter=["completed"],
    )
    wait_status(client, created["id"])
    wait_for(lambda: refusing.to("/hook"), "a first, refused, attempt")
    target = open_runner.url + "/shutdown"
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE webhook_deliveries SET url = %s WHERE prediction_id = %s",
            (target, created["id"]),
        )

    def refused_by_the_sender() -> tuple[str, str, int, str | None] | None:
        found = _delivery(database_url, created["id"])
        error = found[3] if found else None
        return found if error and "route of Cog's runner protocol" in error else None

    url, _, _, error = wait_for(refused_by_the_sender, "the dispatcher refusing the runner")
    assert url == target and error is not None
    assert_running(open_runner)
    assert (
        httpx.post(
            f"{open_runner.url}/predictions", json={"input": {"prompt": "still"}}, timeout=30
        ).json()["status"]
        == "succeeded"
    )


@pytest.mark.parametrize("encoding", ["gzip", "br", "identity, gzip"])
def test_an_encoded_body_is_415_naming_the_header(client: httpx.Client, encoding: str) -> None:
    body = gzip.compress(b'{"input": {"prompt": "z"}}')
    response = client.post(
        PATH,
        content=body,
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    problem = assert_problem(response, 415)
    assert problem["code"] == "unsupported_content_encoding"
    assert [e["field"] for e in problem["errors"]] == ["Content-Encoding"]
    assert response.headers["accept-encoding"] == "identity"

    plain = client.post(
        PATH, json={"input": {"prompt": "z"}}, headers={"Content-Encoding": "identity"}
    )
    assert plain.status_code == 201, plain.text
