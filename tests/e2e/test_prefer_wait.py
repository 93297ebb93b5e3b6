"""``Prefer: wait``: blocking creates, Replicate's "starting" rule, and client disconnects."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import replicate

from tests.conftest import ECHO, Stack
from tests.fixtures.api import assert_problem, wait_status

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
    assert body["status"] == "starting"
    assert 0.9 <= elapsed < 3
    done = wait_status(client, body["id"])
    assert done["status"] == "succeeded" and len(done["output"]) == 4


@pytest.mark.parametrize("value", ["wait=0", "wait=61", "wait=abc", "wait=-1"])
def test_out_of_range_wait_is_400(client: httpx.Client, value: str) -> None:
    response = client.post(PATH, json={"input": {}}, headers={"Prefer": value})
    assert assert_problem(response, 400)["errors"][0]["field"] == "Prefer"
    assert client.get("/v1/predictions").json()["results"] == []


def test_disconnect_cancels_the_wait_not_the_prediction(stack: Stack, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}", "Prefer": "wait=30"}
    with httpx.Client(base_url=stack.api_url, headers=headers) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post(PATH, json={"input": {"prompt": "d", "n": 3, "delay": 0.5}}, timeout=0.5)
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}) as c:
        [created] = c.get("/v1/predictions").json()["results"]
        done = wait_status(c, created["id"])
        assert done["status"] == "succeeded" and done["output"] == ["d-0", "d-1", "d-2"]


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
