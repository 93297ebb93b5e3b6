"""Depth and size from outside, through the real api: JSON nested hundreds deep in an input, a
training's input or a file's metadata, a registry filter too deep or too long, a named graph's
expression nested too deep: each a 4xx naming the field (``core.nesting``), never a 500, and a
registry filter never reaches Postgres as a statement it refuses ("the database is
unreachable", 503)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.api import assert_problem

DEEP = 900  # past any recursive walk's reach (Python's ~1,000 frames), within the parser's


def _deep_body(key: str, levels: int = DEEP) -> bytes:
    """``{"<key>": {"e": [[[...]]]}}`` written out (no encoder on this side recurses)."""
    return f'{{"{key}": {{"e": {"[" * levels}"leaf"{"]" * levels}}}'.encode() + b"}"


def _fields(problem: dict[str, Any]) -> list[str]:
    return [error["field"] for error in problem.get("errors") or []]


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/deployments/{ECHO}/predictions",
        f"/v1/models/{ECHO}/predictions",
        "/v1/predictions",
        "trainings",
    ],
)
def test_an_input_nested_hundreds_deep_is_422_naming_input(
    client: httpx.Client, stack: Stack, path: str
) -> None:
    if path == "trainings":
        path = f"/v1/models/{ECHO}/versions/{stack.version}/trainings"
    body = json.loads(_deep_body("input"))
    body["version"] = stack.version
    body["destination"] = ECHO
    response = client.post(path, content=json.dumps(body).encode(), headers=JSON)
    problem = assert_problem(response, 422)
    assert any(field.startswith("input") for field in _fields(problem)), problem
    assert "nested deeper than" in problem["detail"]
    assert client.get("/v1/predictions").json()["results"] == []


JSON = {"Content-Type": "application/json"}


def test_file_metadata_nested_hundreds_deep_is_422_naming_it(client: httpx.Client) -> None:
    for levels in (300, DEEP):
        metadata = '{"m": ' + "[" * levels + "]" * levels + "}"
        response = client.post(
            "/v1/files",
            files={"content": ("a.txt", b"x", "text/plain")},
            data={"metadata": metadata},
        )
        problem = assert_problem(response, 422)
        assert _fields(problem)[0].startswith("metadata.m"), problem
        assert "nested deeper than 64 levels" in problem["detail"]
    assert client.get("/v1/files").json()["results"] == []


def _and_chain(levels: int) -> dict[str, Any]:
    document: dict[str, Any] = {"inference_server_name": "x"}
    for _ in range(levels):
        document = {"$and": [document]}
    return document


def test_registry_filters_are_bounded_in_depth_and_length(client: httpx.Client) -> None:
    deep = assert_problem(client.post("/inference_servers", json=_and_chain(300)), 400)
    assert _fields(deep)[0].startswith("filter.$and"), deep
    assert "nested deeper than 64 levels" in deep["detail"]

    names = [f"server-{i}" for i in range(30_000)]
    for field in ("inference_server_name", "inference_server_metadata.region"):
        long = client.post("/inference_servers", json={field: {"$in": names}})
        problem = assert_problem(long, 400)  # was 503 "the database is unreachable"
        assert _fields(problem) == [f"filter.{field}.$in"], problem
        assert "at most 1000 values" in problem["detail"]
        assert "retry-after" not in long.headers
    wide = {"$or": [{"inference_server_metadata.n": i} for i in range(2001)]}
    too_many = assert_problem(client.post("/inference_servers", json=wide), 400)
    assert "at most 2000 conditions" in too_many["detail"]

    # At the bounds, Postgres takes the statement.
    at_most = {"inference_server_metadata.region": {"$in": names[:1000]}}
    assert client.post("/inference_servers", json=at_most).status_code == 200
    widest = {"$or": [{"inference_server_metadata.n": i} for i in range(1000)]}
    widest["inference_server_name"] = {"$in": names[:990]}
    assert client.post("/inference_servers", json=widest).status_code == 200


@pytest.mark.parametrize("expression", ["!" * 900 + "input", "[" * 300 + "input" + "]" * 300])
def test_a_graph_expression_nested_too_deep_is_422_naming_it(
    client: httpx.Client, expression: str
) -> None:
    spec = {
        "name": f"deep-{uuid.uuid4().hex[:8]}",
        "steps": [{"id": "s", "block": "blk-aaaaaaaa", "input": {"prompt": expression}}],
    }
    problem = assert_problem(client.post("/v1/graphs", json=spec), 422)
    refused = {error["field"]: error["message"] for error in problem["errors"]}
    assert "nested deeper than 64 levels" in refused["steps[0].input.prompt"], problem
