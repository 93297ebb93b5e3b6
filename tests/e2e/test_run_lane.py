"""The synchronous lane (``/run``) on a live stack: runners known from the fleet registry,
the answer in the body, the run recorded afterwards, 429 ``out_of_capacity`` when capacity is
gone, a refusing runner's request moved to another runner, a client that leaves freeing its
place, and two api replicas sharing a runner's permits."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import events
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

RUN = f"/v1/deployments/{ECHO}/run"


def _ready_run(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """The first answer that is not "no runner yet" (the fleet view takes a heartbeat or
    two to see a newly registered runner)."""

    def probe() -> httpx.Response | None:
        response = client.post(path, json=body)
        if response.status_code == 429 and "No runner" in response.json().get("detail", ""):
            return None
        return response

    return wait_for(probe, f"a runner for {path}")


def test_run_answers_the_output_with_timing_headers(client: httpx.Client) -> None:
    response = _ready_run(client, RUN, {"input": {"prompt": "hi", "n": 2}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "status", "output", "error", "metrics"}
    assert body["status"] == "succeeded"
    assert body["output"] == ["hi-0", "hi-1"]
    assert body["error"] is None
    assert body["metrics"]["predict_time"] >= 0
    assert body["metrics"]["total_time"] >= body["metrics"]["predict_time"]
    headers = response.headers
    assert headers["X-Conduit-Attempts"] == "1"
    assert int(headers["X-Queue-Wait-Ms"]) >= 0
    assert float(headers["X-Processing-Time"]) > 0
    assert float(headers["X-Remote-Processing-Time"]) > 0  # the runner's own
    assert headers["X-Cache-Hit"] == "false"  # forwarded from the runner


def test_the_run_is_recorded_in_the_list_and_usage(client: httpx.Client) -> None:
    response = _ready_run(client, RUN, {"input": {"prompt": "kept"}})
    assert response.status_code == 200, response.text
    run_id = response.json()["id"]

    def listed() -> dict[str, Any] | None:
        page = client.get("/v1/predictions").json()["results"]
        return next((p for p in page if p["id"] == run_id), None)

    prediction = wait_for(listed, "the run in the account's list")
    assert prediction["source"] == "sync"
    assert prediction["status"] == "succeeded"
    assert prediction["output"] == ["kept-0"]
    assert prediction["input"] == {"prompt": "kept"}
    assert prediction["started_at"] and prediction["completed_at"]
    assert client.get(f"/v1/predictions/{run_id}").json()["source"] == "sync"
    usage = client.get("/v1/usage").json()
    assert usage["predictions"] == 1
    (item,) = usage["by_deployable"]
    assert item["deployable"] == ECHO


def test_bad_input_is_refused_as_predictions_refuse_it(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    for body in ({"input": {"n": "many"}}, {"input": "text"}, {}, {"input": {"prompt": "a\x00"}}):
        ran = assert_problem(client.post(RUN, json=body), 422)
        created = assert_problem(client.post(f"/v1/deployments/{ECHO}/predictions", json=body), 422)
        for problem in (ran, created):
            problem.pop("instance")
        assert ran == created
    broken = {"content": b'{"input": ', "headers": {"Content-Type": "application/json"}}
    ran = assert_problem(client.post(RUN, **broken), 400)  # type: ignore[arg-type]
    created = assert_problem(
        client.post(f"/v1/deployments/{ECHO}/predictions", **broken),  # type: ignore[arg-type]
        400,
    )
    assert ran["errors"] == created["errors"]


def test_a_private_deployment_is_not_found(
    stack: Stack, launcher: Launcher, admin: Admin, client: httpx.Client
) -> None:
    name = f"private-{uuid.uuid4().hex[:8]}/echo"
    admin.create_model(name, stack.runner_url, visibility="private")
    admin.create_deployment(name, name)
    assert_problem(client.post(f"/v1/deployments/{name}/run", json={"input": {}}), 404)
    assert_problem(client.post(f"/v1/deployments/{name}-not/run", json={"input": {}}), 404)
    assert_problem(client.post(f"/v1/models/{name}/run", json={"input": {}}), 404)


def test_a_model_runs_on_the_runners_of_its_version(client: httpx.Client) -> None:
    response = _ready_run(client, f"/v1/models/{ECHO}/run", {"input": {"prompt": "m"}})
    assert response.status_code == 200, response.text
    assert response.json()["output"] == ["m-0"]


def test_run_streams_output_events_then_done(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    body = {"input": {"prompt": "s", "n": 3}}
    headers = {"Accept": "text/event-stream"}
    with client.stream("POST", RUN, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["X-Conduit-Attempts"] == "1"
        seen = list(events(response, deadline=time.monotonic() + 30))
    outputs = [e.data for e in seen if e.event == "output"]
    assert outputs == ["s-0", "s-1", "s-2"]
    assert [e.data for e in seen if e.event == "logs"] == ["echo s-0", "echo s-1", "echo s-2"]
    assert seen[-1].event == "done" and seen[-1].data == "{}"
    assert [e.event for e in seen].count("done") == 1
    assert {e.event for e in seen} <= {"output", "logs", "error", "done"}


def test_a_failing_model_streams_an_error_before_done(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    body = {"input": {"prompt": "f", "fail": True}}
    with client.stream("POST", RUN, json=body, headers={"Accept": "text/event-stream"}) as r:
        seen = list(events(r, deadline=time.monotonic() + 30))
    kinds = [e.event for e in seen]
    assert kinds[-2:] == ["error", "done"]
    assert "echo failed as requested" in seen[-2].data
    assert [e.data for e in seen if e.event == "output"] == ["f-0"]
