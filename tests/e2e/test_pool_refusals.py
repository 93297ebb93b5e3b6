"""A model pool host that can never hold a model (``422 model_too_large``) fails what is asked
of it on both paths alike, and neither blames the client's input: a queued prediction fails
with the pool's reason, and a ``/run`` is the runner failing (502 ``runner_failed``), not a
finished run whose input was refused."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.pool_host import MIB, answers
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for
from tracker.fleet import FleetEntry, FleetRegistry, RunnerState

pytestmark = pytest.mark.e2e


@pytest.fixture
def huge_slot(launcher: Launcher, tmp_path: Path) -> Iterator[str]:
    """A pool whose one model declares twice its budget: its slot's URL."""
    models = [{"name": "huge", "backend": {"conduit": "echo"}, "size": 200 * MIB}]
    path = tmp_path / "pool.yaml"
    path.write_text(json.dumps({"budget": "100MiB", "min_resident": 0, "models": models}))
    port = free_port()
    proc = launcher.spawn("pool", "runner", "pool", "--config", str(path), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(proc, url), "pool answering")
    yield f"{url}/models/huge"
    proc.stop()


def _deployment(admin: Admin, slot_url: str) -> tuple[str, str]:
    """A public deployment of a model on ``slot_url``: its name and version."""
    name = f"test/too-large-{uuid.uuid4().hex[:8]}"
    version = admin.create_model(name, slot_url)
    admin.create_deployment(name, name, visibility="public")
    return name, version


def test_a_queued_prediction_fails_with_the_pools_reason_not_as_invalid_input(
    launcher: Launcher, admin: Admin, client: httpx.Client, huge_slot: str
) -> None:
    name, _ = _deployment(admin, huge_slot)
    director = launcher.director(name, huge_slot, concurrency=1)
    try:
        created = create(client, f"/v1/deployments/{name}/predictions", input={"prompt": "x"})
        done = wait_status(client, str(created["id"]), timeout=60)
    finally:
        director.stop()
    assert done["status"] == "failed", done
    assert "model_too_large" in str(done["error"]), done
    assert "cannot run this model" in str(done["error"])
    assert "Invalid input" not in str(done["error"])


def _register(redis_url: str, entry: FleetEntry, register: bool) -> None:
    async def write() -> None:
        redis = Redis.from_url(redis_url)
        registry = FleetRegistry(redis, ttl=300)
        try:
            if register:
                await registry.register(entry)
            else:
                await registry.deregister(entry.id)
        finally:
            await redis.aclose()

    asyncio.run(write())


def test_a_run_is_the_runner_failing_not_a_refused_input(
    admin: Admin, client: httpx.Client, redis_url: str, huge_slot: str
) -> None:
    name, version = _deployment(admin, huge_slot)
    entry = FleetEntry(
        id=f"r-{uuid.uuid4().hex[:8]}",
        url=huge_slot,
        deployment=name,
        version_id=version,
        concurrency=1,
        state=RunnerState.READY,
        hardware="cpu",
        heartbeat_at=time.time(),
        director="test",
        kind="conduit-pool",
    )
    _register(redis_url, entry, True)
    try:

        def answered() -> httpx.Response | None:
            response = client.post(f"/v1/deployments/{name}/run", json={"input": {"prompt": "x"}})
            if response.status_code == 429:  # the lane has not seen the runner yet
                return None
            return response

        response = wait_for(answered, "the lane calling the pool")
    finally:
        _register(redis_url, entry, False)
    problem = assert_problem(response, 502)
    assert problem["code"] == "runner_failed"
    assert "model_too_large" in problem["detail"], problem
