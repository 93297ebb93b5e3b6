"""A client that leaves ``/run`` while its run is on the runner: the call is cancelled, the
permit given back, and the run recorded as canceled (the shell watches the client only once a
call has lasted a moment, so this is the path that must still notice)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import Stack
from tests.e2e.test_run_lane import Deployment, _entry, _lane, _members, _registered
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def slow_deployment(launcher: Launcher, admin: Admin) -> Iterator[Deployment]:
    """A public echo deployment on a runner of its own (registered by the test)."""
    proc, url = launcher.runner("echo", concurrency=8)
    name = f"leave-{uuid.uuid4().hex[:8]}/echo"
    version = admin.create_model(name, url)
    admin.create_deployment(name, name, visibility="public")
    yield Deployment(name, version, url)
    proc.stop()


def test_a_client_that_leaves_a_running_run_frees_its_permit_and_the_run_is_canceled(
    stack: Stack, redis_url: str, slow_deployment: Deployment, client: httpx.Client
) -> None:
    name = slow_deployment.name
    entry = _entry(
        "r-gone", slow_deployment.runner_url, name, slow_deployment.version, _members(redis_url)
    )
    path = f"/v1/deployments/{name}/run"
    with _registered(redis_url, entry), ThreadPoolExecutor(1) as pool:
        wait_for(lambda: _lane(stack.api_url, name)["permits"] == 1, "one permit")
        leaving = pool.submit(
            client.post,
            path,
            json={"input": {"prompt": "gone", "delay": 30}},
            timeout=httpx.Timeout(30, read=1),
        )
        wait_for(lambda: _lane(stack.api_url, name)["used"] == 1, "the run on its runner")
        with pytest.raises(httpx.ReadTimeout):
            leaving.result()
        wait_for(lambda: _lane(stack.api_url, name)["used"] == 0, "its permit given back")
        after = client.post(path, json={"input": {"prompt": "next"}})
    assert after.status_code == 200, after.text

    def listed() -> dict[str, str] | None:
        runs = client.get("/v1/predictions").json()["results"]
        status = {str(p["input"]["prompt"]): p["status"] for p in runs if p["source"] == "sync"}
        return status if {"gone", "next"} <= set(status) else None

    status = wait_for(listed, "both runs recorded")
    assert (status["gone"], status["next"]) == ("canceled", "succeeded")
