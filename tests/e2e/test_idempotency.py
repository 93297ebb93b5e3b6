"""``Idempotency-Key`` on create: one prediction per key and request, through real processes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from api.idempotency import Idempotency
from core.ids import token_sha256
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, wait_status

DEPLOYMENT_PATH = f"/v1/deployments/{ECHO}/predictions"


def _post(
    client: httpx.Client,
    key: str,
    body: dict[str, Any],
    path: str = DEPLOYMENT_PATH,
    **headers: str,
) -> httpx.Response:
    return client.post(path, json=body, headers={"Idempotency-Key": key, **headers})


def _ids(client: httpx.Client) -> list[str]:
    return [p["id"] for p in client.get("/v1/predictions").json()["results"]]


def _unsigned(prediction: dict[str, Any]) -> dict[str, Any]:
    """The prediction less its stream URL's signature: signed per answer, its expiry moves on
    with the clock's second."""
    urls = {**prediction["urls"], "stream": prediction["urls"]["stream"].split("?")[0]}
    return {**prediction, "urls": urls}


def _field(body: dict[str, Any]) -> str:
    field: str = body["errors"][0]["field"]
    return field


@pytest.fixture
def other_client(stack: Stack, admin: Admin) -> Iterator[httpx.Client]:
    token = admin.create_account(f"acct-{uuid.uuid4().hex[:10]}")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
        yield http


def test_same_key_and_body_replays_the_same_prediction(client: httpx.Client) -> None:
    body = {"input": {"prompt": "once", "n": 2}}
    first = _post(client, "k-1", body)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    created = first.json()

    # Key order in the body does not matter: the fingerprint is canonical JSON.
    again = _post(client, "k-1", {"input": {"n": 2, "prompt": "once"}})
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == created["id"]
    assert again.headers["location"] == created["urls"]["get"]
    assert _ids(client) == [created["id"]]

    done = wait_status(client, created["id"])
    assert done["status"] == "succeeded"
    assert done["output"] == ["once-0", "once-1"]
    # A replay shows the prediction as it is now, rendered like a GET.
    replayed = _post(client, "k-1", body)
    assert replayed.headers["idempotent-replayed"] == "true"
    assert _unsigned(replayed.json()) == _unsigned(
        client.get(f"/v1/predictions/{created['id']}").json()
    )
    assert _ids(client) == [created["id"]]


def test_replay_with_prefer_wait_returns_the_finished_prediction(client: httpx.Client) -> None:
    body = {"input": {"prompt": "w"}}
    first = _post(client, "k-wait", body, Prefer="wait=30")
    assert first.status_code == 201, first.text
    assert first.json()["status"] == "succeeded"

    again = _post(client, "k-wait", body, Prefer="wait=30")
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["preference-applied"] == "wait=30"
    assert again.json() == first.json()


def test_same_key_with_a_different_request_is_422(client: httpx.Client, stack: Stack) -> None:
    body = {"input": {"prompt": "a"}}
    created = _post(client, "k-2", body)
    assert created.status_code == 201, created.text

    different = [
        _post(client, "k-2", {"input": {"prompt": "b"}}),
        _post(client, "k-2", body, **{"Cancel-After": "5m"}),
        # Same version, but not through the deployment: another destination.
        _post(client, "k-2", body, path=f"/v1/models/{ECHO}/predictions"),
        _post(client, "k-2", {**body, "version": stack.version}, path="/v1/predictions"),
    ]
    for response in different:
        problem = assert_problem(response, 422)
        assert _field(problem) == "Idempotency-Key"
        assert "different request" in problem["detail"]
    assert _ids(client) == [created.json()["id"]]


def test_cancel_after_is_compared_by_duration(client: httpx.Client) -> None:
    body = {"input": {"prompt": "d"}}
    first = _post(client, "k-3", body, **{"Cancel-After": "90s"})
    again = _post(client, "k-3", body, **{"Cancel-After": "1m30s"})
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]


def test_empty_or_overlong_key_is_400(client: httpx.Client) -> None:
    body = {"input": {"prompt": "x"}}
    for key in ("", "k" * 256):
        problem = assert_problem(_post(client, key, body), 400)
        assert _field(problem) == "Idempotency-Key"
    assert _ids(client) == []
    assert _post(client, "k" * 255, body).status_code == 201


def test_keys_belong_to_one_account(client: httpx.Client, other_client: httpx.Client) -> None:
    body = {"input": {"prompt": "mine"}}
    mine = _post(client, "shared", body)
    theirs = _post(other_client, "shared", body)
    assert mine.status_code == theirs.status_code == 201
    assert "idempotent-replayed" not in theirs.headers
    assert mine.json()["id"] != theirs.json()["id"]
    assert _ids(client) == [mine.json()["id"]]
    assert _ids(other_client) == [theirs.json()["id"]]


def test_concurrent_creates_with_one_key_make_one_prediction(client: httpx.Client) -> None:
    body = {"input": {"prompt": "race", "n": 3}}
    workers = 10
    start = threading.Barrier(workers)

    def fire(_: int) -> httpx.Response:
        start.wait(timeout=10)
        return _post(client, "k-race", body)

    with ThreadPoolExecutor(workers) as pool:
        responses = list(pool.map(fire, range(workers)))

    created = [
        r for r in responses if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    assert len(created) == 1, [(r.status_code, r.text) for r in responses]
    prediction_id = created[0].json()["id"]
    for response in responses:
        if response is created[0]:
            continue
        if response.status_code == 409:
            problem = assert_problem(response, 409)
            assert problem["title"] == "Conflict"
            assert response.headers["retry-after"] == "1"
        else:
            assert response.status_code == 201, response.text
            assert response.headers["idempotent-replayed"] == "true"
            assert response.json()["id"] == prediction_id
    assert _ids(client) == [prediction_id]
    done = wait_status(client, prediction_id)
    assert done["status"] == "succeeded"
    assert done["output"] == ["race-0", "race-1", "race-2"]


def test_a_create_holding_the_key_makes_others_409(
    stack: Stack, admin: Admin, database_url: str
) -> None:
    """Deterministic: hold the key's advisory lock as an in-flight create would."""
    token = admin.create_account(f"acct-{uuid.uuid4().hex[:10]}")
    with psycopg.connect(database_url) as db:
        row = db.execute(
            "SELECT account_id FROM api_tokens WHERE token_sha256 = %s", (token_sha256(token),)
        ).fetchone()
        assert row is not None
        lock_id = Idempotency(row[0], "k-held", "").lock_id
    headers = {"Authorization": f"Bearer {token}"}
    body = {"input": {"prompt": "held"}}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as client:
        with psycopg.connect(database_url) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (lock_id,))
            blocked = _post(client, "k-held", body)
            problem = assert_problem(blocked, 409)
            assert _field(problem) == "Idempotency-Key"
            assert blocked.headers["retry-after"] == "1"
            assert _ids(client) == []
            holder.rollback()
        retried = _post(client, "k-held", body)
        assert retried.status_code == 201, retried.text
        assert "idempotent-replayed" not in retried.headers
        assert wait_status(client, retried.json()["id"])["status"] == "succeeded"
