"""Inputs Conduit cannot store, serialise or send are refused before anything is stored: 422
naming the field. What is stored reads back and runs, and the account's reads stay 200."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator

import httpx
import pytest

from catalog import lookups
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.processes import Launcher

PATH = f"/v1/deployments/{ECHO}/predictions"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def open_path(stack: Stack, launcher: Launcher, admin: Admin) -> Iterator[str]:
    """A deployment of an echo version whose ``Input`` allows fields it does not declare
    (``additionalProperties``): what such a field carries is stored, read back and run. (The
    echo deployment's schema declares its fields only: another field there is refused.)"""
    found = admin._run(lambda engine: lookups.get_version(engine, stack.version))
    assert found is not None
    schema = copy.deepcopy(found.openapi_schema)
    schema["components"]["schemas"]["Input"]["additionalProperties"] = True
    # A model of its own: a new version of conduit/echo would become its latest, which the
    # other tests' model-level predictions would then wait on.
    name = f"conduit/open-{uuid.uuid4().hex[:8]}"
    admin.create_model(name, stack.runner_url, visibility="public")
    version = admin.register_version(name, schema, f"open-{uuid.uuid4().hex[:8]}")
    admin.create_deployment(name, name, version=version, visibility="public")
    director = launcher.director(name, stack.runner_url, concurrency=2)
    yield f"/v1/deployments/{name}/predictions"
    director.stop()


def _count(client: httpx.Client) -> int:
    response = client.get("/v1/predictions")
    assert response.status_code == 200, response.text
    return len(response.json()["results"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"input": {"prompt": "x", "extra": 18446744073709551616}}', "input.extra"),
        (b'{"input": {"prompt": "x", "extra": -9223372036854775809}}', "input.extra"),
        (b'{"input": {"prompt": "x", "extra": [1, NaN]}}', "input.extra.1"),
        (b'{"input": {"prompt": "x", "extra": Infinity}}', "input.extra"),
        (b'{"input": {"prompt": "x", "extra": -Infinity}}', "input.extra"),
        (b'{"input": {"prompt": "x", "extra": 1e999}}', "input.extra"),
        (b'{"input": {"prompt": "x\\ud800y"}}', "input.prompt"),
        (b'{"input": {"prompt": "x", "\\udfff": 1}}', "input.'\\udfff'"),
        (b'{"input": {"prompt": "x", "extra": {"a": ["\\ud83d"]}}}', "input.extra.a.0"),
        (b'{"input": {"prompt": "x"}, "webhook": "http://\\ud800/"}', "webhook"),
        (b'{"input": {"prompt": "x"}, "version": "a/\\ud800"}', "version"),
    ],
)
def test_unsendable_values_are_422_naming_the_field(
    client: httpx.Client, body: bytes, field: str
) -> None:
    path = PATH if b'"version"' not in body else "/v1/predictions"
    response = client.post(path, content=body, headers=JSON)
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["field"] == field, problem
    assert _count(client) == 0


def test_nul_anywhere_in_the_input_is_422(client: httpx.Client) -> None:
    for body in (
        {"input": {"prompt": "x\u0000y"}},
        {"input": {"prompt": "x", "extra": {"k\u0000": 1}}},
        {"input": {"prompt": "x", "extra": [["\u0000"]]}},
    ):
        assert_problem(client.post(PATH, json=body), 422)
    assert _count(client) == 0


def test_nesting_past_the_limit_is_422(client: httpx.Client, open_path: str) -> None:
    deep: object = "leaf"
    for _ in range(64):  # input (level 1) + 64 levels below it
        deep = [deep]
    problem = assert_problem(client.post(PATH, json={"input": {"extra": deep}}), 422)
    assert problem["errors"][0]["field"].startswith("input.extra")
    assert "nested deeper than 64" in problem["errors"][0]["message"]

    far_too_deep = b'{"input": {"extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    response = client.post(PATH, content=far_too_deep, headers=JSON)
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert _count(client) == 0

    fits = "leaf"
    for _ in range(62):
        fits = [fits]  # type: ignore[assignment]
    prediction = create(client, open_path, input={"extra": fits})
    done = wait_status(client, prediction["id"])
    assert done["status"] == "succeeded", done
    assert done["input"]["extra"] == fits


