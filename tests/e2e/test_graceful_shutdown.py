"""SIGTERM: a director stops reading, finishes what it runs, and exits cleanly."""

from __future__ import annotations

import uuid

import httpx

from tests.conftest import ECHO
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
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
        running = create(client, path, input={"prompt": "r", "n": 10, "delay": 0.1})
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
