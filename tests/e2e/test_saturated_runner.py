"""A saturated runner (one slot, a queue of one) behind a director that offers it more than it
can hold: every prediction completes, none fails; the runner's refusals prove it was full."""

from __future__ import annotations

import re
import uuid

import httpx

from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import RUNNER_AUTH, Launcher

PREDICTIONS = 10


def _refusals(runner_url: str) -> float:
    text = httpx.get(f"{runner_url}/metrics", headers=RUNNER_AUTH).text
    found = re.findall(
        r'^conduit_runner_requests_total\{[^}]*status="queue_full"[^}]*\} (\S+)$', text, re.M
    )
    return sum(float(value) for value in found)


def test_saturated_runner_completes_every_prediction(
    client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    _, runner_url = launcher.runner("echo", concurrency=1, env={"MAX_QUEUE_DEPTH": "1"})
    name = f"test/saturated-{uuid.uuid4().hex[:6]}"
    admin.create_model(name, runner_url)
    admin.create_deployment(name, name, shards=2, visibility="public")
    launcher.director(name, runner_url, concurrency=6)

    ids = [
        create(client, f"/v1/deployments/{name}/predictions", input={"n": 1, "delay": 0.1})["id"]
        for _ in range(PREDICTIONS)
    ]
    done = [wait_status(client, prediction_id, timeout=60) for prediction_id in ids]

    assert [p["status"] for p in done] == ["succeeded"] * PREDICTIONS
    assert all(p["output"] == ["hello-0"] for p in done)
    assert _refusals(runner_url) > 0, "the runner was never full: the test proved nothing"
    capabilities = httpx.get(f"{runner_url}/v1/capabilities", headers=RUNNER_AUTH).json()
    assert capabilities["queue"]["maxDepth"] == 1
