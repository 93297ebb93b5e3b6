"""A Redis that may evict keys is refused: the api and the director do not start against it,
and say why (an evicted stream loses queued predictions without a trace)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.ports import free_port
from tests.conftest import ECHO, Stack
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.servers import RedisServer
from tests.fixtures.waiting import wait_for
from tracker.redis_connect import EvictingRedis, connect, require_noeviction

WHY = "maxmemory-policy allkeys-lru: it may evict keys"


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        with redis.Redis.from_url(server.url) as client:
            client.config_set("maxmemory-policy", "allkeys-lru")
        yield server


async def test_only_noeviction_passes(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        client = connect(server.url)
        try:
            await require_noeviction(client)  # Redis's default
            await client.config_set("maxmemory-policy", "volatile-ttl")
            with pytest.raises(EvictingRedis, match="volatile-ttl.*noeviction"):
                await require_noeviction(client)
        finally:
            await client.aclose()


def _exits_saying(proc: Proc, why: str) -> None:
    try:
        wait_for(lambda: not proc.alive, f"{proc.name} to give up", timeout=30)
    except AssertionError as error:
        raise AssertionError(f"{error}; its log:\n{proc.log()[-3000:]}") from None
    assert proc.popen is not None and proc.popen.returncode != 0
    assert why in proc.log(), proc.log()[-2000:]


def test_api_and_director_refuse_to_start(
    evicting: RedisServer, launcher: Launcher, stack: Stack
) -> None:
    env = {"REDIS_URL": evicting.url}
    api = launcher.spawn("api-evicting", "api", "--port", str(free_port()), env=env)
    director = launcher.director(ECHO, stack.runner_url, env=env)
    _exits_saying(api, WHY)
    _exits_saying(director, WHY)
