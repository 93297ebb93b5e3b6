"""SIGTERM: a director stops reading, finishes what it runs, and exits cleanly; an api answers
its waiters at once and exits, well within its shutdown timeout."""

from __future__ import annotations

import signal
import threading
import uuid

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.metrics import value
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for


def test_sigterm_finishes_in_flight_and_leaves_the_rest_queued(
    client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    runner, runner_url = launcher.runner("echo", concurrency=1)
    name = f"test/term-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, shards=2, visibility="public")
    path = f"/v1/deployments/{name}/predictions"
    director = launcher.director(name, runner_url, concurrency=1)
    try:
        # Long enough to be written as processing (the start is written after 1 s).
        running = create(client, path, input={"prompt": "r", "n": 10, "delay": 0.3})
        wait_status(client, running["id"], {"processing"})
        waiting = create(client, path, input={"prompt": "w"})

        assert director.popen is not None
        director.popen.terminate()
        assert director.popen.wait(timeout=20) == 0
        done = fetch(client, running["id"])
        assert done["status"] == "succeeded" and len(done["output"]) == 10
        assert fetch(client, waiting["id"])["status"] == "starting"

        successor = launcher.director(name, runner_url, concurrency=1)
        assert wait_status(client, waiting["id"])["output"] == ["w-0"]
        successor.stop()
        wait_for(lambda: not successor.alive, "successor exit")
    finally:
        runner.stop()


def test_sigterm_answers_a_waiter_and_the_api_exits_cleanly(
    stack: Stack, launcher: Launcher, admin: Admin, token: str
) -> None:
    # No director serves this deployment: without the shutdown the wait would last 60 s.
    name = f"test/term-api-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    api, api_url = launcher.api()
    headers = {"Authorization": f"Bearer {token}"}
    answers: list[httpx.Response] = []

    def waiter() -> None:
        with httpx.Client(base_url=api_url, headers=headers, timeout=90) as http:
            answers.append(
                http.post(
                    f"/v1/deployments/{name}/predictions",
                    json={"input": {"prompt": "s"}},
                    headers={"Prefer": "wait=60"},
                )
            )

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_for(
        lambda: value(httpx.get(f"{api_url}/metrics").text, "conduit_api_waiters"),
        "the waiter held",
    )
    assert api.popen is not None
    api.popen.terminate()
    thread.join(timeout=90)
    assert answers, "the waiter got no answer"
    assert answers[0].status_code == 201
    assert answers[0].json()["status"] == "starting"
    # After its graceful shutdown uvicorn raises the signal it caught again, as the process's
    # supervisor expects of a process stopped by it.
    assert api.popen.wait(timeout=90) == -signal.SIGTERM
