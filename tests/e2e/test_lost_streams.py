"""A director outlives its streams: a stream key deleted under its blocking read (Redis ends
the read with ``UNBLOCKED the stream key no longer exists``), or the whole database flushed (a
dev stack re-created on the same Redis), is logged and the streams made again; the director
keeps running, and a prediction created afterwards runs.

These drills flush their Redis, so they run on a Redis server of their own, never the
session's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher, Proc, base_env
from tests.fixtures.servers import RedisServer
from tests.fixtures.waiting import until
from tracker.keys import Target

DEADLINE = 60.0
#: Long enough that the read is certainly still blocked when its stream goes.
BLOCK_MS = "120000"


@dataclass
class LostStack:
    redis_url: str
    api_url: str
    director: Proc
    deployment: str
    token: str


@pytest.fixture(scope="module")
def lost_stack(
    database_url: str, admin: Admin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LostStack]:
    root: Path = tmp_path_factory.mktemp("lost-streams")
    with RedisServer(root / "redis") as server:
        launcher = Launcher(base_env(database_url, server.url), root)
        try:
            _, api_url = launcher.api()
            _, runner_url = launcher.runner("echo", concurrency=1)
            name = f"test/lost-{uuid.uuid4().hex[:8]}"
            admin.create_model(name, runner_url)
            admin.create_deployment(name, name, shards=2, visibility="public")
            director = launcher.director(name, runner_url, block_ms=BLOCK_MS)
            token = admin.create_account(f"lost-{uuid.uuid4().hex[:8]}")
            yield LostStack(server.url, api_url, director, name, token)
            director.kill()  # its read blocks for minutes: SIGTERM would wait that long
        finally:
            launcher.stop_all()


@pytest.fixture
async def redis(lost_stack: LostStack) -> AsyncIterator[Redis]:
    client: Redis = Redis.from_url(lost_stack.redis_url)
    yield client
    await client.aclose()


async def _blocked_readers(redis: Redis) -> int:
    """Clients blocked in XREADGROUP: on this Redis, only the director's read."""
    clients = await redis.client_list()
    return sum(1 for c in clients if c["cmd"] == "xreadgroup" and "b" in c["flags"])


async def _director_blocked(stack: LostStack, redis: Redis) -> None:
    async def blocked() -> bool:
        stack.director.check_alive()
        return await _blocked_readers(redis) == 1

    await until(blocked, "the director blocked on its streams", DEADLINE)


async def _prediction_runs(stack: LostStack) -> None:
    headers = {"Authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as http:
        created = await http.post(
            f"/v1/deployments/{stack.deployment}/predictions", json={"input": {"prompt": "after"}}
        )
        assert created.status_code == 201, created.text
        url = f"/v1/predictions/{created.json()['id']}"

        async def succeeded() -> bool:
            stack.director.check_alive()
            status = (await http.get(url)).json()["status"]
            assert status in ("starting", "processing", "succeeded"), status
            return bool(status == "succeeded")

        await until(succeeded, "the prediction created afterwards succeeded", DEADLINE)


async def _director_noticed(stack: LostStack, times: int) -> None:
    async def logged() -> bool:
        stack.director.check_alive()
        return stack.director.log().count("is gone") >= times

    await until(logged, "the director logged the lost stream", DEADLINE)


async def test_a_stream_deleted_under_a_blocked_read(lost_stack: LostStack, redis: Redis) -> None:
    await _director_blocked(lost_stack, redis)
    already = lost_stack.director.log().count("is gone")
    stream = Target.deployment(lost_stack.deployment, 2).stream(0)
    assert await redis.delete(stream) == 1

    await _director_noticed(lost_stack, already + 1)
    await _prediction_runs(lost_stack)
    assert "Traceback" not in lost_stack.director.log()


async def test_a_flushed_database_under_a_blocked_read(lost_stack: LostStack, redis: Redis) -> None:
    await _director_blocked(lost_stack, redis)
    already = lost_stack.director.log().count("is gone")
    await redis.flushdb()

    await _director_noticed(lost_stack, already + 1)
    await _prediction_runs(lost_stack)
    assert "Traceback" not in lost_stack.director.log()
