"""Cancels (queued and running), prediction timeouts, and a director killed between runs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from director.queue import GROUP
from tests.conftest import ECHO
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for
from tracker.keys import Target


def _deployment(admin: Admin, prefix: str, prediction_timeout: float = 1800.0) -> str:
    name = f"test/{prefix}-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(
        name, ECHO, shards=2, prediction_timeout=prediction_timeout, visibility="public"
    )
    return name


def _queued_entries(redis_url: str, deployment: str) -> int:
    with redis.Redis.from_url(redis_url) as r:
        return sum(r.xlen(stream) for stream in Target("dp", deployment, 2).all_streams())


@pytest.fixture
def single_slot(launcher: Launcher, admin: Admin) -> Iterator[tuple[str, str]]:
    """A deployment with its own one-slot runner and a one-worker director."""
    runner, runner_url = launcher.runner("echo", concurrency=1)
    name = _deployment(admin, "single")
    director = launcher.director(name, runner_url, concurrency=1, cancel_grace="30")
    yield name, runner_url
    director.stop()
    runner.stop()


def test_cancel_queued_and_running(
    client: httpx.Client, single_slot: tuple[str, str], redis_url: str
) -> None:
    name, runner_url = single_slot
    path = f"/v1/deployments/{name}/predictions"
    running = create(client, path, input={"prompt": "r", "n": 100, "delay": 0.1})
    wait_for(lambda: len(fetch(client, running["id"])["output"] or []) >= 2, "some output")
    queued = create(client, path, input={"prompt": "q"})

    canceled = client.post(f"/v1/predictions/{queued['id']}/cancel")
    assert canceled.status_code == 200
    assert canceled.json()["status"] == "canceled"  # never claimed: canceled on the spot

    started = time.monotonic()
    response = client.post(f"/v1/predictions/{running['id']}/cancel")
    assert response.status_code == 200
    done = wait_status(client, running["id"], timeout=20)
    # The director's own fallback waits cancel_grace=30s, so a quick "canceled" came from the
    # runner acknowledging the forwarded cancel.
    assert done["status"] == "canceled"
    assert time.monotonic() - started < 10
    assert 0 < len(done["output"]) < 100

    # The queued entry is consumed (acked and deleted) without the runner ever starting it.
    wait_for(lambda: _queued_entries(redis_url, name) == 0, "queue drained")
    after = fetch(client, queued["id"])
    assert after["status"] == "canceled"
    assert after["started_at"] is None and after["output"] is None and after["logs"] == ""
    # The runner is free again and still serves new work.
    follow_up = create(client, path, input={"prompt": "after"})
    assert wait_status(client, follow_up["id"])["output"] == ["after-0"]


def test_cancel_of_finished_prediction_keeps_its_state(client: httpx.Client) -> None:
    created = create(client, f"/v1/deployments/{ECHO}/predictions", input={"prompt": "x"})
    wait_status(client, created["id"])
    response = client.post(f"/v1/predictions/{created['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"


def test_prediction_timeout_fails_with_clear_error(
    client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    runner, runner_url = launcher.runner("echo", concurrency=1)
    name = _deployment(admin, "timeout", prediction_timeout=1.0)
    director = launcher.director(name, runner_url, concurrency=1, cancel_grace="2")
    try:
        created = create(
            client, f"/v1/deployments/{name}/predictions", input={"n": 50, "delay": 0.2}
        )
        done = wait_status(client, created["id"], timeout=20)
        assert done["status"] == "failed"
        assert done["error"] == "Prediction timed out after 1 seconds"
        assert len(done["output"] or []) < 50
    finally:
        director.stop()
        runner.stop()


def test_killed_director_loses_nothing_queued(
    client: httpx.Client, launcher: Launcher, admin: Admin, redis_url: str
) -> None:
    runner, runner_url = launcher.runner("echo", concurrency=2)
    name = _deployment(admin, "kill")
    path = f"/v1/deployments/{name}/predictions"
    director = launcher.director(name, runner_url, concurrency=2)
    first = create(client, path, input={"prompt": "first"})
    assert wait_status(client, first["id"])["status"] == "succeeded"

    in_flight = create(client, path, input={"prompt": "slow", "n": 200, "delay": 0.05})
    wait_status(client, in_flight["id"], {"processing"})
    director.kill()
    queued = [create(client, path, input={"prompt": f"q{i}", "n": 2})["id"] for i in range(6)]

    restarted = launcher.director(name, runner_url, concurrency=2)
    try:
        for prediction_id in queued:
            done = wait_status(client, prediction_id, timeout=30)
            assert done["status"] == "succeeded", done
            assert done["output"] == [
                f"{done['input']['prompt']}-0",
                f"{done['input']['prompt']}-1",
            ]
        # The one that was running when its director died ends in a terminal state, not lost.
        interrupted = wait_status(client, in_flight["id"], timeout=30)
        assert interrupted["status"] in {"failed", "succeeded"}
        if interrupted["status"] == "failed":
            assert "interrupted" in interrupted["error"]
        wait_for(lambda: _queued_entries(redis_url, name) == 0, "every entry acked")
        with redis.Redis.from_url(redis_url) as r:
            for stream in Target("dp", name, 2).all_streams():
                assert r.xpending(stream, GROUP)["pending"] == 0
    finally:
        restarted.stop()
        runner.stop()
