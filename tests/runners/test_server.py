"""The runner over real HTTP: what a director sees from coglet 0.23.1, and what it must not."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from conftest import StartRunner, WebhookReceiver

ASYNC = {"Prefer": "respond-async"}
DEADLINE = 10.0


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.request(method, url, json=body, headers=headers) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def health(http: aiohttp.ClientSession, url: str) -> str:
    status, body = await call(http, "GET", f"{url}/health-check")
    assert status == 200
    return str(body["status"])


async def test_discovery_and_health_ready(start_runner: StartRunner, http: aiohttp.ClientSession):
    runner = await start_runner()
    status, body = await call(http, "GET", f"{runner.url}/")
    assert status == 200
    assert body["predictions_url"] == "/predictions"
    assert body["predictions_idempotent_url"] == "/predictions/{prediction_id}"
    assert body["predictions_cancel_url"] == "/predictions/{prediction_id}/cancel"
    assert body["healthcheck_url"] == "/health-check"
    assert body["cog_version"].startswith("0.23.1")

    status, body = await call(http, "GET", f"{runner.url}/health-check")
    assert status == 200
    assert body["status"] == "READY"
    assert body["setup"]["status"] == "succeeded"
    assert body["setup"]["started_at"] and body["setup"]["completed_at"]


async def test_openapi_describes_input_and_iterator_output(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner()
    status, doc = await call(http, "GET", f"{runner.url}/openapi.json")
    assert status == 200
    schemas = doc["components"]["schemas"]
    props = schemas["Input"]["properties"]
    assert list(props) == ["prompt", "n", "delay", "fail"]
    assert props["prompt"] == {
        "x-order": 0,
        "title": "Prompt",
        "type": "string",
        "default": "hello",
        "description": "Text to echo",
    }
    assert props["n"]["type"] == "integer" and props["n"]["minimum"] == 1
    assert props["n"]["default"] == 1
    assert props["delay"]["type"] == "number" and props["delay"]["minimum"] == 0
    assert props["fail"]["type"] == "boolean" and props["fail"]["default"] is False
    assert "required" not in schemas["Input"]
    assert schemas["Output"] == {
        "title": "Output",
        "type": "array",
        "items": {"type": "string"},
        "x-cog-array-type": "iterator",
        "x-cog-array-display": "concatenate",
    }
    assert {"PredictionRequest", "PredictionResponse", "Status"} <= set(schemas)
    assert {"/", "/health-check", "/predictions", "/predictions/{prediction_id}/cancel"} <= set(
        doc["paths"]
    )


async def test_sync_prediction_returns_output_list_and_logs(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner()
    status, body = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": "hi", "n": 3}}
    )
    assert status == 200
    assert body["status"] == "succeeded"
    assert body["output"] == ["hi-0", "hi-1", "hi-2"]
    assert body["logs"] == "echo hi-0\necho hi-1\necho hi-2\n"
    assert body["metrics"]["predict_time"] >= 0
    assert body["id"].startswith("pred_")
    assert "input" not in body and "error" not in body
    assert await health(http, runner.url) == "READY"  # the slot is free once answered


async def test_defaults_apply_and_unknown_inputs_are_dropped(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner()
    status, body = await call(
        http, "POST", f"{runner.url}/predictions", {"id": "d1", "input": {"bogus": 1}}
    )
    assert (status, body["id"], body["output"]) == (200, "d1", ["hello-0"])


async def test_busy_at_capacity_then_ready(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    """With no queue (MAX_QUEUE_DEPTH=0) the runner behaves exactly as coglet: 409 when full."""
    runner = await start_runner(concurrency=2, max_queue_depth=0)
    for key in ("b1", "b2"):
        request = {"input": {"delay": 60}, "webhook": receiver.url(key)}
        status, _ = await call(http, "PUT", f"{runner.url}/predictions/{key}", request, ASYNC)
        assert status == 202
        assert (await receiver.next(key)).body["status"] == "processing"
        assert await health(http, runner.url) == ("READY" if key == "b1" else "BUSY")

    status, body = await call(http, "POST", f"{runner.url}/predictions", {"input": {}})
    assert status == 409
    assert body == {"error": "At capacity - all prediction slots busy", "status": "failed"}
    status, _ = await call(http, "PUT", f"{runner.url}/predictions/b3", {"input": {}}, ASYNC)
    assert status == 409

    for key in ("b1", "b2"):
        assert (await call(http, "POST", f"{runner.url}/predictions/{key}/cancel"))[0] == 200
        assert (await receiver.until_terminal(key))[-1].body["status"] == "canceled"
    assert await health(http, runner.url) == "READY"


async def test_cancel_in_flight_keeps_partial_output(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner()
    request = {"input": {"prompt": "c", "n": 50, "delay": 0.2}, "webhook": receiver.url("c1")}
    await call(http, "PUT", f"{runner.url}/predictions/c1", request, ASYNC)
    await receiver.until("c1", lambda body: bool(body.get("output")))

    assert await call(http, "POST", f"{runner.url}/predictions/c1/cancel") == (200, {})
    final = (await receiver.until_terminal("c1"))[-1].body
    assert final["status"] == "canceled"
    produced = len(final["output"])
    assert 1 <= produced < 50
    assert final["output"] == [f"c-{i}" for i in range(produced)]
    assert final["logs"].count("\n") == produced
    assert final["metrics"]["predict_time"] > 0

    assert await call(http, "POST", f"{runner.url}/predictions/c1/cancel") == (404, {})
    assert await call(http, "POST", f"{runner.url}/predictions/nope/cancel") == (404, {})


async def test_bad_input_is_422_naming_the_field(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner()
    url = f"{runner.url}/predictions"
    status, body = await call(http, "POST", url, {"input": {"n": "abc"}})
    assert status == 422
    assert body == {
        "detail": [
            {
                "loc": ["body", "input", "n"],
                "msg": '"abc" is not of type "integer"',
                "type": "value_error",
            }
        ]
    }
    status, body = await call(http, "POST", url, {"input": {"n": 0, "delay": -1}})
    assert status == 422
    assert sorted(d["loc"][2] for d in body["detail"]) == ["delay", "n"]
    assert await health(http, runner.url) == "READY"


async def test_malformed_json_is_400(start_runner: StartRunner, http: aiohttp.ClientSession):
    runner = await start_runner()
    async with http.post(f"{runner.url}/predictions", data=b"{nope") as response:
        assert response.status == 400
        assert "Failed to parse the request body as JSON" in await response.text()
    async with http.post(f"{runner.url}/predictions", json={"input": [1]}) as response:
        assert response.status == 422


async def test_model_failure_is_a_failed_prediction(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner = await start_runner()
    status, body = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"n": 2, "fail": True}}
    )
    assert status == 200
    assert body["status"] == "failed"
    assert body["error"] == "echo failed as requested"
    assert body["logs"] == "echo hello-0\necho hello-1\n"
    assert body["output"] == ["hello-0", "hello-1"]
    assert await health(http, runner.url) == "READY"


async def test_idempotent_put_in_flight_returns_snapshot(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner()
    url = f"{runner.url}/predictions/p1"
    request = {
        "id": "p1",
        "input": {"prompt": "p", "delay": 60, "unknown": True},
        "webhook": receiver.url("p1"),
    }
    assert (await call(http, "PUT", url, request, ASYNC))[0] == 202
    await receiver.next("p1")

    status, body = await call(http, "PUT", url, request)  # no Prefer: still 202, no new run
    assert status == 202
    assert body == {
        "id": "p1",
        "status": "processing",
        "input": {"prompt": "p", "n": 1, "delay": 60, "fail": False},
        "logs": "",
        "metrics": {},
    }
    status, body = await call(http, "PUT", url, {"id": "other", "input": {}})
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "id"]

    await call(http, "POST", f"{url}/cancel")
    await receiver.until_terminal("p1")
    # Finished ids are forgotten: the same PUT runs the model again.
    status, body = await call(http, "PUT", url, {"input": {"prompt": "again"}})
    assert (status, body["output"]) == (200, ["again-0"])


async def test_sync_client_disconnect_cancels_prediction(
    start_runner: StartRunner, receiver: WebhookReceiver
):
    runner = await start_runner()
    request = {"id": "s1", "input": {"delay": 60}, "webhook": receiver.url("s1")}
    async with aiohttp.ClientSession() as client:
        call_task = asyncio.create_task(
            call(client, "PUT", f"{runner.url}/predictions/s1", request)
        )
        assert (await receiver.next("s1")).body["status"] == "processing"
        call_task.cancel()
        await asyncio.gather(call_task, return_exceptions=True)
    final = (await asyncio.wait_for(receiver.until_terminal("s1"), DEADLINE))[-1].body
    assert final["status"] == "canceled"
