"""Files through the synchronous lane (``/run``), as through a queued prediction: a file
reference in the input reaches the model as a signed delivery URL, and a large data URL in the
runner's answer (a Conduit runner called without an upload prefix sends its ``Path`` output
as one) is moved into the file store before the answer, or its ``output`` event, leaves; a
small one stays inline. The run's record holds the URL, and its input as it was given."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runners.models.files import made_bytes
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import events
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
EVENTS = {"Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def files_model(stack: Stack, launcher: Launcher, admin: Admin) -> Iterator[str]:
    """A public deployment of the ``files`` model on a Conduit runner of its own; its
    director registers the runner in the fleet, where the lane finds it."""
    proc, url = launcher.runner("files", concurrency=4)
    name = f"lane-files-{uuid.uuid4().hex[:8]}/files"
    admin.create_model(name, url)
    admin.create_deployment(name, name, shards=1, visibility="public")
    director = launcher.director(name, url, concurrency=4)
    try:
        yield name
    finally:
        director.stop()
        proc.stop()


def _run(client: httpx.Client, deployment: str, body: dict[str, Any]) -> httpx.Response:
    """The first answer that is not "no runner yet" (the fleet view takes a heartbeat or two
    to see a newly registered runner)."""
    path = f"/v1/deployments/{deployment}/run"

    def probe() -> httpx.Response | None:
        response = client.post(path, json=body, timeout=120)
        if response.status_code == 429 and "No runner" in response.json().get("detail", ""):
            return None
        return response

    return wait_for(probe, f"a runner for {path}", timeout=60)


def _made(size: int, seed: int) -> bytes:
    return b"".join(made_bytes(size, seed))


def _bytes_at(url: str) -> bytes:
    """The output URL fetched as anyone would: no token, no redirect followed."""
    answer = httpx.get(url, timeout=60, follow_redirects=False)
    assert answer.status_code == 200, (answer.status_code, answer.text[:300])
    return answer.content


def _recorded(client: httpx.Client, run_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        response = client.get(f"/v1/predictions/{run_id}")
        return response.json() if response.status_code == 200 else None

    return wait_for(probe, f"the record of run {run_id}")


def test_a_large_output_comes_back_as_a_url_to_its_bytes(
    client: httpx.Client, files_model: str
) -> None:
    response = _run(client, files_model, {"input": {"size": 2 * MIB, "seed": 11}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "succeeded", body["error"]
    output = body["output"]
    assert output.startswith("http"), output[:80]
    assert _bytes_at(output) == _made(2 * MIB, 11)
    assert len(response.content) < 64 * 1024
    recorded = _recorded(client, body["id"])
    assert recorded["source"] == "sync"
    assert recorded["output"] == output


def test_a_small_output_stays_a_data_url(client: httpx.Client, files_model: str) -> None:
    body = {"input": {"size": 1000, "seed": 4, "suffix": ".txt"}}
    response = _run(client, files_model, body)
    assert response.status_code == 200, response.text
    output = response.json()["output"]
    assert output.startswith("data:text/plain;base64,"), output[:60]
    assert base64.b64decode(output.partition(",")[2]) == _made(1000, 4)


def test_an_uploaded_file_reaches_the_model_intact(client: httpx.Client, files_model: str) -> None:
    data = _made(MIB + 5, seed=21)
    upload = client.post("/v1/files", files={"content": ("photo.png", data, "image/png")})
    assert upload.status_code == 201, upload.text
    reference = upload.json()["urls"]["get"]
    response = _run(client, files_model, {"input": {"file": reference}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "succeeded", body["error"]
    assert _bytes_at(body["output"]) == data
    recorded = _recorded(client, body["id"])
    assert recorded["input"] == {"file": reference}  # as given, not the runner's signed URL
    assert recorded["output"] == body["output"]


def test_a_streamed_run_carries_the_url_in_its_output_event(
    client: httpx.Client, files_model: str
) -> None:
    _run(client, files_model, {"input": {}})  # the lane knows the runner
    path = f"/v1/deployments/{files_model}/run"
    body = {"input": {"size": 2 * MIB, "seed": 12}}
    with client.stream("POST", path, json=body, headers=EVENTS, timeout=120) as response:
        assert response.status_code == 200
        seen = list(events(response, deadline=time.monotonic() + 120))
    outputs = [e.data for e in seen if e.event == "output"]
    assert len(outputs) == 1 and outputs[0].startswith("http"), [o[:80] for o in outputs]
    assert _bytes_at(outputs[0]) == _made(2 * MIB, 12)
    assert seen[-1].event == "done" and seen[-1].data == "{}"
    assert "error" not in {e.event for e in seen}


def test_an_output_file_that_cannot_be_stored_fails_the_run(
    launcher: Launcher, client: httpx.Client, token: str, files_model: str
) -> None:
    """An api whose store takes no file as large as the output: the run fails with why, in
    the answer and in the stream, and no data URL is answered instead."""
    with launcher.own_api({"CONDUIT_FILES_MAX_BYTES": str(MIB)}) as api_url:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api_url, headers=headers, timeout=120) as own:
            response = _run(own, files_model, {"input": {"size": 2 * MIB, "seed": 13}})
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["status"] == "failed"
            assert body["error"].startswith("output file could not be stored: "), body["error"]
            assert body["output"] is None
            path = f"/v1/deployments/{files_model}/run"
            streamed = {"input": {"size": 2 * MIB, "seed": 14}}
            with own.stream("POST", path, json=streamed, headers=EVENTS) as answer:
                seen = list(events(answer, deadline=time.monotonic() + 120))
    kinds = [e.event for e in seen]
    assert kinds[-2:] == ["error", "done"] and "output" not in kinds, seen
    assert "output file could not be stored" in seen[-2].data
    recorded = _recorded(client, body["id"])  # the client's account, on the session's api
    assert recorded["status"] == "failed" and recorded["output"] is None
    assert recorded["error"] == body["error"]