def test_edge_numbers_are_stored_and_read_back_as_sent(
    client: httpx.Client, open_path: str
) -> None:
    extra = {
        "big": 18446744073709551615,
        "small": -9223372036854775808,
        "float": 1e20,
        "huge": 1.7976931348623157e308,
        "tiny": 5e-324,
        "half": 1.5,
    }
    prediction = create(client, open_path, input={"prompt": "x", "extra": extra})
    assert prediction["input"]["extra"] == extra
    done = wait_status(client, prediction["id"])
    assert done["status"] == "succeeded", done
    assert done["input"]["extra"] == extra
    listed = client.get("/v1/predictions")
    assert listed.status_code == 200, listed.text
    assert listed.json()["results"][0]["input"]["extra"] == extra


def test_idempotent_create_refuses_the_same_way(client: httpx.Client, open_path: str) -> None:
    body = b'{"input": {"prompt": "x", "extra": 18446744073709551616}}'
    headers = {**JSON, "Idempotency-Key": "hostile-1"}
    assert_problem(client.post(PATH, content=body, headers=headers), 422)
    assert _count(client) == 0
    body_ok = {"input": {"extra": 1e20}}
    ok = client.post(open_path, json=body_ok, headers={"Idempotency-Key": "k2"})
    assert ok.status_code == 201, ok.text
    assert ok.json()["input"]["extra"] == 1e20
    again = client.post(open_path, json=body_ok, headers={"Idempotency-Key": "k2"})
    assert again.status_code == 201 and again.json()["id"] == ok.json()["id"]
    assert wait_status(client, ok.json()["id"])["status"] == "succeeded"


def test_idempotent_create_with_a_lone_surrogate_is_422(client: httpx.Client) -> None:
    body = b'{"input": {"prompt": "x\\udc00"}}'
    headers = {**JSON, "Idempotency-Key": "surrogate"}
    problem = assert_problem(client.post(PATH, content=body, headers=headers), 422)
    assert problem["errors"][0]["field"] == "input.prompt"
    assert _count(client) == 0


def test_idempotent_create_with_a_lone_surrogate_in_a_key_is_422(client: httpx.Client) -> None:
    body = b'{"input": {"prompt": "x", "extra": {"a\\udfffb": "c\\udfffd"}}}'
    headers = {**JSON, "Idempotency-Key": "surrogate-key"}
    problem = assert_problem(client.post(PATH, content=body, headers=headers), 422)
    assert problem["errors"][0]["field"] == "input.extra.'a\\udfffb'"
    assert _count(client) == 0


@pytest.fixture
def capped(launcher: Launcher, admin: Admin, stack: Stack) -> Iterator[str]:
    """A deployment of the echo model whose director allows little output and logs."""
    name = f"test/capped-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    _, runner_url = launcher.runner("echo", concurrency=2)
    director = launcher.director(
        name, runner_url, concurrency=2, max_output_bytes="2000", max_log_bytes="1000"
    )
    yield name
    director.stop()


def test_output_and_logs_past_their_caps_fail_the_prediction(
    client: httpx.Client, capped: str
) -> None:
    path = f"/v1/deployments/{capped}/predictions"
    # Each output is ~100 bytes and each log line as much: the caps pass in about ten steps,
    # while the run would take a thousand.
    long_run = create(client, path, input={"prompt": "o" * 90, "n": 1000, "delay": 0.01})
    done = wait_status(client, long_run["id"], timeout=60)
    assert done["status"] == "failed", done["error"]
    assert "passed the limit" in done["error"]
    assert len(done["output"] or []) < 100
    ok = create(client, path, input={"prompt": "fine", "n": 2})
    assert wait_status(client, ok["id"])["status"] == "succeeded"
    assert client.get("/v1/predictions").status_code == 200


def test_an_integral_float_beyond_the_models_bound_is_422(client: httpx.Client) -> None:
    """JSON Schema counts 7.5e295 as an integer: only the model's own bound keeps it from
    running (echo would loop until its deadline)."""
    for n in (7.5e295, 100_001):
        problem = assert_problem(client.post(PATH, json={"input": {"n": n}}), 422)
        assert problem["errors"][0]["field"] == "input.n", problem
    assert _count(client) == 0
