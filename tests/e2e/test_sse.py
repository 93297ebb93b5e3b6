"""SSE: ordered outputs, late join, Last-Event-ID resume, done on cancel, official client."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
import replicate

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import events, read_stream
from tests.fixtures.waiting import wait_for

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


def test_failed_prediction_streams_error_then_done(client: httpx.Client) -> None:
    created = create(client, PATH, input={"prompt": "f", "n": 1, "fail": True})
    seen = read_stream(client, created["id"])
    errors = [e for e in seen if e.event == "error"]
    assert len(errors) == 1 and "failed as requested" in json.loads(errors[0].data)["detail"]
    assert seen[-1].event == "done"


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
    admin.create_deployment(name, ECHO, shards=1)  # no director: stays queued
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
