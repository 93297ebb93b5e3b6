"""``Prefer: wait``: blocking creates, Replicate's "starting" rule, and client disconnects."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import replicate

from tests.conftest import ECHO, Stack
from tests.fixtures.api import TERMINAL, assert_problem, fetch, wait_status
from tests.fixtures.redis_clients import stream_readers
from tests.fixtures.waiting import wait_for
from tracker.keys import events_key

PATH = f"/v1/deployments/{ECHO}/predictions"


def test_fast_model_returns_finished_prediction(client: httpx.Client) -> None:
    response = client.post(
        PATH, json={"input": {"prompt": "w", "n": 3}}, headers={"Prefer": "wait"}
    )
    assert response.status_code == 201
    assert response.headers["preference-applied"] == "wait"
    body = response.json()
    assert response.headers["location"] == body["urls"]["get"]
    assert body["status"] == "succeeded"
    assert body["output"] == ["w-0", "w-1", "w-2"]
    assert body["completed_at"] is not None


def test_slow_model_answers_starting_after_the_wait(client: httpx.Client) -> None:
    started = time.monotonic()
    response = client.post(
        PATH, json={"input": {"prompt": "s", "n": 4, "delay": 0.8}}, headers={"Prefer": "wait=1"}
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 201
    assert response.headers["preference-applied"] == "wait=1"
    body = response.json()
    assert body["status"] == "starting"  # answered before the model's 3.2 s were over
    assert elapsed >= 0.9  # and not before the wait's second
    done = wait_status(client, body["id"])
    assert done["status"] == "succeeded" and len(done["output"]) == 4


@pytest.mark.parametrize("value", ["wait=0", "wait=61", "wait=abc", "wait=-1"])
def test_out_of_range_wait_is_400(client: httpx.Client, value: str) -> None:
    response = client.post(PATH, json={"input": {}}, headers={"Prefer": value})
    assert assert_problem(response, 400)["errors"][0]["field"] == "Prefer"
    assert client.get("/v1/predictions").json()["results"] == []


def _open_wait(api_url: str, token: str, body: bytes, wait: int) -> socket.socket:
    """A create with ``Prefer: wait`` on a raw socket, so the test decides when the client
    goes away (closing it is the disconnect)."""
    parts = urlsplit(api_url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nPrefer: wait={wait}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_disconnect_cancels_the_wait_not_the_prediction(
    stack: Stack, token: str, redis_url: str
) -> None:
    """The api's wait is a blocking XREAD on the prediction's events key: once the client is
    gone no connection may stay blocked there, long before the 30 s wait or the 6 s
    prediction would have ended it."""
    body = orjson.dumps({"input": {"prompt": "d", "n": 1, "delay": 6}})
    headers = {"Authorization": f"Bearer {token}"}
    with (
        stream_readers(redis_url) as readers,
        httpx.Client(base_url=stack.api_url, headers=headers) as c,
    ):
        sock = _open_wait(stack.api_url, token, body, wait=30)
        try:
            listed = wait_for(lambda: c.get("/v1/predictions").json()["results"], "the create")
            key = events_key(listed[0]["id"])
            wait_for(lambda: readers.blocked_on(key), f"the api blocked reading {key}")
        finally:
            sock.close()
        gone = time.monotonic()
        wait_for(lambda: not readers.blocked_on(key), f"no reader left on {key}", timeout=3)
        assert time.monotonic() - gone < 3
        assert fetch(c, listed[0]["id"])["status"] not in TERMINAL  # still running: the wait ended
        done = wait_status(c, listed[0]["id"])
        assert done["status"] == "succeeded" and done["output"] == ["d-0"]


@pytest.fixture
def official(stack: Stack, token: str) -> Iterator[replicate.Client]:
    client = replicate.Client(api_token=token, base_url=stack.api_url)
    yield client
    client._client.close()


def test_run_returns_full_output_for_a_model_slower_than_the_wait(
    official: replicate.Client,
) -> None:
    started = time.monotonic()
    output = official.run(ECHO, input={"prompt": "r", "n": 3, "delay": 0.6}, wait=1)
    assert list(output) == ["r-0", "r-1", "r-2"]
    assert time.monotonic() - started >= 1.8
