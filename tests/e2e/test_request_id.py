"""``X-Request-Id``: adopted when sane, made otherwise, answered, and carried by the director's
log lines about the prediction it created."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import orjson

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, wait_status
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.waiting import wait_for

MADE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def json_lines(proc: Proc) -> list[dict[str, Any]]:
    lines = []
    for line in proc.log().splitlines():
        if line.startswith("{"):
            document = orjson.loads(line)
            assert isinstance(document, dict)
            lines.append(document)
    return lines


def test_a_sane_client_id_is_adopted_and_answered(client: httpx.Client) -> None:
    sent = f"client-{uuid.uuid4().hex}.v1_x"
    response = client.get("/v1/predictions", headers={"X-Request-Id": sent})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == sent
    # Errors carry it as well.
    missing = client.get("/v1/predictions/nosuch", headers={"X-Request-Id": sent})
    assert_problem(missing, 404)
    assert missing.headers["x-request-id"] == sent


def test_a_missing_or_insane_id_is_replaced(client: httpx.Client) -> None:
    made = client.get("/v1/predictions").headers["x-request-id"]
    assert MADE.fullmatch(made)
    for insane in ("x" * 129, "has space", "semi;colon", "ünï"):
        sent = insane.encode()  # as bytes: UTF-8 on the wire, as a client may send
        answered = client.get("/v1/predictions", headers={b"X-Request-Id": sent}).headers[
            "x-request-id"
        ]
        assert answered != insane and MADE.fullmatch(answered), insane
    assert client.get("/v1/predictions").headers["x-request-id"] != made  # one per request


def test_director_json_log_lines_about_the_prediction_carry_its_request_id(
    stack: Stack, client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    name = f"test/rid-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    runner, runner_url = launcher.runner("echo", concurrency=1)
    director = launcher.director(
        name, runner_url, concurrency=1, env={"CONDUIT_LOG_FORMAT": "json"}
    )
    request_id = f"rid-{uuid.uuid4().hex}"
    response = client.post(
        f"/v1/deployments/{name}/predictions",
        json={"input": {"prompt": "r"}},
        headers={"X-Request-Id": request_id},
    )
    assert response.status_code == 201
    assert response.headers["x-request-id"] == request_id
    prediction_id = response.json()["id"]
    assert wait_status(client, prediction_id)["status"] == "succeeded"

    def about_it() -> list[dict[str, Any]]:
        return [line for line in json_lines(director) if line.get("prediction_id") == prediction_id]

    lines = wait_for(
        lambda: [line for line in about_it() if "ended succeeded" in line["message"]],
        "the director's line about the prediction's end",
    )
    assert lines[0]["request_id"] == request_id
    assert lines[0]["level"] == "INFO" and lines[0]["logger"] == "director.handling"
    # No line about this prediction names another request.
    assert {line.get("request_id", request_id) for line in about_it()} == {request_id}
    director.stop()
    runner.stop()


def test_text_log_lines_carry_the_ids_too(
    stack: Stack, client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    name = f"test/rid-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    runner, runner_url = launcher.runner("echo", concurrency=1)
    director = launcher.director(name, runner_url, concurrency=1)
    request_id = f"rid-{uuid.uuid4().hex}"
    response = client.post(
        f"/v1/deployments/{name}/predictions",
        json={"input": {"prompt": "t"}},
        headers={"X-Request-Id": request_id},
    )
    prediction_id = response.json()["id"]
    wait_status(client, prediction_id)
    tag = f"[request_id={request_id} prediction_id={prediction_id}]"
    wait_for(
        lambda: [line for line in director.log().splitlines() if tag in line],
        "a text line tagged with both ids",
    )
    director.stop()
    runner.stop()
