"""A runner's webhook counts by its answer's status: a receiver that answers 200 and then drips
its body (a real socket server) is sent the terminal webhook once, not again and again."""

from __future__ import annotations

import asyncio

import aiohttp

from runners.config import RunnerConfig
from runners.webhooks import open_session, post
from tests.fixtures.dripping import dripping_receiver
from tests.fixtures.waiting import until
from tests.runners.conftest import DEADLINE, StartRunner


async def test_a_200_whose_body_drips_is_one_delivery() -> None:
    async with dripping_receiver() as receiver, open_session(RunnerConfig()) as session:
        assert await post(session, f"{receiver.url}/hook", b"{}", {}) == 200

        async def hung_up() -> bool:
            return receiver.hung_up == 1

        await until(hung_up, "the sender hanging up on the body", DEADLINE)
    assert receiver.bodies == [b"{}"]


async def test_the_terminal_webhook_is_not_sent_again_to_a_dripping_receiver(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(webhook_timeout=10.0, webhook_max_retries=1)
    async with dripping_receiver() as receiver:
        request = {
            "input": {"prompt": "d"},
            "webhook": f"{receiver.url}/hook",
            "webhook_events_filter": ["completed"],
        }
        async with http.put(f"{runner.url}/predictions/d1", json=request) as response:
            assert response.status == 200
        # Closing the dispatcher waits for its deliveries, retries included.
        await asyncio.wait_for(runner.service.webhooks.close(60), 90)
    assert len(receiver.bodies) == 1
