"""The snapshot stream: a prediction's snapshots down the response of the PUT that started it,
and the fall back to webhooks when that connection goes away."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest

from runners.streaming import wants_stream

if TYPE_CHECKING:
    from conftest import StartRunner, WebhookReceiver

STREAM = {"Prefer": "respond-async", "Accept": "application/x-ndjson, application/json"}
DEADLINE = 10.0


async def read_lines(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    body = await asyncio.wait_for(response.read(), DEADLINE)
    assert body.endswith(b"\n")
    return [orjson.loads(line) for line in body.splitlines()]


async def rest_of(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """What a stream that was taken over still carried (possibly nothing) until it ended."""
    body = await asyncio.wait_for(response.read(), DEADLINE)
    return [orjson.loads(line) for line in body.splitlines()]


async def test_snapshots_come_down_the_response_in_order(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
) -> None:
    runner = await start_runner()
    request = {
        "input": {"prompt": "x", "n": 4, "delay": 0.02},
        "webhook": receiver.url("s1"),
    }
    async with http.put(f"{runner.url}/predictions/s1", json=request, headers=STREAM) as response:
        assert response.status == 200
        assert response.content_type == "application/x-ndjson"
        for header in ("X-Queue-Wait-Ms", "X-GPU-Time-Ms", "X-Processing-Time", "X-Cache-Hit"):
            assert header in response.headers
        lines = await read_lines(response)

    assert lines[0] == {"id": "s1", "status": "processing", "logs": "", "metrics": {}}
    assert all(line["status"] == "processing" for line in lines[:-1])
    outputs = [len(line.get("output", [])) for line in lines]
    assert outputs == sorted(outputs), f"snapshots out of order: {outputs}"
    last = lines[-1]
    assert last["status"] == "succeeded"
    assert last["output"] == ["x-0", "x-1", "x-2", "x-3"]
    assert last["metrics"]["predict_time"] > 0
    # Nothing went the webhook way: no sender was ever started.
    assert not runner.service.webhooks._tasks
    assert receiver.arrivals["s1"] == 0


async def test_a_failing_prediction_ends_the_stream_with_its_error(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner()
    request = {"input": {"prompt": "boom", "fail": True}}
    async with http.put(f"{runner.url}/predictions/f1", json=request, headers=STREAM) as response:
        assert response.status == 200
        lines = await read_lines(response)
    assert lines[-1]["status"] == "failed"
    assert lines[-1]["error"]


async def test_refusals_are_answered_as_without_the_stream(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner()
    request = {"input": {"n": "many"}}
    async with http.put(f"{runner.url}/predictions/r1", json=request, headers=STREAM) as response:
        assert response.status == 422
        assert response.content_type == "application/json"
        body = await response.json()
    assert body["detail"][0]["loc"] == ["body", "input", "n"]


async def test_a_known_id_is_followed_not_run_twice(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    """A repeated streaming PUT (a retry whose first answer was lost) follows the run under
    way; a repeated plain PUT gets Cog's answer, the snapshot so far."""
    runner = await start_runner()
    request = {"input": {"prompt": "x", "n": 3, "delay": 0.2}}
    url = f"{runner.url}/predictions/k1"
    async with http.put(url, json=request, headers=STREAM) as first:
        assert first.status == 200
        await asyncio.wait_for(first.content.readline(), DEADLINE)  # it is running
        async with http.put(url, json=request, headers={"Prefer": "respond-async"}) as plain:
            assert plain.status == 202
            assert (await plain.json())["status"] == "processing"
        async with http.put(url, json=request, headers=STREAM) as again:
            assert again.status == 200
            lines = await read_lines(again)
        assert all(line["status"] == "processing" for line in await rest_of(first))
    assert lines[0]["status"] == "processing"
    assert lines[-1]["status"] == "succeeded" and lines[-1]["output"] == ["x-0", "x-1", "x-2"]
    assert runner.service.metrics.requests.labels("echo", "default", "succeeded")._value.get() == 1


