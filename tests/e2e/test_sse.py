"""SSE: ordered outputs, late join, Last-Event-ID resume, replay after the history expired,
done on cancel, official client."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import redis
import replicate

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import SSE, events, read_stream
from tests.fixtures.waiting import wait_for
from tracker.events import events_key

PATH = f"/v1/deployments/{ECHO}/predictions"


def test_live_stream_yields_outputs_in_order_then_done(client: httpx.Client) -> None:
    created = create(client, PATH, input={"prompt": "s", "n": 15, "delay": 0.03})
    seen = read_stream(client, created["id"])
    outputs = [e.data for e in seen if e.event == "output"]
    assert outputs == [f"s-{i}" for i in range(15)]
    assert [e.data for e in seen if e.event == "logs"] == [f"echo s-{i}" for i in range(15)]
    assert seen[-1].event == "done" and json.loads(seen[-1].data) == {}
    assert all(e.id for e in seen)
    ids = [e.id for e in seen]
    assert ids == sorted(ids, key=lambda i: tuple(int(p) for p in (i or "0-0").split("-")))


def test_late_join_gets_history_and_last_event_id_resumes(client: httpx.Client) -> None:
    created = create(client, PATH, input={"prompt": "h", "n": 6})
    wait_status(client, created["id"])
    history = read_stream(client, created["id"])
    outputs = [e for e in history if e.event == "output"]
    assert [e.data for e in outputs] == [f"h-{i}" for i in range(6)]

    resumed = read_stream(client, created["id"], last_event_id=outputs[2].id)
    assert [e.data for e in resumed if e.event == "output"] == ["h-3", "h-4", "h-5"]
    assert resumed[-1].event == "done"


def test_the_stream_url_resumes_without_a_bearer_token(client: httpx.Client) -> None:
    """What a browser's EventSource does: urls.stream as the create gave it, no Authorization,
    and on reconnecting the same URL with Last-Event-ID."""
    created = create(client, PATH, input={"prompt": "b", "n": 4})
    wait_status(client, created["id"])

    def read(last_event_id: str | None = None) -> list[SSE]:
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        with httpx.stream("GET", created["urls"]["stream"], headers=headers, timeout=30) as r:
            assert r.status_code == 200, r.read()
            return list(events(r))

    outputs = [e for e in read() if e.event == "output"]
    assert [e.data for e in outputs] == ["b-0", "b-1", "b-2", "b-3"]
    resumed = read(outputs[1].id)
    assert [e.data for e in resumed if e.event == "output"] == ["b-2", "b-3"]
    assert resumed[-1].event == "done"


def test_failed_prediction_streams_error_then_done(client: httpx.Client) -> None:
    created = create(client, PATH, input={"prompt": "f", "n": 1, "fail": True})
    seen = read_stream(client, created["id"])
    errors = [e for e in seen if e.event == "error"]
    assert len(errors) == 1 and "failed as requested" in json.loads(errors[0].data)["detail"]
    assert seen[-1].event == "done"


def _expire_history(redis_url: str, prediction_id: str) -> None:
    with redis.Redis.from_url(redis_url) as r:
        assert r.delete(events_key(prediction_id)) == 1


def test_replay_after_the_history_expired_matches_the_live_stream(
    client: httpx.Client, redis_url: str
) -> None:
    created = create(client, PATH, input={"prompt": "e", "n": 3, "fail": True})
    live = read_stream(client, created["id"])
    _expire_history(redis_url, created["id"])

    replayed = read_stream(client, created["id"])
    public = [(e.event, e.data) for e in live]
    assert sorted(public) == sorted((e.event, e.data) for e in replayed)  # same events
    assert [e.data for e in replayed if e.event == "output"] == ["e-0", "e-1", "e-2"]
    assert [e.data for e in replayed if e.event == "logs"] == ["echo e-0", "echo e-1", "echo e-2"]
    [error] = [e for e in replayed if e.event == "error"]
    assert "failed as requested" in json.loads(error.data)["detail"]
    assert [e.event for e in replayed[-2:]] == ["error", "done"]

    resumed = read_stream(client, created["id"], last_event_id=replayed[1].id)
    assert [(e.event, e.data) for e in resumed] == [(e.event, e.data) for e in replayed[2:]]
    # An id of the expired live stream matches nothing replayed: the end is still told.
    gone = read_stream(client, created["id"], last_event_id=live[-2].id)
    assert [e.event for e in gone] == ["done"]


@pytest.mark.parametrize("expired", [False, True])
@pytest.mark.parametrize("last_event_id", ["abc", "12", "1-2-3", "-1-0"])
def test_malformed_last_event_id_is_400(
    client: httpx.Client, redis_url: str, expired: bool, last_event_id: str
) -> None:
    created = create(client, PATH, input={"prompt": "m"})
    wait_status(client, created["id"])
    if expired:
        _expire_history(redis_url, created["id"])
    response = client.get(
        f"/v1/predictions/{created['id']}/stream", headers={"Last-Event-ID": last_event_id}
    )
    assert assert_problem(response, 400)["errors"][0]["field"] == "Last-Event-ID"


def test_cancel_flagged_only_in_postgres_is_carried_out(
    client: httpx.Client, database_url: str
) -> None:
    """A cancel whose notice was lost (published while no director listened) is still found:
    the director looks at the flag while the prediction runs."""
    created = create(client, PATH, input={"prompt": "f", "n": 200, "delay": 0.05})
    wait_for(lambda: len(fetch(client, created["id"])["output"] or []) >= 2, "some output")
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE predictions SET cancel_requested = true WHERE id = %s", (created["id"],)
        )
    done = wait_status(client, created["id"], timeout=15)
    assert done["status"] == "canceled"
    assert 0 < len(done["output"]) < 200
    assert read_stream(client, created["id"])[-1].data == '{"reason":"canceled"}'


def test_cancel_ends_the_stream_with_reason(client: httpx.Client, stack: Stack, token: str) -> None:
    created = create(client, PATH, input={"prompt": "c", "n": 200, "delay": 0.05})
    seen: list[str] = []
    done: list[str] = []
    # httpx clients are not meant to be shared across threads: the reader gets its own.
    streamer = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"})

    def reader() -> None:
        path = f"/v1/predictions/{created['id']}/stream"
        with streamer.stream("GET", path) as response:
            for event in events(response):
                seen.append(event.event)
                if event.event == "done":
                    done.append(event.data)
                    return

    thread = threading.Thread(target=reader)
    thread.start()
    wait_for(lambda: seen.count("output") >= 2, "outputs on the stream")
    assert client.post(f"/v1/predictions/{created['id']}/cancel").status_code == 200
    thread.join(timeout=20)
    streamer.close()
    assert not thread.is_alive()
    assert done == ['{"reason":"canceled"}']
    assert fetch(client, created["id"])["status"] == "canceled"


def test_queued_stream_sends_heartbeats(launcher: Launcher, admin: Admin, token: str) -> None:
    name = f"test/idle-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, shards=1, visibility="public")  # no director: stays queued
    api, url = launcher.api(env={"CONDUIT_API_SSE_PING": "1"})
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            created = create(c, f"/v1/deployments/{name}/predictions", input={})
            path = f"/v1/predictions/{created['id']}/stream"
            with c.stream("GET", path, timeout=10) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                first = next(line for line in response.iter_lines() if line)
        assert first.startswith(":"), first  # a heartbeat comment, not an event
    finally:
        api.stop()


@pytest.fixture
def official(stack: Stack, token: str) -> Iterator[replicate.Client]:
    client = replicate.Client(api_token=token, base_url=stack.api_url)
    yield client
    client._client.close()


def test_official_client_streams(official: replicate.Client, stack: Stack) -> None:
    stream = official.stream(ECHO, input={"prompt": "o", "n": 5, "delay": 0.02})
    chunks = [str(e) for e in stream if e.event.value == "output"]
    assert chunks == [f"o-{i}" for i in range(5)]

    prediction = official.predictions.create(version=stack.version, input={"prompt": "p", "n": 4})
    streamed = [str(e) for e in prediction.stream() if e.event.value == "output"]
    assert streamed == [f"p-{i}" for i in range(4)]
