"""A stored prediction is never answered 5xx: Redis or Postgres failing during a
``Prefer: wait`` still gets the client 201 with its prediction, so no retry runs it twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from tests.faults.conftest import DrillServers, register_faulty
from tests.faults.harness import Drill
from tests.fixtures.waiting import wait_for


def _wait_through(drill: Drill, fault: Callable[[], None], wait: int) -> tuple[httpx.Response, str]:
    """A ``Prefer: wait`` create of a slow prediction, ``fault`` struck once it is stored;
    returns the answer and the stored prediction's id."""
    runner, runner_url = drill.launcher.runner("faulty", 2)
    register_faulty(drill, runner_url)
    name = drill.deployment("stored")
    drill.director(name, runner_url, concurrency=2)
    token = drill.accounts(1)[0]
    headers = {"Authorization": f"Bearer {token}"}
    answers: list[tuple[float, httpx.Response]] = []

    def waiter() -> None:
        response = httpx.post(
            f"{drill.api_url}/v1/deployments/{name}/predictions",
            json={"input": {"n": 1, "delay": 60}},
            headers={**headers, "Prefer": f"wait={wait}"},
            timeout=wait + 30,
        )
        answers.append((time.monotonic(), response))

    thread = threading.Thread(target=waiter)
    thread.start()
    with httpx.Client(base_url=drill.api_url, headers=headers, timeout=10) as client:
        stored = wait_for(lambda: client.get("/v1/predictions").json()["results"], "the create")
    fault()
    struck = time.monotonic()
    thread.join(timeout=wait + 40)
    assert answers, "no answer"
    answered, response = answers[0]
    assert answered > struck, "the fault came after the answer: it tested nothing"
    return response, stored[0]["id"]


def test_redis_killed_during_a_wait_still_answers_201(drill: Drill, servers: DrillServers) -> None:
    response, stored = _wait_through(drill, servers.redis.kill, wait=8)
    try:
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["id"] == stored
        assert body["status"] == "starting"
        assert response.headers["location"] == body["urls"]["get"]
    finally:
        servers.redis.start()


def test_postgres_stopped_during_a_wait_still_answers_201(
    drill: Drill, servers: DrillServers
) -> None:
    response, stored = _wait_through(drill, servers.postgres.stop, wait=8)
    try:
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["id"] == stored
        assert body["status"] == "starting"
    finally:
        servers.postgres.start()
