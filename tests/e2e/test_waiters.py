"""Many ``Prefer: wait`` clients on one api: no Redis connection each, a cap that degrades to
``starting``, and a shutdown that answers waiters instead of cutting them."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from collections import Counter

import httpx
import pytest
import redis

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import apace, wait_for

POOL = 8
WAITERS = 300


def _api_connections(client: redis.Redis, ignore: set[str]) -> set[str]:
    """Addresses of the api processes' Redis connections (they are named ``conduit-api*``)."""
    return {
        c["addr"]
        for c in client.client_list()
        if c.get("name", "").startswith("conduit-api") and c["addr"] not in ignore
    }


def _deployment(launcher: Launcher, admin: Admin, concurrency: int) -> str:
    # the model conduit/echo comes with the session's stack
    _, runner_url = launcher.runner("echo", concurrency=concurrency)
    name = f"test/wait-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    launcher.director(name, runner_url, concurrency=concurrency)
    return f"/v1/deployments/{name}/predictions"


async def test_waiters_share_one_reader_and_none_is_refused(
    stack: Stack, launcher: Launcher, admin: Admin, token: str, redis_url: str
) -> None:
    path = _deployment(launcher, admin, concurrency=64)
    watcher = redis.Redis.from_url(redis_url, decode_responses=True)
    before = _api_connections(watcher, set())
    _, api_url = launcher.api(env={"CONDUIT_API_REDIS_POOL_SIZE": str(POOL)})
    pending = WAITERS
    most: list[tuple[int, int]] = []  # (api connections, requests still waiting) per sample

    async def one(http: httpx.AsyncClient, i: int) -> httpx.Response:
        nonlocal pending
        try:
            body = {"input": {"prompt": f"p{i}", "n": 1, "delay": 1}}
            return await http.post(path, json=body, headers={"Prefer": "wait=30"})
        finally:
            pending -= 1

    async def sample() -> None:
        while pending:
            connections = await asyncio.to_thread(_api_connections, watcher, before)
            most.append((len(connections), pending))
            await apace(0.05)  # a sampling rate, not a synchronisation

    limits = httpx.Limits(max_connections=WAITERS + 10)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=api_url, headers=headers, limits=limits, timeout=60
    ) as http:
        sampler = asyncio.create_task(sample())
        responses = await asyncio.gather(*(one(http, i) for i in range(WAITERS)))
        await sampler
    watcher.close()

    codes = Counter(r.status_code for r in responses)
    assert codes == {201: WAITERS}, codes
    bodies = [r.json() for r in responses]
    assert len({b["id"] for b in bodies}) == WAITERS
    assert {b["status"] for b in bodies} <= {"succeeded", "starting"}
    assert all(
        b["output"] == [f"p{i}-0"] for i, b in enumerate(bodies) if b["status"] == "succeeded"
    )
    assert any(b["status"] == "succeeded" for b in bodies)
    # While hundreds waited, the api held its command pool plus the one event reader.
    crowded = [connections for connections, waiting in most if waiting >= WAITERS // 2]
    assert crowded, most
    assert max(connections for connections, _ in most) <= POOL + 1, most


def test_past_the_cap_prefer_wait_answers_starting_at_once(
    stack: Stack, launcher: Launcher, admin: Admin, token: str
) -> None:
    path = _deployment(launcher, admin, concurrency=4)
    _, api_url = launcher.api(env={"CONDUIT_API_MAX_WAITERS": "0"})
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=30) as http:
        response = http.post(
            path, json={"input": {"prompt": "c", "n": 1, "delay": 2}}, headers={"Prefer": "wait=30"}
        )
        assert response.status_code == 201
        assert "preference-applied" not in response.headers  # it did not wait
        body = response.json()
        # A wait would have seen it finish; declined, it answers as Replicate's rule says.
        assert body["status"] == "starting"
        assert wait_status(http, body["id"])["output"] == ["c-0"]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_shutdown_answers_waiters_with_starting(
    stack: Stack, launcher: Launcher, admin: Admin, token: str, sig: str
) -> None:
    path = _deployment(launcher, admin, concurrency=2)
    api, api_url = launcher.api()
    headers = {"Authorization": f"Bearer {token}"}
    answers: list[httpx.Response] = []

    def waiter() -> None:
        with httpx.Client(base_url=api_url, headers=headers, timeout=60) as http:
            answers.append(
                http.post(
                    path,
                    json={"input": {"prompt": "t", "n": 1, "delay": 30}},
                    headers={"Prefer": "wait=60"},
                )
            )

    thread = threading.Thread(target=waiter)
    thread.start()
    with httpx.Client(base_url=api_url, headers=headers, timeout=10) as http:
        wait_for(lambda: http.get("/v1/predictions").json()["results"], "the create stored")
    assert api.popen is not None
    api.popen.send_signal(signal.Signals[sig])
    thread.join(timeout=30)
    assert answers, "the waiter got no answer"
    assert answers[0].status_code == 201
    assert answers[0].json()["status"] == "starting"
    wait_for(lambda: not api.alive, "the api exited")
