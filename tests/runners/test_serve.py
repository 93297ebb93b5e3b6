"""``python -m runners`` as a real process: graceful stop on SIGTERM and on ``/shutdown``."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import pytest

if TYPE_CHECKING:
    from conftest import WebhookReceiver

DEADLINE = 15.0
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


@dataclass
class Process:
    proc: asyncio.subprocess.Process
    url: str
    lines: list[str]

    async def exit_code(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), DEADLINE)


async def _pump(stream: asyncio.StreamReader, lines: list[str], ready: asyncio.Event) -> None:
    while line := await stream.readline():
        lines.append(line.decode())
        said = "".join(lines)
        if "is ready" in said and LISTENING.search(said):
            ready.set()
    ready.set()  # the process exited: let the waiter look at what it said


Spawn = Callable[[float], Awaitable[Process]]


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    started: list[tuple[Process, asyncio.Task[None]]] = []

    async def start(grace: float) -> Process:
        # No token: /shutdown comes from this test, on loopback, which the runner must trust.
        env = {
            **os.environ,
            "CONDUIT_RUNNER_SHUTDOWN_GRACE": str(grace),
            "CONDUIT_RUNNER_TRUST_LOOPBACK": "true",
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "runners", "echo", "--host", "127.0.0.1", "--port", "0"),
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert proc.stderr is not None
        lines: list[str] = []
        ready = asyncio.Event()
        pump = asyncio.create_task(_pump(proc.stderr, lines, ready))
        await asyncio.wait_for(ready.wait(), DEADLINE)
        ports = [m.group(1) for line in lines if (m := LISTENING.search(line))]
        assert ports, "".join(lines)
        process = Process(proc, f"http://127.0.0.1:{ports[0]}", lines)
        started.append((process, pump))
        return process

    yield start
    for process, pump in started:
        if process.proc.returncode is None:
            process.proc.kill()
            await process.proc.wait()
        await pump


async def test_sigterm_lets_in_flight_prediction_finish(
    spawn: Spawn, receiver: WebhookReceiver, http: aiohttp.ClientSession
):
    process = await spawn(10.0)
    request = {"input": {"n": 2, "delay": 0.3}, "webhook": receiver.url("k1")}
    async with http.put(
        f"{process.url}/predictions/k1", json=request, headers={"Prefer": "respond-async"}
    ) as response:
        assert response.status == 202
    await receiver.next("k1")

    process.proc.send_signal(signal.SIGTERM)
    final = (await receiver.until_terminal("k1"))[-1].body
    assert (final["status"], final["output"]) == ("succeeded", ["hello-0", "hello-1"])
    assert await process.exit_code() == 0, "".join(process.lines)


async def test_sigterm_cancels_what_outlives_the_grace_period(
    spawn: Spawn, receiver: WebhookReceiver, http: aiohttp.ClientSession
):
    process = await spawn(0.3)
    request = {"input": {"delay": 60}, "webhook": receiver.url("k2")}
    async with http.put(
        f"{process.url}/predictions/k2", json=request, headers={"Prefer": "respond-async"}
    ) as response:
        assert response.status == 202
    await receiver.next("k2")

    process.proc.send_signal(signal.SIGTERM)
    assert (await receiver.until_terminal("k2"))[-1].body["status"] == "canceled"
    assert await process.exit_code() == 0, "".join(process.lines)


async def test_shutdown_endpoint_stops_the_process(spawn: Spawn, http: aiohttp.ClientSession):
    process = await spawn(1.0)
    async with http.post(f"{process.url}/shutdown") as response:
        assert (response.status, await response.json()) == (200, {})
    assert await process.exit_code() == 0, "".join(process.lines)
