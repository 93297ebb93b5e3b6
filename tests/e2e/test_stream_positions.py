"""``Last-Event-ID`` names a position the stream has had, or is refused; and every stream that
starts ends with ``done`` once the prediction is over, from wherever it resumed."""

from __future__ import annotations

import threading
import time
import uuid

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import SSE, events, read_stream

PATH = f"/v1/deployments/{ECHO}/predictions"
#: Under the api's SSE heartbeat (15 s): a stream left open fails the read instead of idling.
READ_TIMEOUT = 10.0


def test_an_id_past_a_queued_predictions_empty_stream_is_refused_and_it_still_ends(
    stack: Stack, launcher: Launcher, admin: Admin, client: httpx.Client
) -> None:
    idle = f"test/queued-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(idle, ECHO, visibility="public")  # no director yet: stays queued
    created = create(client, f"/v1/deployments/{idle}/predictions", input={"prompt": "q"})
    path = f"/v1/predictions/{created['id']}/stream"
    for guess in ("99999999999999-0", "1-0", "0-1"):
        refused = client.get(path, headers={"Last-Event-ID": guess}, timeout=READ_TIMEOUT)
        assert assert_problem(refused, 400)["errors"][0]["field"] == "Last-Event-ID"

    # From the start ("0-0" is the start), the stream follows the prediction to its end.
    seen: list[SSE] = []

    def follow() -> None:
        headers = {"Accept": "text/event-stream", "Last-Event-ID": "0-0"}
        deadline = time.monotonic() + 60
        with client.stream("GET", path, headers=headers, timeout=60) as response:
            assert response.status_code == 200
            seen.extend(events(response, deadline=deadline))

    reader = threading.Thread(target=follow)
    reader.start()
    launcher.director(idle, stack.runner_url, concurrency=1)
    reader.join(timeout=90)
    assert not reader.is_alive()
    assert [e.data for e in seen if e.event == "output"] == ["q-0"]
    assert seen[-1].event == "done"


def test_a_stream_resumed_mid_run_or_from_done_ends_with_done(client: httpx.Client) -> None:
    created = create(client, PATH, input={"prompt": "m", "n": 30, "delay": 0.05})
    path = f"/v1/predictions/{created['id']}/stream"
    with client.stream("GET", path, headers={"Accept": "text/event-stream"}) as response:
        first = []
        for event in events(response):
            first.append(event)
            if len([e for e in first if e.event == "output"]) == 2:
                break
    resumed = read_stream(client, created["id"], first[-1].id, timeout=60)
    assert [e.data for e in resumed if e.event == "output"] == [f"m-{i}" for i in range(2, 30)]

    # A client that saw ``done`` and resumes from it is told the end again, and let go.
    wait_status(client, created["id"])
    done = resumed[-1]
    again = read_stream(client, created["id"], done.id, timeout=READ_TIMEOUT)
    assert [(e.event, e.id) for e in again] == [("done", done.id)]
    # A position past ``done`` was never sent.
    ms, _, seq = (done.id or "").partition("-")
    past = f"{ms}-{int(seq) + 1}"
    refused = client.get(path, headers={"Last-Event-ID": past}, timeout=READ_TIMEOUT)
    assert assert_problem(refused, 400)["errors"][0]["field"] == "Last-Event-ID"
