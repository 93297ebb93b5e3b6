"""The lane owns the work a ``/run`` leaves behind (the cancel sent to a runner for a run its
client abandoned), and its stop waits for that work before closing the session it runs on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from lane import runner_call
from lane.background import Background
from lane.service import Lane
from lane.settings import LaneSettings
from tests.fixtures.waiting import until
from tracker.fleet import FleetEntry, RunnerState


class SlowCanceller:
    """A runner whose cancel answers only once the test lets it."""

    def __init__(self) -> None:
        self.cancels: list[str] = []
        self.release = asyncio.Event()

    async def cancel(self, request: web.Request) -> web.Response:
        self.cancels.append(request.match_info["id"])
        await self.release.wait()
        return web.json_response({})


@pytest.fixture
async def runner() -> AsyncIterator[tuple[SlowCanceller, str]]:
    state = SlowCanceller()
    app = web.Application()
    app.router.add_post("/predictions/{id}/cancel", state.cancel)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield state, str(server.make_url("/"))
    state.release.set()
    await server.close()


def _entry(url: str) -> FleetEntry:
    return FleetEntry(
        id="r-1",
        url=url,
        deployment="o/m",
        version_id="v",
        concurrency=1,
        state=RunnerState.READY,
        hardware="cpu",
        heartbeat_at=0.0,
        director="test",
        kind="conduit-echo",
    )


async def test_stop_waits_for_the_cancels_runs_left_behind(
    runner: tuple[SlowCanceller, str], redis_url: str, engine: AsyncEngine
) -> None:
    state, url = runner
    redis = Redis.from_url(redis_url)
    lane = Lane(redis, engine, LaneSettings())
    await lane.start()
    try:
        lane.background.spawn(runner_call.cancel_quietly(lane.client(_entry(url)), "p1"))
        stopping = asyncio.create_task(lane.stop())

        async def arrived() -> bool:
            return state.cancels == ["p1"]

        await until(arrived, "the cancel at the runner")
        assert not stopping.done()  # still waiting for the runner's answer
        state.release.set()
        await stopping
        assert len(lane.background) == 0
    finally:
        await redis.aclose()


async def test_work_that_outlasts_the_drain_is_cancelled() -> None:
    background = Background()
    never = asyncio.Event()
    background.spawn(never.wait())
    await background.drain(timeout=0.01)
    assert len(background) == 0
