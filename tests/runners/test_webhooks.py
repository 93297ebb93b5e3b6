"""Webhooks from the runner: ordered per prediction, filtered, throttled, terminal retried."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from conftest import StartRunner, WebhookReceiver

ASYNC = {"Prefer": "respond-async"}


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any, headers: dict[str, str]
) -> tuple[int, Any]:
    async with http.request(method, url, json=body, headers=headers) as response:
        return response.status, await response.json()


async def test_async_prediction_sends_webhooks_in_order(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner(webhook_auth_token="s3cret")
    request = {
        "id": "a1",
        "input": {"prompt": "x", "n": 4, "delay": 0.05},
        "webhook": receiver.url("a1"),
    }
    status, body = await call(http, "POST", f"{runner.url}/predictions", request, ASYNC)
    assert (status, body) == (202, {"id": "a1", "status": "starting"})

    deliveries = await receiver.until_terminal("a1")
    bodies = [d.body for d in deliveries]
    assert bodies[0] == {"id": "a1", "status": "processing", "logs": "", "metrics": {}}
    outputs = [len(b.get("output", [])) for b in bodies]
    assert outputs == sorted(outputs), f"webhooks out of order: {outputs}"
    assert all(b["status"] == "processing" for b in bodies[:-1])
    assert len(bodies) >= 3, "intermediate output webhooks were expected"
    assert bodies[-1] == {
        "id": "a1",
        "status": "succeeded",
        "output": ["x-0", "x-1", "x-2", "x-3"],
        "logs": "echo x-0\necho x-1\necho x-2\necho x-3\n",
        # coglet's predict_time, plus the slot wait and GPU time (0 on CPU) Conduit bills by
        "metrics": {
            "predict_time": bodies[-1]["metrics"]["predict_time"],
            "queue_wait_time": bodies[-1]["metrics"]["queue_wait_time"],
            "gpu_time": 0.0,
        },
    }
    headers = deliveries[-1].headers
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"].startswith("coglet/")


async def test_slow_receiver_gets_webhooks_in_order_without_holding_the_slot(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner()
    receiver.gates["o1"] = gate = asyncio.Event()  # the receiver sits on the first webhook
    request = {"input": {"n": 3}, "webhook": receiver.url("o1")}
    status, body = await call(http, "PUT", f"{runner.url}/predictions/o1", request, {})
    assert (status, body["status"]) == (200, "succeeded")
    status, body = await call(http, "GET", f"{runner.url}/health-check", None, {})
    assert body["status"] == "READY"

    gate.set()
    deliveries = await receiver.until_terminal("o1")
    # Outputs queued behind the held start were superseded by the terminal snapshot.
    assert [d.body["status"] for d in deliveries] == ["processing", "succeeded"]
    assert deliveries[-1].body["output"] == ["hello-0", "hello-1", "hello-2"]


async def test_webhook_filter_is_honoured(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner()
    request = {
        "input": {"n": 3, "delay": 0.1},
        "webhook": receiver.url("f1"),
        "webhook_events_filter": ["start", "completed"],
    }
    status, _ = await call(http, "PUT", f"{runner.url}/predictions/f1", request, ASYNC)
    assert status == 202
    deliveries = await receiver.until_terminal("f1")
    assert [d.body["status"] for d in deliveries] == ["processing", "succeeded"]
    # One ordered sender per prediction: nothing can follow the terminal webhook.
    assert receiver.pending("f1") == 0


async def test_logs_webhooks_are_throttled(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner(throttle_interval=3600.0)
    request = {
        "input": {"n": 5, "delay": 0.05},
        "webhook": receiver.url("t1"),
        "webhook_events_filter": ["logs", "completed"],
    }
    await call(http, "PUT", f"{runner.url}/predictions/t1", request, ASYNC)
    deliveries = await receiver.until_terminal("t1")
    assert [d.body["logs"].count("\n") for d in deliveries] == [1, 5]


async def test_terminal_webhook_is_retried(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner = await start_runner()
    receiver.refuse_terminal = 2
    request = {"input": {}, "webhook": receiver.url("r1"), "webhook_events_filter": ["completed"]}
    await call(http, "PUT", f"{runner.url}/predictions/r1", request, ASYNC)
    (delivery,) = await receiver.until_terminal("r1")
    assert delivery.body["status"] == "succeeded"
    assert receiver.terminal_attempts["r1"] == 3