async def test_a_stream_cut_off_goes_on_as_webhooks(
    start_runner: StartRunner, receiver: WebhookReceiver
) -> None:
    """The director went away mid-run: the prediction is not canceled (unlike a synchronous
    request), and the rest of it, terminal state included, arrives as webhooks."""
    runner = await start_runner()
    request = {
        "input": {"prompt": "x", "n": 5, "delay": 0.1},
        "webhook": receiver.url("c1"),
    }
    async with aiohttp.ClientSession() as session:
        response = await session.put(f"{runner.url}/predictions/c1", json=request, headers=STREAM)
        assert response.status == 200
        first = orjson.loads(await asyncio.wait_for(response.content.readline(), DEADLINE))
        assert first["status"] == "processing"
        response.close()  # drops the connection mid-stream

    deliveries = await receiver.until_terminal("c1")
    last = deliveries[-1].body
    assert last["status"] == "succeeded"
    assert last["output"] == [f"x-{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),
        ("", False),
        ("application/json", False),
        ("application/x-ndjson", True),
        ("application/json;q=0.5, Application/X-NDJSON;q=1", True),
        ("application/x-ndjson-seq", False),
    ],
)
def test_what_asks_for_the_stream(accept: str | None, expected: bool) -> None:
    assert wants_stream(accept) is expected


ATTACH = {**STREAM, "If-Match": "*"}


async def test_attach_to_nothing_running_starts_nothing(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner()
    request = {"input": {"prompt": "x"}}
    async with http.put(f"{runner.url}/predictions/n1", json=request, headers=ATTACH) as response:
        assert response.status == 412
        assert response.content_type == "application/problem+json"
        assert (await response.json())["code"] == "not-running"
    assert runner.service.get("n1") is None
    assert not runner.service._drivers


async def test_attach_takes_the_run_over_from_its_first_caller(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
) -> None:
    """A second director attaches to a run: its stream starts with the state so far and ends
    with the terminal snapshot; the first caller's stream ends without one, and its webhook
    hears nothing."""
    runner = await start_runner()
    url = f"{runner.url}/predictions/t1"
    request = {"input": {"prompt": "x", "n": 4, "delay": 0.15}, "webhook": receiver.url("old")}
    async with http.put(url, json=request, headers=STREAM) as first:
        assert first.status == 200
        line = await asyncio.wait_for(first.content.readline(), DEADLINE)
        assert orjson.loads(line)["status"] == "processing"
        again = {**request, "webhook": receiver.url("new")}
        async with http.put(url, json=again, headers=ATTACH) as second:
            assert second.status == 200
            taken_over = await read_lines(second)
        rest_of_first = await rest_of(first)

    assert taken_over[0]["status"] == "processing"
    assert taken_over[-1]["status"] == "succeeded"
    assert taken_over[-1]["output"] == [f"x-{i}" for i in range(4)]
    assert all(line["status"] == "processing" for line in rest_of_first)
    assert runner.service.get("t1") is None
    assert runner.service.metrics.requests.labels("echo", "default", "succeeded")._value.get() == 1
    assert receiver.arrivals["old"] == 0 and receiver.arrivals["new"] == 0


async def test_attach_silences_the_webhooks_of_a_stream_that_broke_off(
    start_runner: StartRunner, receiver: WebhookReceiver
) -> None:
    """The first director died: its stream broke off and the run went on by webhook to its
    (dead) receiver; once the next director attaches, everything goes to it instead."""
    runner = await start_runner()
    url = f"{runner.url}/predictions/w1"
    request = {"input": {"prompt": "x", "n": 5, "delay": 0.15}, "webhook": receiver.url("dead")}
    async with aiohttp.ClientSession() as session:
        response = await session.put(url, json=request, headers=STREAM)
        await asyncio.wait_for(response.content.readline(), DEADLINE)
        response.close()
        await receiver.next("dead")  # the next snapshot went by webhook
        async with session.put(url, json=request, headers=ATTACH) as attached:
            assert attached.status == 200
            lines = await read_lines(attached)
    assert lines[-1]["status"] == "succeeded"
    assert lines[-1]["output"] == [f"x-{i}" for i in range(5)]
    # Nothing terminal went to the old receiver: the attach closed its sender.
    assert receiver.terminal_attempts["dead"] == 0
