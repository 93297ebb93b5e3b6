"""The runner API spec's documents in the states a healthy runner does not show: starting,
stopping, a load under way, and a load that failed.

The runners here serve :class:`ControlModel` on loopback, whose loads can be held at a gate
and made to fail, so each state lasts until the test ends it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from tests.fixtures.waiting import until
from tests.runners.control_model import ControlModel
from tests.runners.lifecycle_calls import Mint, configure, wait_task
from tests.runners.spec_examples import check, conforms

if TYPE_CHECKING:
    from conftest import Runner, StartRunner

DEADLINE = 10.0
UNAVAILABLE = {"type": "about:blank", "title": "...", "status": 503, "detail": "...", "code": "..."}


@pytest.fixture
def op_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mint:
    return configure(tmp_path, monkeypatch, "control")


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any, Mapping[str, str]]:
    async with http.get(url) as response:
        return response.status, await response.json(content_type=None), response.headers


async def refused_while(http: aiohttp.ClientSession, runner: Runner, code: str) -> dict[str, Any]:
    """Capabilities is a 503 problem naming ``code``; returns the health document (a 503)."""
    status, body, headers = await get(http, f"{runner.url}/v1/capabilities")
    assert (status, body["code"], body["status"]) == (503, code, 503)
    assert conforms(body, UNAVAILABLE) == []
    assert headers["Content-Type"].startswith("application/problem+json")
    assert int(headers["Retry-After"]) >= 1
    status, health, headers = await get(http, f"{runner.url}/health")
    assert status == 503 and headers["Content-Type"].startswith("application/json")
    assert check("health", health) == [] and health["status"] == "unhealthy"
    assert code in health["reasons"]
    return dict(health)


async def test_starting(start_runner: StartRunner, http: aiohttp.ClientSession) -> None:
    model = ControlModel()
    model.gate = asyncio.Event()
    runner = await start_runner(model=model, wait_ready=False)
    health = await refused_while(http, runner, "starting")
    assert (health["modelsLoaded"], health["queueDepth"]) == (0, 0)
    model.gate.set()
    assert await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
    assert (await get(http, f"{runner.url}/v1/capabilities"))[0] == 200


async def test_stopping(start_runner: StartRunner, http: aiohttp.ClientSession) -> None:
    runner = await start_runner(model=ControlModel())
    await runner.service.stop()  # what shutdown runs first, while the app still answers
    await refused_while(http, runner, "stopping")


async def test_a_load_under_way_and_its_failure(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Mint
) -> None:
    model = ControlModel()
    runner = await start_runner(model=model, capabilities_ttl=0.0)
    model.gate, model.fail_next_load = asyncio.Event(), True
    load = {
        "modelId": "control",
        "evictModel": "control",
        "verifiedOpToken": op_tokens("model-load"),
    }
    async with http.post(f"{runner.url}/v1/models/load", json=load) as response:
        assert response.status == 202
        task = await response.json()
    assert check("load_accepted", task) == [] and isinstance(task["eta"], int)

    async def loading() -> dict[str, Any] | None:
        status, body, _ = await get(http, f"{runner.url}/v1/capabilities")
        return dict(body) if status == 200 and body["models"]["loading"] else None

    capabilities = await until(loading, "a load in progress", DEADLINE, interval=0.02)
    assert check("capabilities", capabilities) == []
    (entry,) = capabilities["models"]["loading"]
    assert (entry["id"], entry["progress"]) == ("control", 0.5)  # held at the gate
    assert isinstance(entry["eta"], int)  # from the setup's measured load time
    assert capabilities["models"]["loaded"] == []  # evicted first
    status, running, _ = await get(http, f"{runner.url}/v1/models/load/{task['taskId']}")
    assert status == 200 and check("load_accepted", running) == []
    assert (running["status"], running["progress"]) == ("loading", 0.5)

    model.gate.set()
    failed = await wait_task(http, runner.url, task["taskId"])
    assert check("load_failed", failed) == [] and failed["status"] == "failed"
    assert (failed["modelId"], failed["error"]) == ("control", "weights are corrupt")
    status, health, _ = await get(http, f"{runner.url}/health")
    assert status == 503 and check("health", health) == []
    assert (health["modelsLoaded"], health["reasons"]) == (0, ["model failed"])
