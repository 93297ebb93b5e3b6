"""Setup states, single-value models and shutdown of a runner app."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp

from runners.model import Model, PredictContext
from runners.models.echo import EchoModel
from runners.schema import InputField

if TYPE_CHECKING:
    from conftest import StartRunner, WebhookReceiver

DEADLINE = 10.0
NOT_READY = {
    "error": "Setup has not finished yet. Wait until it has finished, "
    "or GET /health-check for status.",
    "status": "failed",
}


class GatedSetupEcho(EchoModel):
    """Echo whose setup waits for the test, then succeeds or raises."""

    def __init__(self, fail: bool = False) -> None:
        self.gate = asyncio.Event()
        self.fail = fail

    async def setup(self) -> None:
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("boom in setup")


class Upper(Model):
    """A single-value model: returns one string instead of yielding."""

    name: ClassVar[str] = "upper"
    inputs: ClassVar[tuple[InputField, ...]] = (InputField("text", "string"),)
    output: ClassVar[dict[str, Any]] = {"type": "string"}

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> str:
        ctx.log("uppercasing")
        return str(inputs["text"]).upper()


class Opaque(Model):
    """Returns something that cannot be sent as JSON."""

    name: ClassVar[str] = "opaque"

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> object:
        return object()


async def get_json(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with http.request(method, url, json=body) as response:
        return response.status, await response.json()


async def test_not_ready_until_setup_succeeds(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    model = GatedSetupEcho()
    runner = await start_runner(model=model, wait_ready=False)
    status, body = await get_json(http, "GET", f"{runner.url}/health-check")
    assert (status, body["status"], body["setup"]["status"]) == (200, "STARTING", "starting")
    assert await get_json(http, "POST", f"{runner.url}/predictions", {}) == (503, NOT_READY)

    model.gate.set()
    assert await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
    _, body = await get_json(http, "GET", f"{runner.url}/health-check")
    assert body["status"] == "READY"
    status, body = await get_json(http, "POST", f"{runner.url}/predictions", {})
    assert (status, body["output"]) == (200, ["hello-0"])


async def test_setup_failure_is_reported_and_refuses_work(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    model = GatedSetupEcho(fail=True)
    model.gate.set()
    runner = await start_runner(model=model, wait_ready=False)
    assert not await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
    status, body = await get_json(http, "GET", f"{runner.url}/health-check")
    assert (status, body["status"], body["setup"]["status"]) == (200, "SETUP_FAILED", "failed")
    assert "boom in setup" in body["setup"]["logs"]
    assert await get_json(http, "POST", f"{runner.url}/predictions", {}) == (503, NOT_READY)


async def test_single_value_model(start_runner: StartRunner, http: aiohttp.ClientSession):
    runner = await start_runner(model=Upper())
    status, body = await get_json(
        http, "POST", f"{runner.url}/predictions", {"input": {"text": "abc"}}
    )
    assert (status, body["status"], body["output"]) == (200, "succeeded", "ABC")
    assert body["logs"] == "uppercasing\n"

    status, body = await get_json(http, "POST", f"{runner.url}/predictions", {"input": {}})
    assert status == 422
    assert body["detail"] == [
        {"loc": ["body", "input", "text"], "msg": "Field required", "type": "value_error.missing"}
    ]


async def test_shutdown_endpoint_requests_stop(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner()
    assert not runner.service.shutdown_requested.is_set()
    assert await get_json(http, "POST", f"{runner.url}/shutdown") == (200, {})
    assert runner.service.shutdown_requested.is_set()


async def test_stop_cancels_predictions_past_the_grace_period(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner(shutdown_grace=0.2)
    request = {"input": {"delay": 60}, "webhook": receiver.url("g1")}
    async with http.put(
        f"{runner.url}/predictions/g1", json=request, headers={"Prefer": "respond-async"}
    ) as response:
        assert response.status == 202
    await receiver.next("g1")
    await asyncio.wait_for(runner.service.stop(), DEADLINE)
    final = (await receiver.until_terminal("g1"))[-1].body
    assert final["status"] == "canceled"


async def test_unserialisable_output_fails_the_prediction(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner(model=Opaque())
    status, body = await get_json(
        http, "POST", f"{runner.url}/predictions", {"webhook": "ftp://nowhere/"}
    )
    assert (status, body["status"]) == (200, "failed")
    assert "not JSON serializable" in body["error"]
