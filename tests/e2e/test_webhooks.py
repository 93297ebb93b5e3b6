"""Client webhooks: Standard Webhooks signatures, filters, throttling, durable retries."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.receiver import Received, Receiver, webhook_receiver
from tests.fixtures.waiting import wait_for
from tracker.webhooks import WebhookPolicy

PATH = f"/v1/deployments/{ECHO}/predictions"
TERMINAL = {"succeeded", "failed", "canceled"}


def _secret(client: httpx.Client) -> str:
    key: str = client.get("/v1/webhooks/default/secret").json()["key"]
    assert key.startswith("whsec_")
    return key


@pytest.fixture
def receiver(client: httpx.Client) -> Iterator[Receiver]:
    """A receiver that verifies every delivery against the test account's secret; a test
    whose deliveries did not all verify fails."""
    with webhook_receiver(secret=_secret(client)) as running:
        yield running
    assert running.failures == []


def _verified(secret: str, request: Received) -> dict[str, Any]:
    body: dict[str, Any] = Webhook(secret).verify(request.body, request.headers)
    return body


def _completed(receiver: Receiver, path: str) -> list[Received]:
    return [r for r in receiver.to(path) if r.json()["status"] in TERMINAL]


def test_all_events_signed_and_completed_matches_get(
    client: httpx.Client, receiver: Receiver
) -> None:
    secret = _secret(client)
    created = create(
        client, PATH, input={"prompt": "w", "n": 3, "delay": 0.3}, webhook=receiver.url + "/all"
    )
    wait_for(lambda: _completed(receiver, "/all"), "completed webhook")
    requests = receiver.to("/all")
    bodies = [_verified(secret, r) for r in requests]
    assert bodies[0]["status"] == "processing" and bodies[0]["started_at"]  # start
    assert any(b["status"] == "processing" and b["output"] for b in bodies[1:-1])  # output
    # Equal but for urls.stream, signed anew with its own expiry at each render.
    final, fetched = bodies[-1], fetch(client, created["id"])
    assert final["urls"].pop("stream").startswith(fetched["urls"].pop("stream").split("?")[0])
    assert final == fetched
    assert bodies[-1]["output"] == ["w-0", "w-1", "w-2"]
    assert all(b["id"] == created["id"] and b["input"] == created["input"] for b in bodies)
    assert len({r.headers["webhook-id"] for r in requests}) == len(requests)


def test_filter_is_honoured_exactly(client: httpx.Client, receiver: Receiver) -> None:
    create(
        client,
        PATH,
        input={"prompt": "f", "n": 5, "delay": 0.1},
        webhook=receiver.url + "/filtered",
        webhook_events_filter=["start", "completed"],
    )
    wait_for(lambda: _completed(receiver, "/filtered"), "completed webhook")
    statuses = [r.json()["status"] for r in receiver.to("/filtered")]
    assert statuses == ["processing", "succeeded"]


def test_intermediate_webhooks_are_throttled(client: httpx.Client, receiver: Receiver) -> None:
    create(
        client,
        PATH,
        input={"prompt": "t", "n": 30, "delay": 0.05},
        webhook=receiver.url + "/throttled",
        webhook_events_filter=["output", "completed"],
    )
    wait_for(lambda: _completed(receiver, "/throttled"), "completed webhook")
    # The model runs from the first one on: none says "starting" (its start is written at once
    # when output webhooks are due, whatever CONDUIT_DIRECTOR_START_WRITE_DELAY says).
    assert {r.json()["status"] for r in receiver.to("/throttled")} == {"processing", "succeeded"}
    intermediate = [r for r in receiver.to("/throttled") if r.json()["status"] == "processing"]
    assert 1 <= len(intermediate) <= 5  # 30 outputs over ~1.5 s, at most one per 0.5 s
    gaps = [b.at - a.at for a, b in zip(intermediate, intermediate[1:], strict=False)]
    assert all(gap >= 0.4 for gap in gaps), gaps
    outputs = [len(r.json()["output"]) for r in intermediate]
    assert outputs == sorted(outputs)


def test_completed_is_retried_with_one_webhook_id(client: httpx.Client, receiver: Receiver) -> None:
    secret = _secret(client)
    receiver.respond = lambda r, i: (500, {}) if i < 3 else (200, {})
    create(
        client,
        PATH,
        input={"prompt": "r"},
        webhook=receiver.url + "/flaky",
        webhook_events_filter=["completed"],
    )
    wait_for(lambda: len(receiver.to("/flaky")) >= 4, "four attempts")
    attempts = receiver.to("/flaky")
    assert len({r.headers["webhook-id"] for r in attempts}) == 1
    assert all(_verified(secret, r)["status"] == "succeeded" for r in attempts)


def test_redirects_are_not_followed(client: httpx.Client, receiver: Receiver) -> None:
    receiver.respond = lambda r, i: (
        (302, {"Location": receiver.url + "/final"}) if r.path == "/redirect" else (200, {})
    )
    create(
        client,
        PATH,
        input={"prompt": "x"},
        webhook=receiver.url + "/redirect",
        webhook_events_filter=["completed"],
    )
    wait_for(lambda: len(receiver.to("/redirect")) >= 2, "a redirect counted as a failure")
    assert receiver.to("/final") == []


def _delivery(database_url: str, prediction_id: str) -> tuple[str, int, int | None] | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT status, attempts, last_status FROM webhook_deliveries WHERE prediction_id = %s",
            (prediction_id,),
        ).fetchone()
    return (row[0], row[1], row[2]) if row else None


# Park a delivery that is waiting out its backoff (not one leased for an attempt right now, whose
# outcome would overwrite the park) for an hour: only a 410 to the same URL can end it early.
_PARK = (
    "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour' "
    "WHERE prediction_id = %s AND status = 'pending' AND attempts >= 1 "
    "AND next_attempt_at < now() + interval '10 seconds'"
)


def _park(database_url: str, prediction_id: str) -> bool:
    with psycopg.connect(database_url) as conn:
        return conn.execute(_PARK, (prediction_id,)).rowcount == 1


def test_gone_stops_retries(client: httpx.Client, receiver: Receiver, database_url: str) -> None:
    """A 410 gives up its own delivery and every pending one to the same URL."""
    gone = False
    receiver.respond = lambda r, i: (410 if gone else 500, {})
    url = receiver.url + "/gone"
    waiting = create(client, PATH, input={}, webhook=url, webhook_events_filter=["completed"])
    wait_for(lambda: _park(database_url, waiting["id"]), "a delivery waiting to be retried")
    attempts = _delivery(database_url, waiting["id"])
    assert attempts is not None and attempts[0] == "pending" and attempts[2] == 500
    gone = True
    created = create(client, PATH, input={}, webhook=url, webhook_events_filter=["completed"])
    state = wait_for(
        lambda: (d := _delivery(database_url, created["id"])) and d[0] == "failed" and d,
        "delivery given up",
    )
    assert state == ("failed", 1, 410)
    assert _delivery(database_url, waiting["id"]) == ("failed", attempts[1], 410)
    ids = [r.json()["id"] for r in receiver.to("/gone")]
    assert ids.count(created["id"]) == 1
    assert ids.count(waiting["id"]) == attempts[1]


def test_pending_completed_survives_restarts(
    launcher: Launcher, admin: Admin, receiver: Receiver, token: str, database_url: str
) -> None:
    """Kill the api and director that made the failed attempts; the stored webhook is still
    delivered afterwards (by the new director or any other dispatcher), with its webhook-id."""
    name = f"test/hooks-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, shards=1, visibility="public")
    api, api_url = launcher.api()
    runner, runner_url = launcher.runner("echo", concurrency=1)
    director = launcher.director(name, runner_url)
    down = True
    receiver.respond = lambda r, i: (503, {}) if down else (200, {})
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=api_url, headers=headers) as client:
            created = create(
                client,
                f"/v1/deployments/{name}/predictions",
                input={"prompt": "d"},
                webhook=receiver.url + "/durable",
                webhook_events_filter=["completed"],
            )
            wait_for(lambda: len(receiver.to("/durable")) >= 2, "failed attempts")
            director.kill()
            api.kill()
            first_id = receiver.to("/durable")[0].headers["webhook-id"]
            down = False
            successor = launcher.director(name, runner_url)
            # A director killed while an attempt was in flight holds that row's lease until it
            # expires (``WebhookPolicy.lease``): only then may the successor send it.
            wait_for(
                lambda: (_delivery(database_url, created["id"]) or ("",))[0] == "delivered",
                "delivery after restart",
                timeout=WebhookPolicy().lease + 30.0,
            )
            delivered = receiver.to("/durable")[-1]
            assert delivered.headers["webhook-id"] == first_id
            assert json.loads(delivered.body)["output"] == ["d-0"]
            successor.stop()
    finally:
        runner.stop()


def test_hung_intermediate_receiver_delays_nothing(
    client: httpx.Client, receiver: Receiver
) -> None:
    """A receiver that hangs on every intermediate webhook (one still on the wire when the
    prediction ends) holds up neither ``done`` (so ``Prefer: wait``), nor the director's next
    prediction, nor the ``completed`` webhook."""
    release = threading.Event()

    def hang_on_intermediate(request: Received, index: int) -> tuple[int, dict[str, str]]:
        if request.json()["status"] not in TERMINAL:
            # A stalled receiver, released when the test ends: an answer it held up would
            # outlast the client's own timeout and fail the request.
            release.wait(60)
        return 200, {}

    receiver.respond = hang_on_intermediate
    ids = []
    try:
        for n in range(3):
            response = client.post(
                PATH,
                json={"input": {"prompt": f"h{n}"}, "webhook": receiver.url + "/hung"},
                headers={"Prefer": "wait"},
            )
            assert response.status_code == 201, response.text
            assert response.json()["status"] == "succeeded"
            ids.append(response.json()["id"])
        wait_for(lambda: len(_completed(receiver, "/hung")) == 3, "completed webhooks")
        assert {r.json()["id"] for r in _completed(receiver, "/hung")} == set(ids)
    finally:
        release.set()


BLOCKED = [
    "http://127.0.0.1:{port}/",
    "http://localhost:{port}/",
    "http://[::1]:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://2130706433:{port}/",
    "http://0x7f000001:{port}/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/",
    "http://100.64.0.1/",
    "http://0.0.0.0:{port}/",
    "ftp://example.com/",
]


def test_ssrf_guard_refuses_internal_urls_at_create(
    launcher: Launcher, receiver: Receiver, token: str
) -> None:
    api, url = launcher.api(env={"CONDUIT_WEBHOOK_ALLOW_CIDRS": ""})
    port = receiver.url.rsplit(":", 1)[1]
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
            for template in BLOCKED:
                response = client.post(
                    PATH, json={"input": {}, "webhook": template.format(port=port)}
                )
                assert response.status_code == 422, (template, response.text)
                assert response.json()["errors"][0]["field"] == "webhook"
            assert client.get("/v1/predictions").json()["results"] == []
    finally:
        api.stop()
    assert receiver.requests == []


def test_redirect_to_loopback_is_not_followed(
    launcher: Launcher, admin: Admin, stack: Stack, token: str, database_url: str
) -> None:
    """A receiver on an allowed address (127.0.0.2) answers 302 to loopback (127.0.0.1): the api
    and director allowed only 127.0.0.2 never reach the loopback receiver, and the delivery
    ends failed."""
    allow = {"CONDUIT_WEBHOOK_ALLOW_CIDRS": "127.0.0.2/32"}
    name = f"test/redirect-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, shards=1, visibility="public")
    api, api_url = launcher.api(env=allow)
    director = launcher.director(name, stack.runner_url, env=allow)
    with (
        webhook_receiver(host="127.0.0.1") as loopback,
        webhook_receiver(host="127.0.0.2") as allowed,
    ):
        allowed.respond = lambda r, i: (302, {"Location": loopback.url + "/inside"})
        try:
            with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}) as c:
                created = create(
                    c,
                    f"/v1/deployments/{name}/predictions",
                    input={"prompt": "r", "n": 2, "delay": 0.3},
                    webhook=allowed.url + "/hook",
                )
                state = wait_for(
                    lambda: (
                        (d := _delivery(database_url, created["id"])) and d[0] == "failed" and d
                    ),
                    "the completed webhook given up",
                )
                assert wait_status(c, created["id"])["status"] == "succeeded"
        finally:
            director.stop()
            api.stop()
    assert state[2] == 302 and state[1] >= 2, state
    assert {r.json()["status"] for r in allowed.to("/hook")} >= {"processing", "succeeded"}
    assert loopback.requests == []


def test_webhook_secret_is_per_account(client: httpx.Client, stack: Stack, admin: Admin) -> None:
    other = admin.create_account(f"other-{uuid.uuid4().hex[:6]}")
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {other}"}) as c:
        assert _secret(c) != _secret(client)


def test_canceled_while_queued_sends_completed(
    launcher: Launcher, admin: Admin, client: httpx.Client, receiver: Receiver
) -> None:
    name = f"test/idle-{uuid.uuid4().hex[:8]}"
    # No director: it stays queued.
    admin.create_deployment(name, ECHO, shards=1, visibility="public")
    created = create(
        client, f"/v1/deployments/{name}/predictions", input={}, webhook=receiver.url + "/q"
    )
    assert client.post(f"/v1/predictions/{created['id']}/cancel").json()["status"] == "canceled"
    wait_for(lambda: _completed(receiver, "/q"), "completed webhook for the cancel")
    assert [r.json()["status"] for r in receiver.to("/q")] == ["canceled"]
    assert wait_status(client, created["id"])["status"] == "canceled"
