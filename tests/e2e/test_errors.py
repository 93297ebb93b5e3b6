"""Errors are problem+json, name the field at fault, and store or queue nothing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status

DEPLOYMENT_PATH = f"/v1/deployments/{ECHO}/predictions"


def _count(client: httpx.Client) -> int:
    return len(client.get("/v1/predictions").json()["results"])


def test_missing_or_bad_token_is_401(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url) as anonymous:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eA=="}):
            response = anonymous.post(DEPLOYMENT_PATH, json={"input": {}}, headers=headers)
            body = assert_problem(response, 401)
            assert response.headers["www-authenticate"] == "Bearer"
            assert body["title"] == "Unauthenticated"


def test_invalid_input_is_422_naming_the_field(client: httpx.Client) -> None:
    response = client.post(DEPLOYMENT_PATH, json={"input": {"n": "three"}})
    body = assert_problem(response, 422)
    assert body["errors"][0]["field"] == "input.n"
    assert "integer" in body["errors"][0]["message"]

    below_minimum = client.post(DEPLOYMENT_PATH, json={"input": {"n": 0}})
    assert assert_problem(below_minimum, 422)["errors"][0]["field"] == "input.n"

    no_input = client.post(DEPLOYMENT_PATH, json={})
    assert assert_problem(no_input, 422)["errors"][0]["field"] == "input"
    assert _count(client) == 0


def test_malformed_json_is_400(client: httpx.Client) -> None:
    response = client.post(
        DEPLOYMENT_PATH, content=b'{"input": {', headers={"Content-Type": "application/json"}
    )
    assert_problem(response, 400)
    assert _count(client) == 0


def test_a_body_not_sent_as_json_is_422_as_fastapi_answers_it(client: httpx.Client) -> None:
    body = b'{"input": {"prompt": "x"}}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if content_type is None else {"Content-Type": content_type}
        problem = assert_problem(client.post(DEPLOYMENT_PATH, content=body, headers=headers), 422)
        assert problem["errors"][0]["field"] == "body", problem
    sent_as_json = {"Content-Type": "application/vnd.example+json"}
    created = client.post(DEPLOYMENT_PATH, content=body, headers=sent_as_json)
    assert created.status_code == 201, created.text


def test_unknown_targets(client: httpx.Client) -> None:
    assert_problem(client.post("/v1/deployments/no/such/predictions", json={"input": {}}), 404)
    assert_problem(client.post("/v1/models/no/such/predictions", json={"input": {}}), 404)
    body = assert_problem(
        client.post("/v1/predictions", json={"version": "f" * 64, "input": {}}), 422
    )
    assert body["errors"][0]["field"] == "version"
    assert_problem(client.post("/v1/predictions", json={"input": {}}), 422)
    assert_problem(client.get("/v1/predictions/nope"), 404)
    assert_problem(client.get("/v1/models/no/such"), 404)
    assert_problem(client.get("/v1/deployments/no/such"), 404)
    assert _count(client) == 0


def test_oversize_body_is_413(client: httpx.Client) -> None:
    huge = {"input": {"prompt": "x" * (11 * 1024 * 1024)}}
    assert_problem(client.post(DEPLOYMENT_PATH, json=huge), 413)

    def chunks() -> Iterator[bytes]:
        for _ in range(11):
            yield b"x" * (1024 * 1024)

    chunked = client.post(
        DEPLOYMENT_PATH, content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_problem(chunked, 413)
    assert _count(client) == 0


def test_accounts_are_isolated(
    client: httpx.Client, stack: Stack, token: str, admin: Admin
) -> None:
    mine = create(client, DEPLOYMENT_PATH, input={"prompt": "mine"})
    wait_status(client, mine["id"])
    other_token = admin.create_account("other-" + token[-8:])
    with httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {other_token}"}
    ) as other:
        theirs = other.get(f"/v1/predictions/{mine['id']}")
        unknown = other.get("/v1/predictions/" + "a" * 26)
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["title"] == unknown.json()["title"]
        assert other.get("/v1/predictions").json()["results"] == []
        assert other.post(f"/v1/predictions/{mine['id']}/cancel").status_code == 404
